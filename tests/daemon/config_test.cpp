// daemon.config: the YAML file, the flags over it, and the API keys file.
#include <gtest/gtest.h>

#include <fstream>

#include "../../daemon/model/model_loading.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon {
namespace {

TEST(DaemonConfig, YamlThenFlags) {
  std::string path = ::testing::TempDir() + "/moe_cfg_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << "model: /m\nport: 9000\nprefix_cache: false\nthinking_budgets: {low: 1, medium: 2, high: 3}\n"
                         "default_reasoning_effort: high\n";
  std::vector<std::string> args = {"serve", "--config", path, "--port", "9100", "--max-running=8"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto c = ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->model, "/m");
  EXPECT_EQ(c->port, 9100);
  EXPECT_EQ(c->max_running, 8);
  EXPECT_FALSE(c->prefix_cache);
  EXPECT_EQ(c->thinking_budgets->medium, 2);
  EXPECT_EQ(c->default_reasoning_effort, ReasoningEffort::kHigh);
}

TEST(DaemonConfig, ClearMessages) {
  auto bad = [](const std::string& yaml) {
    auto c = ParseDaemonConfigYaml(yaml, "daemon.yaml");
    EXPECT_FALSE(c.has_value()) << yaml;
    return c ? std::string() : c.error().message();
  };
  EXPECT_EQ(bad("port: abc"), "daemon.yaml: port: must be an integer, not text");
  EXPECT_EQ(bad("port: ~"), "daemon.yaml: port: must be an integer, not null (omit the key to keep its default)");
  EXPECT_EQ(bad("api_keys_file: \"\""), "daemon.yaml: api_keys_file: must be text, not empty text");
  EXPECT_EQ(bad("port: 70000"), "daemon.yaml: port: must be between 0 and 65535 (got '70000')");
  EXPECT_NE(bad("prot: 80").find("unknown setting 'prot'"), std::string::npos);
  EXPECT_NE(bad("kernels: gpu").find("must be fast or reference"), std::string::npos);
  EXPECT_NE(bad("experts: fp8").find("experts: must be stored, mxfp4 or bf16"), std::string::npos);
  {
    auto c = ParseDaemonConfigYaml("experts: mxfp4", "daemon.yaml");
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->experts, "mxfp4");
  }
  EXPECT_NE(bad("indexer_scores: fp8").find("indexer_scores: must be exact or int8"), std::string::npos);
  EXPECT_NE(bad("indexer_scores: INT8").find("indexer_scores: must be exact or int8"), std::string::npos);
  {
    auto c = ParseDaemonConfigYaml("indexer_scores: int8", "daemon.yaml");
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->indexer_scores, "int8");
  }
  EXPECT_NE(bad("thinking_budgets: {low: 9, medium: 2, high: 3}").find("low <= medium <= high"), std::string::npos);
  EXPECT_NE(bad("[1, 2]").find("must be a map"), std::string::npos);
  EXPECT_NE(bad("port: [").find("not valid YAML"), std::string::npos);
  std::vector<std::string> args = {"serve", "--port", "1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto c = ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message().find("no model"), std::string::npos);
}

TEST(ApiKeys, HashesOnlyAndTenants) {
  auto keys = ApiKeys::Parse("keys:\n  - key: sk-a\n    tenant: acme\n    role: admin\n  - sha256: " +
                                 Sha256Hex(std::string_view("sk-b")) + "\n",
                             "keys.yaml");
  ASSERT_TRUE(keys.has_value()) << keys.error().message();
  auto a = keys->Authenticate("Bearer sk-a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->tenant, "acme");
  EXPECT_TRUE(a->admin);
  auto b = keys->Authenticate("Bearer sk-b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->tenant, "default");
  EXPECT_FALSE(keys->Authenticate("Bearer sk-c").has_value());
  EXPECT_FALSE(keys->Authenticate("sk-a").has_value());
  EXPECT_FALSE(keys->Authenticate("").has_value());
  EXPECT_FALSE(ApiKeys::Parse("keys: []", "k").has_value());
  EXPECT_FALSE(ApiKeys::Parse("keys:\n  - sha256: xyz\n", "k").has_value());
  EXPECT_FALSE(ApiKeys::Parse("keys:\n  - key: a\n  - key: a\n", "k").has_value());
  EXPECT_TRUE(ApiKeys::Open().Authenticate("").has_value());
}

TEST(DaemonConfig, PrefixCacheBytes) {
  EXPECT_EQ(DaemonConfig{}.prefix_cache_bytes, int64_t{1} << 30);
  auto c = ParseDaemonConfigYaml("prefix_cache_bytes: 268435456\n", "daemon.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->prefix_cache_bytes, 268435456);
  std::vector<std::string> args = {"serve", "--model", "/m", "--prefix-cache-bytes", "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto f = ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(f.has_value()) << f.error().message();
  EXPECT_EQ(f->prefix_cache_bytes, 0);
  auto bad = ParseDaemonConfigYaml("prefix_cache_bytes: -1\n", "daemon.yaml");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("prefix_cache_bytes: must be between 0 and"), std::string::npos) << bad.error().message();
}

// --deterministic is a bare switch (also --deterministic=false, and the YAML
// setting); anything but a boolean is refused.
TEST(DaemonConfig, Deterministic) {
  EXPECT_FALSE(DaemonConfig{}.deterministic);
  const auto parse = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  };
  auto last = parse({"serve", "--model", "/m", "--deterministic"});
  ASSERT_TRUE(last.has_value()) << last.error().message();
  EXPECT_TRUE(last->deterministic);
  auto middle = parse({"serve", "--deterministic", "--model", "/m"});
  ASSERT_TRUE(middle.has_value()) << middle.error().message();
  EXPECT_TRUE(middle->deterministic);
  EXPECT_EQ(middle->model, "/m");
  auto off = parse({"serve", "--model", "/m", "--deterministic=false"});
  ASSERT_TRUE(off.has_value()) << off.error().message();
  EXPECT_FALSE(off->deterministic);
  auto yaml = ParseDaemonConfigYaml("deterministic: true\n", "daemon.yaml");
  ASSERT_TRUE(yaml.has_value()) << yaml.error().message();
  EXPECT_TRUE(yaml->deterministic);
  auto bad = parse({"serve", "--model", "/m", "--deterministic", "maybe"});
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("must be true or false"), std::string::npos) << bad.error().message();
}

// bf16_activations: off by default; the flag, the YAML setting, and the
// engine options the daemon loads its model with (so a CPU with AMX serves
// prefill on its tiles only when asked); anything but a boolean is refused.
TEST(DaemonConfig, Bf16ActivationsReachTheEngine) {
  EXPECT_FALSE(DaemonConfig{}.bf16_activations);
  EXPECT_FALSE(EngineOptionsFrom(DaemonConfig{}).bf16_activations);
  const auto parse = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return ParseServeArgs(static_cast<int>(argv.size()), argv.data());
  };
  auto on = parse({"serve", "--model", "/m", "--bf16-activations", "true"});
  ASSERT_TRUE(on.has_value()) << on.error().message();
  EXPECT_TRUE(on->bf16_activations);
  EXPECT_TRUE(EngineOptionsFrom(*on).bf16_activations);
  auto yaml = ParseDaemonConfigYaml("bf16_activations: true\n", "daemon.yaml");
  ASSERT_TRUE(yaml.has_value()) << yaml.error().message();
  EXPECT_TRUE(EngineOptionsFrom(*yaml).bf16_activations);
  auto bad = parse({"serve", "--model", "/m", "--bf16-activations", "fast"});
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("bf16_activations"), std::string::npos) << bad.error().message();
}

TEST(DaemonConfig, PrefillChunkWhenNothingDecodes) {
  EXPECT_EQ(DaemonConfig{}.prefill_chunk_tokens_idle, 2048);
  auto c = ParseDaemonConfigYaml("prefill_chunk_tokens: 256\nprefill_chunk_tokens_idle: 4096\n", "daemon.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->prefill_chunk_tokens, 256);
  EXPECT_EQ(c->prefill_chunk_tokens_idle, 4096);
  auto bad = ParseDaemonConfigYaml("prefill_chunk_tokens_idle: 0\n", "daemon.yaml");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("prefill_chunk_tokens_idle: must be between 1 and"), std::string::npos)
      << bad.error().message();
}

}  // namespace
}  // namespace moeserve::daemon

