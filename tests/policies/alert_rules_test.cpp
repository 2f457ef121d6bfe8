// policies/alerts: the alert rules pass `promtool check rules` and their
// unit tests (`promtool test rules`), every alert has a firing and a quiet
// case there, every recording rule feeds an alert, every metric they name is
// one moe-daemon or moe-operator exports (or a recording rule of the file),
// and a rule changed against its tests makes promtool fail.
// promtool is the real one (Debian's prometheus package, installed by
// scripts/setup): a machine without it fails this test rather than skipping.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "operator_test_util.hpp"
#include "yaml_json.hpp"

namespace moeserve::op::testing {
namespace {

const std::filesystem::path kAlerts = std::filesystem::path("policies") / "alerts";

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult Promtool(const std::filesystem::path& dir, const std::string& args) {
  return RunShell("cd '" + dir.string() + "' && promtool " + args);
}

json Rules() {
  auto docs = fakes::LoadYamlFile((std::filesystem::path(SourceDir()) / kAlerts / "moeserve-alerts.yaml").string());
  EXPECT_TRUE(docs) << docs.error().ToString();
  return docs && !docs->empty() ? (*docs)[0] : json::object();
}

class AlertRules : public ::testing::Test {
 protected:
  void SetUp() override {
    auto version = RunShell("promtool --version");
    ASSERT_EQ(version.rc, 0) << "promtool is missing (scripts/setup installs Debian's prometheus package): "
                             << version.output;
  }
};

TEST_F(AlertRules, PromtoolChecksAndUnitTestsPass) {
  const auto dir = std::filesystem::path(SourceDir()) / kAlerts;
  const json all = Rules();
  size_t rules = 0;
  for (const auto& g : all["groups"]) rules += g["rules"].size();
  ASSERT_GE(rules, 6u);
  auto check = Promtool(dir, "check rules moeserve-alerts.yaml");
  EXPECT_EQ(check.rc, 0) << check.output;
  EXPECT_NE(check.output.find("SUCCESS: " + std::to_string(rules) + " rules found"), std::string::npos) << check.output;
  auto test = Promtool(dir, "test rules moeserve-alerts_test.yaml");
  EXPECT_EQ(test.rc, 0) << test.output;
  EXPECT_NE(test.output.find("SUCCESS"), std::string::npos) << test.output;
}

TEST_F(AlertRules, EveryRuleFiresAndStaysQuietInItsTests) {
  auto tests = fakes::LoadYamlFile((std::filesystem::path(SourceDir()) / kAlerts / "moeserve-alerts_test.yaml").string());
  ASSERT_TRUE(tests) << tests.error().ToString();
  std::set<std::string> fires, quiet;
  std::string alert_exprs;
  for (const auto& t : (*tests)[0]["tests"])
    for (const auto& a : t.value("alert_rule_test", json::array()))
      (a.value("exp_alerts", json::array()).empty() ? quiet : fires).insert(a.value("alertname", ""));
  const json all = Rules();
  int checked = 0;
  std::vector<std::string> records;
  for (const auto& g : all["groups"])
    for (const auto& r : g["rules"]) {
      if (r.contains("record")) {
        records.push_back(r.value("record", ""));
        continue;
      }
      alert_exprs += r.value("expr", "") + "\n";
      const std::string name = r.value("alert", "");
      checked++;
      EXPECT_TRUE(fires.count(name)) << name << " has no unit test where it fires";
      EXPECT_TRUE(quiet.count(name)) << name << " has no unit test where it stays quiet";
    }
  EXPECT_GE(checked, 8);
  // A recording rule is there for an alert: each is read by one, directly or
  // through another recording rule.
  ASSERT_GE(records.size(), 4u);
  for (const auto& g : all["groups"])
    for (const auto& r : g["rules"])
      if (r.contains("record")) alert_exprs += r.value("expr", "") + "\n";
  for (const auto& name : records)
    EXPECT_NE(alert_exprs.find(name), std::string::npos) << "recording rule " << name << " is read by no rule";
}

TEST_F(AlertRules, MetricsAreOnesMoeserveExports) {
  // Each family is registered with prometheus-cpp's .Name("...").
  std::set<std::string> exported;
  static const std::regex kName(R"re(\.Name\("(moe_[a-z0-9_]+)"\))re");
  for (const char* file : {"daemon/metrics.cpp", "operator/operator.cpp"}) {
    const std::string source = Slurp(std::filesystem::path(SourceDir()) / file);
    for (std::sregex_iterator it(source.begin(), source.end(), kName), end; it != end; ++it) exported.insert((*it)[1]);
  }
  ASSERT_TRUE(exported.count("moe_requests_total")) << "daemon/metrics.cpp no longer reads as expected";
  ASSERT_TRUE(exported.count("moe_operator_leader")) << "operator/operator.cpp no longer reads as expected";
  auto known = [&](std::string m) {
    if (exported.count(m)) return true;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (m.size() > std::strlen(suffix) && m.ends_with(suffix) && exported.count(m.substr(0, m.size() - std::strlen(suffix))))
        return true;
    return false;
  };
  // Names outside recording-rule names (level:metric:operations), which
  // must be recorded by the file itself.
  static const std::regex kMetric(R"((^|[^a-zA-Z0-9_:])(moe_[a-z0-9_]+)(?![a-zA-Z0-9_:]))");
  static const std::regex kRecorded(R"([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*)");
  int named = 0, recorded = 0;
  const json all = Rules();
  std::set<std::string> records;
  for (const auto& g : all["groups"])
    for (const auto& r : g["rules"])
      if (r.contains("record")) records.insert(r.value("record", ""));
  for (const auto& g : all["groups"])
    for (const auto& r : g["rules"]) {
      const std::string expr = r.value("expr", "");
      const std::string rule = r.value("alert", r.value("record", ""));
      for (std::sregex_iterator it(expr.begin(), expr.end(), kMetric), end; it != end; ++it, ++named)
        EXPECT_TRUE(known((*it)[2].str())) << rule << " names " << (*it)[2].str()
                                           << ", which neither moe-daemon nor moe-operator exports";
      for (std::sregex_iterator it(expr.begin(), expr.end(), kRecorded), end; it != end; ++it, ++recorded)
        EXPECT_TRUE(records.count(it->str())) << rule << " reads " << it->str() << ", which no rule records";
    }
  EXPECT_GE(named, 8);
  EXPECT_GE(recorded, 8);
}

TEST_F(AlertRules, ARuleChangedAgainstItsTestsFails) {
  // The same rules with the error-rate threshold raised past what the test
  // series reach: the unit tests must notice.
  const auto dir = std::filesystem::temp_directory_path() / ("moe-alerts-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string rules = Slurp(std::filesystem::path(SourceDir()) / kAlerts / "moeserve-alerts.yaml");
  const auto at = rules.find("> 0.05");
  ASSERT_NE(at, std::string::npos);
  rules.replace(at, 6, "> 0.50");
  std::ofstream(dir / "moeserve-alerts.yaml") << rules;
  std::filesystem::copy_file(std::filesystem::path(SourceDir()) / kAlerts / "moeserve-alerts_test.yaml",
                             dir / "moeserve-alerts_test.yaml");
  auto test = Promtool(dir, "test rules moeserve-alerts_test.yaml");
  std::filesystem::remove_all(dir);
  EXPECT_NE(test.rc, 0) << test.output;
  EXPECT_NE(test.output.find("MoeServeHighErrorRate"), std::string::npos) << test.output;
}

TEST_F(AlertRules, ABudgetCountedOncePerReplicaFailsItsTests) {
  // Every pod reports the tenant's one budget: adding them up instead of
  // taking one halves the burn rate of a tenant served by two pods, and the
  // unit tests must notice.
  const auto dir = std::filesystem::temp_directory_path() / ("moe-budget-alerts-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string rules = Slurp(std::filesystem::path(SourceDir()) / kAlerts / "moeserve-alerts.yaml");
  const std::string one = "max by (tenant, period) (moe_budget_limit_usd)";
  const auto at = rules.find(one);
  ASSERT_NE(at, std::string::npos);
  rules.replace(at, 3, "sum");
  std::ofstream(dir / "moeserve-alerts.yaml") << rules;
  std::filesystem::copy_file(std::filesystem::path(SourceDir()) / kAlerts / "moeserve-alerts_test.yaml",
                             dir / "moeserve-alerts_test.yaml");
  auto test = Promtool(dir, "test rules moeserve-alerts_test.yaml");
  std::filesystem::remove_all(dir);
  EXPECT_NE(test.rc, 0) << test.output;
  EXPECT_NE(test.output.find("MoeServeBudgetFastBurn"), std::string::npos) << test.output;
}

}  // namespace
}  // namespace moeserve::op::testing
