// daemon.session_openai_client: the official `openai` npm client, unchanged,
// drives a server-kept session (tests/daemon/session_openai_client.mjs does
// the checks), on a moe-dsa-v1 model and on a tiny random gpt-oss one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon_harness.hpp"
#include "gpt_oss_checkpoint.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(SessionOpenAiClient, TurnsThroughTheOfficialClient) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  auto d = StartDaemon();
  ASSERT_TRUE(d);
  auto run = RunOpenAiClientScript("tests/daemon/session_openai_client.mjs", d->url());
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
}

TEST(SessionOpenAiClient, GptOssTurnsThroughTheOfficialClient) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  DaemonConfig c = TinyGptOssConfig(TinyGptOssDir(), "tiny");
  c.max_context = 1024;  // several turns of a session
  c.cache_tokens = 1 << 14;
  c.default_max_tokens = 16;
  c.constrained_max_string_bytes = 24;  // random weights fill every string to the bound
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  auto run = RunOpenAiClientScript("tests/daemon/session_openai_client.mjs", d->url() + " gpt-oss");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
  std::filesystem::remove_all(TinyGptOssDir());
}

}  // namespace
}  // namespace moeserve::daemon::testing
