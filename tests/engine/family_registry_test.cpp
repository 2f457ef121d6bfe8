// The family registry (family_registry.hpp): a directory's config.json picks
// its family; what no family claims goes to moe-dsa-v1, whose loader says
// what is wrong; unreadable configs are clear errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

std::string ConfigDir(const std::string& tag, const std::string& config_json) {
  const std::string dir = testing_util::TempPath("registry_" + tag);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config_json;
  return dir;
}

std::string FamilyName(const std::string& dir) {
  auto f = FindFamily(dir);
  return f ? std::string((*f)->name) : "error: " + f.error().ToString();
}

TEST(FamilyRegistry, ConfigPicksTheFamily) {
  EXPECT_EQ(FamilyName(testing_util::TinyModel()), "moe-dsa-v1");
  EXPECT_EQ(FamilyName(ConfigDir("gptoss", R"({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]})")),
            "gpt-oss");
  // Unclaimed: moe-dsa-v1's loader then names the field.
  const std::string other = ConfigDir("other", R"({"model_type": "llama"})");
  EXPECT_EQ(FamilyName(other), "moe-dsa-v1");
  auto e = Engine::Open(other, {});
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().ToString().find("architecture"), std::string::npos) << e.error().ToString();
  std::filesystem::remove_all(other);
}

TEST(FamilyRegistry, UnreadableConfigsAreClearErrors) {
  EXPECT_NE(FamilyName(testing_util::TempPath("registry_missing")).find("cannot open"), std::string::npos);
  EXPECT_NE(FamilyName(ConfigDir("bad", "[1, 2")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(FamilyName(ConfigDir("array", "[1, 2]")).find("not a JSON object"), std::string::npos);
}

TEST(FamilyRegistry, NamesAreUniqueAndEveryEntryLoads) {
  std::set<std::string> names;
  for (const FamilyEntry& f : Families()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_NE(f.matches, nullptr);
    EXPECT_NE(f.load, nullptr);
  }
  EXPECT_TRUE(names.count("moe-dsa-v1"));
}

// Publishing asks the registry what a directory holds and for a conversion:
// DeepSeek-V3.2, Qwen3-Next and moe-dsa-v1 convert (their converted
// directories are named by the experts they hold), gpt-oss does not (its
// published experts are MXFP4); a directory that is not a converted one says
// so (nullopt), and each family says how a directory stores its experts.
TEST(FamilyRegistry, ConvertingFamiliesAndStoredExperts) {
  std::set<std::string> converting;
  for (const FamilyEntry& f : Families()) {
    EXPECT_EQ(f.write_converted == nullptr, f.converted_experts == nullptr) << f.name;
    EXPECT_NE(f.stored_experts, nullptr) << f.name;
    if (f.write_converted) converting.insert(f.name);
  }
  EXPECT_EQ(converting, (std::set<std::string>{"deepseek_v32", "qwen3_next", "moe-dsa-v1"}));
  auto ds = FindFamily(ConfigDir("ds32", R"({"model_type": "deepseek_v32"})"));
  ASSERT_TRUE(ds) << ds.error().ToString();
  ASSERT_NE((*ds)->converted_experts, nullptr);
  // The published config (no "moeserve_converted"): not a converted directory.
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string root = src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
  const std::string dir = testing_util::TempPath("registry_ds32_published");
  std::filesystem::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + root + "/tools/reference/families/deepseek_v32.py write --out " + dir +
                          " --layers 2 --index-topk 8 > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto held = (*ds)->converted_experts(dir);
  ASSERT_TRUE(held) << held.error().ToString();
  EXPECT_FALSE(held->has_value());
  auto stored = (*ds)->stored_experts(dir);  // FP8 as published: neither format
  ASSERT_TRUE(stored) << stored.error().ToString();
  EXPECT_FALSE(stored->has_value());
  std::filesystem::remove_all(dir);

  const auto stored_of = [](const std::string& d) -> std::string {
    auto f = FindFamily(d);
    if (!f) return "error: " + f.error().ToString();
    auto s = (*f)->stored_experts(d);
    if (!s) return "error: " + s.error().ToString();
    return *s ? std::string(ExpertFormatName(**s)) : "none";
  };
  EXPECT_EQ(stored_of(ConfigDir("gptoss_stored", R"({"model_type": "gpt_oss"})")), "mxfp4");
  EXPECT_EQ(stored_of(ConfigDir("qwen_stored", R"({"model_type": "qwen3_next"})")), "bf16");
  EXPECT_EQ(stored_of(ConfigDir("qwen_converted",
                                R"({"model_type": "qwen3_next", "moeserve_converted": {"routed_experts": "mxfp4"}})")),
            "mxfp4");
  EXPECT_EQ(stored_of(root + "/models/tiny-agent/bf16"), "bf16");
  EXPECT_EQ(stored_of(root + "/models/tiny-agent/mxfp4"), "mxfp4");
  // A marker naming a format the engine does not hold.
  EXPECT_NE(stored_of(ConfigDir("qwen_bad", R"({"model_type": "qwen3_next", "moeserve_converted": {"routed_experts": "fp8"}})"))
                .find("moeserve_converted.routed_experts: 'fp8' is not"),
            std::string::npos);
}

// The engine opened through the registry serves moe-dsa-v1 as Create does.
TEST(FamilyRegistry, OpenServesMoeDsaV1) {
  EngineOptions o;
  o.cache_tokens = 1024;
  auto e = Engine::Open(testing_util::TinyModel(), o);
  ASSERT_TRUE(e) << e.error().ToString();
  EXPECT_EQ((*e)->chat().family(), "moe-dsa-v1");
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 3;
  r.sampling.temperature = 0;
  r.stop_tokens = {-1};
  ASSERT_TRUE((*e)->Submit(r));
  int tokens = 0;
  for (int i = 0; i < 20 && (*e)->HasWork(); ++i)
    for (const TokenEvent& ev : (*e)->Step()) tokens += ev.token >= 0;
  EXPECT_EQ(tokens, 3);
}

}  // namespace
}  // namespace moeserve::engine
