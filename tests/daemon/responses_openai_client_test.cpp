// daemon.responses_openai_client: the official `openai` npm client,
// unchanged, runs a tool-calling agent over /v1/responses against a daemon
// serving the tiny agent model (models/tiny-agent/mxfp4):
// tests/daemon/responses_openai_client.mjs does the checks.
#include <gtest/gtest.h>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(ResponsesOpenAiClient, AgentLoopStreamingAndBackgroundThroughTheOfficialClient) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  DaemonConfig c = TestConfig();
  c.model = SourceRoot() + "/models/tiny-agent/mxfp4";
  c.served_model_name = "tiny-agent";
  c.thinking_budgets.reset();  // the model's own (it was trained with them)
  c.default_reasoning_effort = ReasoningEffort::kMedium;
  c.default_max_tokens = 192;
  c.constrained_max_string_bytes = 256;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  auto run = RunOpenAiClientScript("tests/daemon/responses_openai_client.mjs", d->url());
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
