// daemon.openai_client: the official `openai` npm client against a live daemon
// (tests/daemon/openai_client.mjs does the checks).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(OpenAiClient, ChatStreamToolsUsage) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  auto d = StartDaemon();
  ASSERT_TRUE(d);
  auto run = RunOpenAiClientScript("tests/daemon/openai_client.mjs", d->url() + "/v1");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
