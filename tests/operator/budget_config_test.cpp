// operator.budget_config: a MoEDeployment governed by a QuotaPolicy gets the
// policy's prices and budgets in its daemons' config.yaml, with
// spend_from_operator and the global spend file, and its pods mount
// ConfigMap <policy>-budget (optional, read-only, only spend.json) where the
// daemon reads it; an ungoverned one gets none of it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moeserve/operator/moedeployment.hpp"

namespace moeserve::op {
namespace {

using json = nlohmann::json;

const json kMeta = {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "MoEDeployment"},
                    {"metadata", {{"name", "ultra"}, {"namespace", "team-a"}, {"uid", "u-1"}}}};

MoEDeploymentSpec Spec() {
  auto spec = ParseMoEDeploymentSpec({{"image", "moeserve/moe-daemon:0.1.0"},
                                      {"model", {{"uri", "s3://models/tiny/"}, {"revision", "r1"}}}});
  EXPECT_TRUE(spec) << spec.error().ToString();
  return *spec;
}

const json* Container(const json& sts) {
  for (const auto& c : sts["spec"]["template"]["spec"]["containers"])
    if (c["name"] == "moe-daemon") return &c;
  return nullptr;
}

TEST(BudgetConfig, AGovernedDeploymentsDaemonsGetThePolicysBudgetsAndItsSpend) {
  MoEDeploymentSpec spec = Spec();
  spec.budgeting.policy = "shared";
  spec.budgeting.pricing = {{"low", {{"input", 0.2}, {"output", 0.8}}}};
  spec.budgeting.budgets = json::array({{{"tenant", "*"}, {"period", "month"}, {"limitUSD", 10}, {"action", "block"}}});
  const json config = json::parse(desired::ConfigMap(kMeta, spec)["data"]["config.yaml"].get<std::string>());
  EXPECT_EQ(config["policy_name"], "shared");
  EXPECT_EQ(config["deployment_name"], "ultra");
  EXPECT_EQ(config["spend_from_operator"], true);
  EXPECT_EQ(config["global_spend_file"], std::string(kBudgetDir) + "/spend.json");
  EXPECT_EQ(config["pricing"], spec.budgeting.pricing);
  EXPECT_EQ(config["budgets"], spec.budgeting.budgets);
  EXPECT_FALSE(config.contains("hooks"));  // the operator fires them

  const json sts = desired::StatefulSet(kMeta, spec, 0, "hash");
  const json* c = Container(sts);
  ASSERT_NE(c, nullptr);
  bool mounted = false;
  for (const auto& m : (*c)["volumeMounts"])
    if (m["name"] == "budget") mounted = m["mountPath"] == kBudgetDir && m["readOnly"] == true;
  EXPECT_TRUE(mounted) << (*c)["volumeMounts"].dump();
  bool volume = false;
  for (const auto& v : sts["spec"]["template"]["spec"]["volumes"])
    if (v["name"] == "budget") {
      volume = true;
      EXPECT_EQ(v["configMap"]["name"], "shared-budget");
      EXPECT_EQ(v["configMap"]["optional"], true);  // there before the first sync or not
      EXPECT_EQ(v["configMap"]["items"], json::array({{{"key", "spend.json"}, {"path", "spend.json"}}}));
    }
  EXPECT_TRUE(volume);
}

TEST(BudgetConfig, AnUngovernedDeploymentKeepsNoBudgets) {
  const MoEDeploymentSpec spec = Spec();
  const json config = json::parse(desired::ConfigMap(kMeta, spec)["data"]["config.yaml"].get<std::string>());
  for (const char* key : {"policy_name", "spend_from_operator", "global_spend_file", "pricing", "budgets"})
    EXPECT_FALSE(config.contains(key)) << key;
  const json sts = desired::StatefulSet(kMeta, spec, 0, "hash");
  for (const auto& v : sts["spec"]["template"]["spec"]["volumes"]) EXPECT_NE(v["name"], "budget");
}

}  // namespace
}  // namespace moeserve::op
