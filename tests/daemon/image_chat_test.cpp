// daemon.image_chat: image parts through POST /v1/chat/completions.
// A text-only model answers 400 "reads text only", but only once the parts
// are valid (bad base64 and too many images are named first). A model with
// the small random tower (moe-model-gen --vision) answers, counting each
// image's span in usage.prompt_tokens, prompt_tokens_details.image_tokens and
// the usage ledger that budgets read;
// a decompression bomb and images whose tokens fill the context are refused
// with the limit named. The official client's round trip is
// daemon.openai_vision; sessions and stored responses keep their images
// (daemon.session_images).
#include <gtest/gtest.h>

#include <fstream>

#include "../support/test_images.hpp"
#include "daemon_harness.hpp"
#include "image_serving.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon::testing {
namespace {

std::string PngUrl(uint32_t w, uint32_t h) {
  return "data:image/png;base64," + Base64Encode(test_support::EncodePng(w, h, test_support::Gradient(w, h)));
}

json ImageTurn(const std::vector<std::string>& urls, const std::string& text = "What is in the picture?") {
  json content = json::array({{{"type", "text"}, {"text", text}}});
  for (const auto& u : urls) content.push_back({{"type", "image_url"}, {"image_url", {{"url", u}}}});
  return json::array({{{"role", "user"}, {"content", content}}});
}

// Prompt tokens the usage ledger has charged this month, over every tenant
// (what budgets and prices are computed from).
const std::map<std::string, std::string> kKey = {{"Authorization", "Bearer sk-img-0123456789"}};

int64_t LedgerPromptTokens(int port) {
  int64_t prompt = 0;
  const json usage = Http(port, "GET", "/v1/usage", "", kKey).Json();
  for (const auto& row : usage["data"]) {
    if (row["period"] != "month") continue;
    prompt += row["tokens"]["input"].get<int64_t>() + row["tokens"]["cached_input"].get<int64_t>();
  }
  return prompt;
}

json Body(const json& messages) { return {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 4}, {"seed", 1}}; }

TEST(ImageChat, TextOnlyModelRefusesImagesAfterValidatingThem) {
  DaemonConfig c = TestConfig();
  c.images.max_per_request = 2;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const int port = PortOf(*d);
  auto r = Chat(port, Body(ImageTurn({PngUrl(8, 8)})));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("this model reads text only"), std::string::npos) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "messages[0].content[1].image_url.url");
  r = Chat(port, Body(ImageTurn({"data:image/png;base64,iVBO!!=="})));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("not valid base64"), std::string::npos) << r.body;
  r = Chat(port, Body(ImageTurn({PngUrl(8, 8), PngUrl(8, 8), PngUrl(8, 8)})));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("(image_max_per_request)"), std::string::npos) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "messages[0].content[3].image_url.url");
  d->Shutdown(1);
}

TEST(ImageChat, VisionModelCountsImageTokensInUsage) {
  DaemonConfig c = TestConfig();
  c.model = VisionModelDir();
  c.api_keys_file = ::testing::TempDir() + "/moe_image_chat_keys_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(c.api_keys_file) << "keys:\n  - {key: sk-img-0123456789, tenant: img}\n";
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const int port = PortOf(*d);
  auto text_only = Chat(port, Body(ImageTurn({})), kKey);
  ASSERT_EQ(text_only.status, 200) << text_only.body;
  const int64_t charged_before = LedgerPromptTokens(port);
  auto with_image = Chat(port, Body(ImageTurn({PngUrl(40, 24)})), kKey);
  ASSERT_EQ(with_image.status, 200) << with_image.body;
  // The ledger charges the image's span as prompt tokens.
  EXPECT_EQ(LedgerPromptTokens(port) - charged_before, with_image.Json()["usage"]["prompt_tokens"].get<int64_t>());
  const auto span = engine::ImageSpanTokens(engine::TinyVisionConfig(), 40, 24);
  ASSERT_TRUE(span.has_value());
  const json usage = with_image.Json()["usage"];
  EXPECT_EQ(usage["prompt_tokens_details"]["image_tokens"], *span) << usage.dump();
  EXPECT_EQ(usage["prompt_tokens"].get<int64_t>(), text_only.Json()["usage"]["prompt_tokens"].get<int64_t>() + *span);
  EXPECT_FALSE(text_only.Json()["usage"]["prompt_tokens_details"].contains("image_tokens"));

  // A header declaring 100000 x 100000 pixels is refused before decoding.
  const std::string bomb = test_support::WithPngSize(test_support::EncodePng(4, 4, test_support::Gradient(4, 4)),
                                                     100000, 100000);
  auto r = Chat(port, Body(ImageTurn({"data:image/png;base64," + Base64Encode(bomb)})), kKey);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("(image_max_pixels)"), std::string::npos) << r.body;

  d->Shutdown(1);
}

TEST(ImageChat, ImageTokensOverTheContextAreRefused) {
  DaemonConfig c = TestConfig();
  c.model = VisionModelDir();
  c.max_context = 100;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  // Each 128 x 128 image is the tower's largest (16 x 16 patches of 8 pixels, merged 2 x 2):
  // 64 placeholders, 66 span tokens.
  auto r = Chat(PortOf(*d), Body(ImageTurn({PngUrl(128, 128), PngUrl(128, 128)})));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "context_length_exceeded") << r.body;
  EXPECT_NE(r.body.find("images become 132 prompt tokens"), std::string::npos) << r.body;
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
