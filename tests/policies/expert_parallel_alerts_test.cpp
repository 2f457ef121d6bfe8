// policies/alerts/moeserve-expert-parallel.yaml: the expert-parallel alert
// rules pass `promtool check rules` and their unit tests; the metrics they
// name are ones moe-daemon registers (daemon/model/expert_parallel.cpp); and a
// rule loosened against its tests (a higher imbalance threshold, a longer
// degraded `for`) makes promtool fail. promtool is the real one (Debian's
// prometheus package, installed by scripts/setup).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path AlertsDir() { return fs::path(SourceDir()) / "policies" / "alerts"; }

// Copies the rules and their tests to a scratch dir, with `from` replaced by `to` in the rules.
fs::path Mutated(const std::string& tag, const std::string& from, const std::string& to) {
  const fs::path dir = fs::temp_directory_path() / ("moe-ep-alerts-" + tag + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string rules = Slurp(AlertsDir() / "moeserve-expert-parallel.yaml");
  const size_t at = rules.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) rules.replace(at, from.size(), to);
  std::ofstream(dir / "moeserve-expert-parallel.yaml") << rules;
  fs::copy_file(AlertsDir() / "moeserve-expert-parallel_test.yaml", dir / "moeserve-expert-parallel_test.yaml",
                fs::copy_options::overwrite_existing);
  return dir;
}

CommandResult PromtoolTest(const fs::path& dir) {
  return RunShell("cd '" + dir.string() + "' && promtool test rules moeserve-expert-parallel_test.yaml");
}

class ExpertParallelAlerts : public ::testing::Test {
 protected:
  void SetUp() override {
    auto version = RunShell("promtool --version");
    ASSERT_EQ(version.rc, 0) << "promtool is missing (scripts/setup installs Debian's prometheus package)";
  }
};

TEST_F(ExpertParallelAlerts, CheckAndUnitTestsPass) {
  auto check = RunShell("cd '" + AlertsDir().string() + "' && promtool check rules moeserve-expert-parallel.yaml");
  EXPECT_EQ(check.rc, 0) << check.output;
  EXPECT_NE(check.output.find("SUCCESS: 2 rules found"), std::string::npos) << check.output;
  auto test = PromtoolTest(AlertsDir());
  EXPECT_EQ(test.rc, 0) << test.output;
}

TEST_F(ExpertParallelAlerts, MetricsNamedAreOnesTheDaemonRegisters) {
  const std::string rules = Slurp(AlertsDir() / "moeserve-expert-parallel.yaml");
  const std::string daemon = Slurp(fs::path(SourceDir()) / "daemon" / "model" / "expert_parallel.cpp");
  std::regex metric(R"(\bmoe_[a-z_]+)");
  int named = 0;
  for (auto it = std::sregex_iterator(rules.begin(), rules.end(), metric); it != std::sregex_iterator(); ++it) {
    const std::string name = it->str();
    if (name == "moe_expert_tokens_total") continue;  // named in prose; daemon/metrics.cpp exports it
    ++named;
    EXPECT_NE(daemon.find("\"" + name + "\""), std::string::npos) << name << " is not registered by the daemon";
  }
  EXPECT_GE(named, 2);
}

TEST_F(ExpertParallelAlerts, LoosenedRulesFailTheirTests) {
  auto threshold = PromtoolTest(Mutated("threshold", "> 1.5", "> 3"));
  EXPECT_NE(threshold.rc, 0) << "an imbalance threshold above the tested 2.3x ratio still passed";
  auto hold = PromtoolTest(Mutated("for", "for: 5m", "for: 30m"));
  EXPECT_NE(hold.rc, 0) << "a degraded alert that waits 30 minutes still passed";
}

}  // namespace
}  // namespace moeserve::op::testing
