// A model directory the engine runs but the daemon cannot serve chat for is
// refused at load with an error that names what is missing, rather than
// failing inside the chat setup: a family without a chat format in the
// daemon (DeepSeek-V3.2), and a Qwen3-Next directory without the tokenizer
// its chat format needs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

Status LoadFrom(const std::string& dir) {
  DaemonConfig c = TestConfig();
  c.model = dir;
  auto d = Daemon::Create(c);
  EXPECT_TRUE(d) << d.error().ToString();
  if (!d) return Fail(d.error());
  EXPECT_TRUE((*d)->Start());
  return (*d)->LoadModel();
}

TEST(FamilyRefusal, ADeepSeekV32DirectoryIsRefusedByName) {
  const std::string dir = ::testing::TempDir() + "/deepseek_v32_refusal";
  std::filesystem::remove_all(dir);
  const std::string write = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/deepseek_v32.py write --out " +
                            dir + " --layers 2 --seed 2";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  auto st = LoadFrom(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("no chat format for deepseek_v32"), std::string::npos) << st.error().ToString();
}

TEST(FamilyRefusal, AQwen3NextDirectoryWithoutItsTokenizerIsRefusedNamingTheFile) {
  // A vocabulary smaller than the tokenizer's gets no tokenizer files (token ids only).
  const std::string dir = ::testing::TempDir() + "/qwen3_next_refusal";
  std::filesystem::remove_all(dir);
  const std::string write = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/qwen3_next.py write --out " +
                            dir + " --vocab 512 --layers 4 --seed 2";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  ASSERT_FALSE(std::filesystem::exists(dir + "/tokenizer.json"));
  auto st = LoadFrom(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().ToString().find("tokenizer.json"), std::string::npos) << st.error().ToString();
  EXPECT_NE(st.error().ToString().find("Qwen3-Next chat"), std::string::npos) << st.error().ToString();
}

}  // namespace
}  // namespace moeserve::daemon::testing
