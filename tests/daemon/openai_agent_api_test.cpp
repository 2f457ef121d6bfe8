// daemon.openai_agent_api: the official `openai` npm client against a live
// daemon for logprobs, json_schema and strict tools
// (tests/daemon/openai_agent_api.mjs does the checks).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(OpenAiAgentApi, LogprobsJsonSchemaAndStrictTools) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  auto d = StartDaemon();
  ASSERT_TRUE(d);
  auto run = RunOpenAiClientScript("tests/daemon/openai_agent_api.mjs", d->url() + "/v1");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
