// daemon.responses_openai_vision: the official `openai` npm client, unchanged,
// sends a PNG as an input_image part of POST /v1/responses (in a user message
// and in a function_call_output) to a daemon serving a model with the small
// random vision tower, and continues the response with previous_response_id;
// tests/daemon/responses_openai_vision.mjs checks that the usage counts the
// image's span each time (replayed from the store on the continuation).
#include <gtest/gtest.h>

#include "../support/test_images.hpp"
#include "daemon_harness.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(ResponsesOpenAiVision, AnInputImageThroughTheOfficialClient) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  const std::string dir = ::testing::TempDir() + "/moe_responses_vision_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  engine::ModelGenOptions o;
  o.config = *engine::PresetConfig("tiny");
  o.config.vision = engine::TinyVisionConfig();
  o.seed = 11;
  ASSERT_TRUE(engine::GenerateModel(o, dir).has_value());
  DaemonConfig c = TestConfig();
  c.model = dir;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const std::string png = test_support::EncodePng(48, 32, test_support::Gradient(48, 32));
  const auto span = engine::ImageSpanTokens(engine::TinyVisionConfig(), 48, 32);
  ASSERT_TRUE(span.has_value());
  auto run = RunOpenAiClientScript("tests/daemon/responses_openai_vision.mjs",
                                   d->url() + "/v1 'data:image/png;base64," + Base64Encode(png) + "' " +
                                       std::to_string(*span));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::daemon::testing
