// daemon.config_limits: the YAML files the daemon reads (--config, the API
// keys file) are bounded in size and nesting before yaml-cpp, whose parser
// recurses, sees them; the refusal names the file and the line.
#include <gtest/gtest.h>

#include <fstream>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon {
namespace {

std::string Brackets(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(ConfigLimits, DeepConfigYamlNamesFileAndLine) {
  // 100,000 levels of flow nesting, and 300 (which yaml-cpp itself accepts).
  for (int depth : {100000, 300}) {
    auto c = ParseDaemonConfigYaml("model: /m\nthinking_budgets: " + Brackets(depth) + "\n", "/etc/moe/daemon.yaml");
    ASSERT_FALSE(c) << depth;
    EXPECT_EQ(c.error().message(), "/etc/moe/daemon.yaml: line 2 nests collections more than 64 levels deep");
  }
  // Block nesting by indentation counts too.
  std::string block = "model: /m\n";
  for (int i = 0; i <= kMaxJsonDepth; ++i) block += std::string(2 * i, ' ') + "k:\n";  // 65 levels
  auto c = ParseDaemonConfigYaml(block, "daemon.yaml");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message(), "daemon.yaml: line 66 nests collections more than 64 levels deep");
}

TEST(ConfigLimits, OversizedConfigIsRefusedBeforeParsing) {
  std::string text = "model: /m\n# " + std::string(1 << 20, 'x') + "\n";
  auto c = ParseDaemonConfigYaml(text, "daemon.yaml");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message(),
            "daemon.yaml: is " + std::to_string(text.size()) + " bytes, more than the limit of 1048576");
}

TEST(ConfigLimits, ConfigFileThroughFlagsIsBounded) {
  std::string path = ::testing::TempDir() + "/moe_cfg_limits_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << "model: /m\nport: " << Brackets(100000) << "\n";
  std::vector<std::string> args = {"serve", "--config", path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto c = ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message(), path + ": line 2 nests collections more than 64 levels deep");
  // An ordinary file still loads.
  std::ofstream(path) << "model: /m\nport: 9000\nthinking_budgets: {low: 1, medium: 2, high: 3}\n";
  auto ok = ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->port, 9000);
}

TEST(ConfigLimits, DeepApiKeysFileNamesFileAndLine) {
  auto k = ApiKeys::Parse("keys:\n  - key: abc\n    tenant: " + Brackets(100000) + "\n    role: user\n", "keys.yaml");
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().message(), "keys.yaml: line 3 nests collections more than 64 levels deep");
  std::string items = "keys:\n  ";
  for (int i = 0; i < 100000; ++i) items += "- ";
  k = ApiKeys::Parse(items + "x\n", "keys.yaml");
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().message(), "keys.yaml: line 2 nests collections more than 64 levels deep");
}

}  // namespace
}  // namespace moeserve::daemon
