// budget.quota_policy_budget: a QuotaPolicy's spec in JSON, as the API
// server hands it to moe-operator and moectl, reads to the same policy as
// the same sections in a daemon's YAML config, and is refused with the same
// messages, prefixed with where it came from.
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include "moeserve/budget/quota_policy_budget.hpp"

namespace moeserve {
namespace {

using nlohmann::json;

const json kSpec = {
    {"limits", {{"maxGPUs", 8}}},
    {"pricing", {{"low", {{"input", 0.2}, {"output", 0.8}}}}},
    {"budgets",
     {{{"tenant", "*"}, {"period", "month"}, {"limitUSD", 5000}},
      {{"tenant", "batch"}, {"period", "day"}, {"limitUSD", 100}, {"action", "downgrade"}, {"thresholds", {1.0, 0.9}}}}},
    {"hooks", {{{"name", "sre"}, {"url", "https://alerts.example/moe"}, {"secret", {{"secretRef", {{"name", "hook"}}}}}}}}};

TEST(QuotaPolicyBudget, ReadsTheSpecAsTheDaemonConfigParserReadsTheSameSections) {
  auto parsed = ParseQuotaPolicyBudget(kSpec, "QuotaPolicy ns/p spec");
  ASSERT_TRUE(parsed) << parsed.error().ToString();
  BudgetPolicy yaml;
  const YAML::Node root = YAML::Load(R"(
pricing: {low: {input: 0.2, output: 0.8}}
budgets:
  - {tenant: "*", period: month, limitUSD: 5000}
  - {tenant: batch, period: day, limitUSD: 100, action: downgrade, thresholds: [1.0, 0.9]}
hooks:
  - {name: sre, url: "https://alerts.example/moe", secret: {secretRef: {name: hook}}}
)");
  for (const char* section : {"pricing", "budgets", "hooks"})
    ASSERT_TRUE(ParseBudgetSection(yaml, section, root[section], "config"));
  ASSERT_EQ(parsed->budgets.size(), 2u);
  ASSERT_EQ(yaml.budgets.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(parsed->budgets[i].tenant, yaml.budgets[i].tenant);
    EXPECT_EQ(parsed->budgets[i].period, yaml.budgets[i].period);
    EXPECT_EQ(parsed->budgets[i].limit_usd, yaml.budgets[i].limit_usd);
    EXPECT_EQ(parsed->budgets[i].thresholds, yaml.budgets[i].thresholds);
    EXPECT_EQ(parsed->budgets[i].action, yaml.budgets[i].action);
  }
  EXPECT_EQ(parsed->budgets[1].thresholds, (std::vector<double>{0.9, 1.0}));  // sorted
  EXPECT_EQ(parsed->budgets[1].action, BudgetAction::kDowngrade);
  EXPECT_EQ(parsed->Cost("low", TokenCounts{1'000'000, 0, 1'000'000, 0}), 1.0);
  ASSERT_EQ(parsed->hooks.size(), 1u);
  EXPECT_EQ(parsed->hooks[0].secret_name, "hook");
  EXPECT_EQ(parsed->policy_name, BudgetPolicy{}.policy_name);
}

TEST(QuotaPolicyBudget, AbsentOrNullSectionsLeaveThePolicyEmpty) {
  for (const json& spec : {json::object(), json{{"budgets", nullptr}}, json{{"limits", {{"maxGPUs", 1}}}}, json()}) {
    auto parsed = ParseQuotaPolicyBudget(spec, "QuotaPolicy ns/p spec");
    ASSERT_TRUE(parsed) << spec.dump();
    EXPECT_TRUE(parsed->budgets.empty());
    EXPECT_TRUE(parsed->hooks.empty());
    EXPECT_TRUE(parsed->pricing.empty());
  }
}

TEST(QuotaPolicyBudget, RefusalsNameThePolicyAndTheField) {
  struct Case {
    json spec;
    std::string says;
  };
  const Case cases[] = {
      {{{"budgets", {{{"tenant", "a"}, {"period", "week"}, {"limitUSD", 1}}}}}, "budgets[0].period"},
      {{{"budgets", {{{"tenant", "a"}, {"period", "day"}, {"limitUSD", 1}, {"thresholds", {1.5}}}}}}, "budgets[0].thresholds"},
      {{{"budgets", {{{"tenant", "a"}, {"period", "day"}, {"limitUSD", -1}}}}}, "budgets[0].limitUSD"},
      {{{"budgets", {{{"tenant", "a"}, {"period", "day"}, {"limitUSD", 1}, {"colour", "red"}}}}}, "unknown field 'colour'"},
      {{{"budgets", {{"tenant", "a"}}}}, "budgets"},
      {{{"pricing", {{"ultra", {{"input", 1}}}}}}, "pricing.ultra"},
      {{{"hooks", {{{"name", "h"}, {"url", "http://x"}, {"secret", {{"vault", {{"path", "p"}}}}}}}}}, "hooks[0].url"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseQuotaPolicyBudget(c.spec, "QuotaPolicy ns/p spec");
    ASSERT_FALSE(parsed) << c.spec.dump();
    EXPECT_NE(parsed.error().message().find("QuotaPolicy ns/p spec"), std::string::npos) << parsed.error().message();
    EXPECT_NE(parsed.error().message().find(c.says), std::string::npos) << parsed.error().message();
  }
}

}  // namespace
}  // namespace moeserve
