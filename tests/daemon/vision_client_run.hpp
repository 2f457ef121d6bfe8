// One run of an official-client script against a daemon serving a fresh
// model with the small random vision tower (moe-model-gen --vision): the
// script gets the daemon's /v1 URL, a 48x32 PNG as a data: URL and the number
// of tokens that image takes, and prints "all checks passed" when its checks
// hold. Shared by the chat (openai_vision) and Responses
// (responses_openai_vision) image tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "../support/test_images.hpp"
#include "daemon_harness.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon::testing {

inline void ExpectVisionScriptPasses(const std::string& script, const std::string& tag, uint64_t seed) {
  if (!OpenAiClientInstalled())
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  const std::string dir = ::testing::TempDir() + "/moe_" + tag + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  engine::ModelGenOptions o;
  o.config = *engine::PresetConfig("tiny");
  o.config.vision = engine::TinyVisionConfig();
  o.seed = seed;
  ASSERT_TRUE(engine::GenerateModel(o, dir).has_value());
  DaemonConfig c = TestConfig();
  c.model = dir;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const std::string png = test_support::EncodePng(48, 32, test_support::Gradient(48, 32));
  const auto span = engine::ImageSpanTokens(engine::TinyVisionConfig(), 48, 32);
  ASSERT_TRUE(span.has_value());
  auto run = RunOpenAiClientScript(script, d->url() + "/v1 'data:image/png;base64," + Base64Encode(png) + "' " +
                                               std::to_string(*span));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
  d->Shutdown(1);
  std::filesystem::remove_all(dir);
}

}  // namespace moeserve::daemon::testing
