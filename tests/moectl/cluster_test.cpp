// moectl.cluster: moectl usage, budgets and alerts read from QuotaPolicies
// on the Kubernetes API double (our CRDs registered), whose status the test
// writes in the documented shape; the kubeconfig found by --kubeconfig and by
// $KUBECONFIG; the context's namespace, --namespace and -A; table, json and
// yaml (strings that would read back as another type quoted); a malformed
// status entry is an error naming the policy.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <sstream>

#include "fake_apiserver.hpp"
#include "moectl_support.hpp"
#include "moeserve/moectl/cluster_source.hpp"
#include "moeserve/moectl/output.hpp"

namespace moeserve::moectl::testing {
namespace {

using nlohmann::json;

std::string SourceDir() {
  const char* d = std::getenv("MOESERVE_SOURCE_DIR");
  return d ? d : ".";
}

json Policy(const std::string& ns, const std::string& name, json budgets) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "QuotaPolicy"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec", {{"limits", {{"maxGPUs", 64}}}, {"budgets", std::move(budgets)}}}};
}

json Tokens(int64_t in, int64_t cached, int64_t out, int64_t reasoning) {
  return {{"input", in}, {"cachedInput", cached}, {"output", out}, {"reasoning", reasoning}};
}

// Whitespace-separated cells of the table line that starts with `first` cells.
std::vector<std::string> Row(const std::string& table, const std::vector<std::string>& starts_with) {
  std::istringstream lines(table);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream cells(line);
    std::vector<std::string> c;
    std::string cell;
    while (cells >> cell) c.push_back(cell);
    if (c.size() >= starts_with.size() && std::equal(starts_with.begin(), starts_with.end(), c.begin())) return c;
  }
  return {};
}

class Cluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new fakes::FakeApiServer();
    for (const char* f : {"/crds/moeserve.io_moedeployments.yaml", "/crds/moeserve.io_quotapolicies.yaml"}) {
      auto s = server_->RegisterCrdFile(SourceDir() + f);
      ASSERT_TRUE(s) << s.error().ToString();
    }
    ASSERT_GT(server_->Start(0), 0);
    for (const char* ns : {"team-a", "team-b"}) {
      ASSERT_TRUE(server_->Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}));
    }
    auto a = server_->Create(
        "quotapolicies.moeserve.io",
        Policy("team-a", "team-a",
               {{{"tenant", "*"}, {"period", "month"}, {"limitUSD", 100}},
                {{"tenant", "batch"}, {"period", "day"}, {"limitUSD", 10}, {"action", "downgrade"}, {"thresholds", {0.5, 1.0}}}}));
    ASSERT_TRUE(a) << a.error().ToString();
    auto b = server_->Create("quotapolicies.moeserve.io",
                             Policy("team-b", "shared", {{{"tenant", "*"}, {"period", "day"}, {"limitUSD", 20}, {"action", "block"}}}));
    ASSERT_TRUE(b) << b.error().ToString();
    // The status as moe-operator writes it (docs/crds.md).
    auto sa = server_->Mutate("quotapolicies.moeserve.io", "team-a", "team-a", [](json& o) {
      o["status"]["usage"] = json::array({
          {{"tenant", "acme"}, {"period", "month"}, {"periodStart", "2026-12-01T00:00:00Z"}, {"spentUSD", 42.5},
           {"tokens", Tokens(1000, 200, 300, 40)}},
          {{"tenant", "batch"}, {"period", "day"}, {"periodStart", "2026-12-03T00:00:00Z"}, {"spentUSD", 3.0},
           {"tokens", Tokens(1, 2, 3, 4)}},
          {{"tenant", "batch"}, {"period", "day"}, {"periodStart", "2026-12-04T00:00:00Z"}, {"spentUSD", 7.25},
           {"tokens", Tokens(5000, 0, 700, 0)}},
          {{"tenant", "batch"}, {"period", "month"}, {"periodStart", "2026-12-01T00:00:00Z"}, {"spentUSD", 10.25},
           {"tokens", Tokens(5001, 2, 703, 4)}},
      });
      o["status"]["alerts"] = json::array({
          {{"tenant", "batch"}, {"period", "day"}, {"periodStart", "2026-12-04T00:00:00Z"}, {"threshold", 0.5},
           {"firedAt", "2026-12-04T09:15:00Z"}, {"deliveryId", "dlv_0a1b"}, {"delivered", true}},
      });
    }, true);
    ASSERT_TRUE(sa) << sa.error().ToString();
    auto sb = server_->Mutate("quotapolicies.moeserve.io", "team-b", "shared", [](json& o) {
      o["status"]["usage"] = json::array({{{"tenant", "zeta"}, {"period", "day"}, {"periodStart", "2026-12-04T00:00:00Z"},
                                           {"spentUSD", 19.5}, {"tokens", Tokens(9, 0, 9, 0)}}});
      o["status"]["alerts"] = json::array({
          {{"tenant", "zeta"}, {"period", "day"}, {"periodStart", "2026-12-04T00:00:00Z"}, {"threshold", 0.8},
           {"firedAt", "2026-12-04T11:00:00Z"}, {"deliveryId", "dlv_ffee"}, {"delivered", false}},
      });
    }, true);
    ASSERT_TRUE(sb) << sb.error().ToString();
    kubeconfig_ = TempPath("kubeconfig");
    ASSERT_TRUE(server_->WriteKubeconfig(kubeconfig_, "team-a"));
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  inline static fakes::FakeApiServer* server_ = nullptr;
  inline static std::string kubeconfig_;
};

TEST_F(Cluster, UsageAsJsonInTheContextsNamespace) {
  auto r = Moectl({"usage", "--kubeconfig", kubeconfig_, "-o", "json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["kind"], "UsageList");
  ASSERT_EQ(j["items"].size(), 4u) << r.out;  // team-a only
  const json& acme = j["items"][0];
  EXPECT_EQ(acme["namespace"], "team-a");
  EXPECT_EQ(acme["policy"], "team-a");
  EXPECT_EQ(acme["tenant"], "acme");
  EXPECT_EQ(acme["period"], "month");
  EXPECT_EQ(acme["periodStart"], "2026-12-01T00:00:00Z");
  EXPECT_DOUBLE_EQ(acme["spentUSD"].get<double>(), 42.5);
  EXPECT_EQ(acme["tokens"]["input"], 1000);
  EXPECT_EQ(acme["tokens"]["cachedInput"], 200);
  EXPECT_EQ(acme["tokens"]["output"], 300);
  EXPECT_EQ(acme["tokens"]["reasoning"], 40);
  EXPECT_FALSE(acme.contains("tier"));  // the policy's status sums the tiers
}

TEST_F(Cluster, UsageTableAcrossNamespacesThroughKUBECONFIG) {
  auto r = Moectl({"usage", "-A"}, {{"KUBECONFIG", kubeconfig_}});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto header = Row(r.out, {"NAMESPACE"});
  ASSERT_FALSE(header.empty()) << r.out;
  EXPECT_EQ(header, (std::vector<std::string>{"NAMESPACE", "POLICY", "TENANT", "TIER", "PERIOD", "PERIOD-START",
                                              "REQUESTS", "INPUT", "CACHED-INPUT", "OUTPUT", "REASONING", "SPENT-USD"}));
  EXPECT_EQ(Row(r.out, {"team-b", "shared", "zeta"}),
            (std::vector<std::string>{"team-b", "shared", "zeta", "all", "day", "2026-12-04T00:00:00Z", "-", "9", "0",
                                      "9", "0", "19.500000"}));
  EXPECT_FALSE(Row(r.out, {"team-a", "team-a", "acme"}).empty()) << r.out;
}

TEST_F(Cluster, NamespaceFlagPicksTheOtherNamespace) {
  auto r = Moectl({"usage", "--kubeconfig", kubeconfig_, "--namespace", "team-b", "-o", "yaml"});
  ASSERT_EQ(r.rc, 0) << r.err;
  YAML::Node y = YAML::Load(r.out);
  ASSERT_EQ(y["items"].size(), 1u) << r.out;
  EXPECT_EQ(y["items"][0]["tenant"].as<std::string>(), "zeta");
  EXPECT_DOUBLE_EQ(y["items"][0]["spentUSD"].as<double>(), 19.5);
  EXPECT_EQ(y["items"][0]["periodStart"].as<std::string>(), "2026-12-04T00:00:00Z");
  // Quoted, as kubectl writes times: a YAML 1.1 reader would take it for a timestamp.
  EXPECT_NE(r.out.find("periodStart: \"2026-12-04T00:00:00Z\""), std::string::npos) << r.out;
}

TEST(Yaml, StringsThatReadAsOtherTypesAreQuotedNumbersAreNot) {
  const json v = {{"tenant", "true"}, {"other", "007"}, {"empty", ""}, {"plain", "acme"}, {"spentUSD", 0.1},
                  {"delivered", false}};
  YAML::Node y = YAML::Load(ToYaml(v));
  for (const char* key : {"tenant", "other", "empty"}) EXPECT_EQ(y[key].Tag(), "!") << key << " is not quoted";
  EXPECT_EQ(y["tenant"].as<std::string>(), "true");
  EXPECT_EQ(y["other"].as<std::string>(), "007");
  EXPECT_EQ(y["plain"].Tag(), "?");
  EXPECT_EQ(y["spentUSD"].Tag(), "?");
  EXPECT_DOUBLE_EQ(y["spentUSD"].as<double>(), 0.1);
  EXPECT_FALSE(y["delivered"].as<bool>());
}

TEST_F(Cluster, BudgetsPerTenantWithSpendAndRemaining) {
  auto r = Moectl({"budgets", "--kubeconfig", kubeconfig_, "-o", "json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json items = json::parse(r.out)["items"];
  // acme follows "*" (month); batch has entries of its own, so only those.
  ASSERT_EQ(items.size(), 2u) << r.out;
  const json& acme = items[0];
  EXPECT_EQ(acme["tenant"], "acme");
  EXPECT_EQ(acme["budgetTenant"], "*");
  EXPECT_EQ(acme["period"], "month");
  EXPECT_DOUBLE_EQ(acme["limitUSD"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(acme["spentUSD"].get<double>(), 42.5);
  EXPECT_DOUBLE_EQ(acme["remainingUSD"].get<double>(), 57.5);
  EXPECT_EQ(acme["action"], "alert");
  EXPECT_EQ(acme["thresholds"], json({0.5, 0.8, 1.0}));
  const json& batch = items[1];
  EXPECT_EQ(batch["tenant"], "batch");
  EXPECT_EQ(batch["period"], "day");
  EXPECT_EQ(batch["periodStart"], "2026-12-04T00:00:00Z");  // the newest day, not the 3rd
  EXPECT_DOUBLE_EQ(batch["spentUSD"].get<double>(), 7.25);
  EXPECT_DOUBLE_EQ(batch["remainingUSD"].get<double>(), 2.75);
  EXPECT_EQ(batch["action"], "downgrade");
  EXPECT_EQ(batch["thresholds"], json({0.5, 1.0}));

  auto t = Moectl({"budgets", "--kubeconfig", kubeconfig_});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(Row(t.out, {"team-a", "batch"}),
            (std::vector<std::string>{"team-a", "batch", "day", "10.000000", "7.250000", "2.750000", "72.5%",
                                      "downgrade", "50%,100%"}))
      << t.out;
}

TEST_F(Cluster, AlertsAsTableAndYaml) {
  auto t = Moectl({"alerts", "-A", "--kubeconfig", kubeconfig_});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(Row(t.out, {"team-a"}), (std::vector<std::string>{"team-a", "team-a", "batch", "day", "2026-12-04T00:00:00Z",
                                                              "50%", "2026-12-04T09:15:00Z", "true", "dlv_0a1b"}))
      << t.out;
  EXPECT_EQ(Row(t.out, {"team-b"}), (std::vector<std::string>{"team-b", "shared", "zeta", "day", "2026-12-04T00:00:00Z",
                                                              "80%", "2026-12-04T11:00:00Z", "false", "dlv_ffee"}))
      << t.out;
  auto y = Moectl({"alerts", "-A", "--kubeconfig", kubeconfig_, "-o", "yaml"});
  ASSERT_EQ(y.rc, 0) << y.err;
  YAML::Node doc = YAML::Load(y.out);
  ASSERT_EQ(doc["items"].size(), 2u);
  EXPECT_EQ(doc["items"][1]["deliveryId"].as<std::string>(), "dlv_ffee");
  EXPECT_FALSE(doc["items"][1]["delivered"].as<bool>());
  EXPECT_DOUBLE_EQ(doc["items"][1]["threshold"].as<double>(), 0.8);
  EXPECT_EQ(doc["items"][1]["firedAt"].as<std::string>(), "2026-12-04T11:00:00Z");
}

TEST_F(Cluster, AMalformedStatusEntryNamesThePolicy) {
  json p = Policy("team-c", "broken", json::array());
  p["status"]["usage"] = json::array({{{"tenant", "x"}, {"period", "day"}, {"spentUSD", "lots"}}});
  auto rows = UsageFromPolicies({p});
  ASSERT_FALSE(rows);
  EXPECT_NE(rows.error().message().find("QuotaPolicy team-c/broken"), std::string::npos) << rows.error().message();
  EXPECT_NE(rows.error().message().find("spentUSD"), std::string::npos) << rows.error().message();
  p["status"] = {{"alerts", "not a list"}};
  EXPECT_FALSE(AlertsFromPolicies({p}));
}

}  // namespace
}  // namespace moeserve::moectl::testing
