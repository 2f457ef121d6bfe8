// daemon.openai_vision: the official `openai` npm client, unchanged, sends a
// PNG (written here by libpng) as an image_url part, in a user message and in
// a tool result, to a daemon serving a model with the small random vision
// tower (moe-model-gen --vision), and gets answers whose usage counts the
// image's span; tests/daemon/openai_vision.mjs does the checks.
#include <gtest/gtest.h>

#include "../support/test_images.hpp"
#include "daemon_harness.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(OpenAiVision, APngThroughTheOfficialClient) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  const std::string dir = ::testing::TempDir() + "/moe_openai_vision_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  engine::ModelGenOptions o;
  o.config = *engine::PresetConfig("tiny");
  o.config.vision = engine::TinyVisionConfig();
  o.seed = 9;
  ASSERT_TRUE(engine::GenerateModel(o, dir).has_value());
  DaemonConfig c = TestConfig();
  c.model = dir;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const std::string png = test_support::EncodePng(48, 32, test_support::Gradient(48, 32));
  const auto span = engine::ImageSpanTokens(engine::TinyVisionConfig(), 48, 32);
  ASSERT_TRUE(span.has_value());
  auto run = RunOpenAiClientScript("tests/daemon/openai_vision.mjs",
                                   d->url() + "/v1 'data:image/png;base64," + Base64Encode(png) + "' " +
                                       std::to_string(*span));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::daemon::testing
