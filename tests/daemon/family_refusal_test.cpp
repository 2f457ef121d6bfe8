// A model directory whose family the engine runs but whose chat format the
// daemon does not serve (Qwen3-Next) is refused at load with an error that
// names the family, rather than failing inside the chat setup.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(FamilyRefusal, AQwen3NextDirectoryIsRefusedByName) {
  const std::string dir = ::testing::TempDir() + "/qwen3_next_refusal";
  std::filesystem::remove_all(dir);
  const std::string write = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/qwen3_next.py write --out " +
                            dir + " --vocab 512 --layers 4 --seed 2";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  DaemonConfig c = TestConfig();
  c.model = dir;
  auto d = Daemon::Create(c);
  ASSERT_TRUE(d) << d.error().ToString();
  ASSERT_TRUE((*d)->Start());
  auto st = (*d)->LoadModel();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("no chat format for qwen3_next"), std::string::npos) << st.error().ToString();
}

}  // namespace
}  // namespace moeserve::daemon::testing
