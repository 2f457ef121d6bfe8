// Images in the chat format (model.md 14.5): in place within a user
// message's text, after a tool result's JSON; spans ready for the engine.
#include <gtest/gtest.h>

#include "moeserve/engine/chat_format.hpp"

namespace moeserve::engine {
namespace {

ImageInput Image(uint32_t w, uint32_t h, uint8_t v) {
  auto in = MakeImageInput(w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, v));
  EXPECT_TRUE(in);
  return *in;
}

VisionConfig Tower() { return TinyVisionConfig(); }  // 16-pixel units: 32x16 is 2 tokens, 16x16 one

std::vector<int> Bytes(std::string_view s) {
  std::vector<int> out;
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

TEST(VisionChat, UserImagesRenderInPlaceAndToolImagesAfterTheResult) {
  const VisionConfig v = Tower();
  ChatMessage user(ChatRole::kUser, "ab", std::nullopt, {}, "", {{0, Image(32, 16, 1)}, {1, Image(16, 16, 2)}});
  ChatMessage call(ChatRole::kAssistant, "", std::string(), {{"call_1", "shot", nlohmann::ordered_json::object()}});
  ChatMessage tool(ChatRole::kTool, "ok", std::nullopt, {}, "call_1", {{0, Image(16, 16, 3)}});
  auto r = RenderChatWithImages({user, call, tool}, nullptr, true, &v);
  ASSERT_TRUE(r) << r.error().ToString();

  std::vector<int> want = {256, 259, 269, 268, 268, 270, 97, 269, 268, 270, 98, 262};
  const std::vector<int> assistant = [&] {
    std::vector<int> a = {260, 263, 264, 265};
    auto body = Bytes(R"({"id":"call_1","name":"shot","arguments":{}})");
    a.insert(a.end(), body.begin(), body.end());
    a.push_back(266);
    a.push_back(262);
    return a;
  }();
  want.insert(want.end(), assistant.begin(), assistant.end());
  want.push_back(261);
  auto result = Bytes(R"({"tool_call_id":"call_1","content":"ok"})");
  want.insert(want.end(), result.begin(), result.end());
  for (int t : {269, 268, 270, 262, 260, 263}) want.push_back(t);
  EXPECT_EQ(r->tokens, want);

  ASSERT_EQ(r->images.size(), 3u);
  EXPECT_EQ(r->images[0].offset, 3);
  EXPECT_EQ(r->images[0].tokens, 2);
  EXPECT_EQ(r->images[1].offset, 8);
  EXPECT_EQ(r->images[2].image.content_hash, tool.images[0].image.content_hash);
  EXPECT_TRUE(ValidateImageSpans(v, r->tokens, r->images));

  // Without images the two renderers agree byte for byte.
  ChatMessage plain(ChatRole::kUser, "ab");
  auto a = RenderChatWithImages({plain}, nullptr, true, &v);
  auto b = RenderChat({plain}, nullptr, true);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->tokens, *b);
  EXPECT_TRUE(a->images.empty());
}

TEST(VisionChat, MisplacedImagesAreRefusedByMessage) {
  const VisionConfig v = Tower();
  auto refusal = [&](const std::vector<ChatMessage>& m, const VisionConfig* vision) {
    auto r = RenderChatWithImages(m, nullptr, true, vision);
    return r ? std::string() : r.error().message();
  };
  ChatMessage user(ChatRole::kUser, "ab", std::nullopt, {}, "", {{0, Image(16, 16, 1)}});
  EXPECT_NE(refusal({user}, nullptr).find("messages[0]: image input needs a model with a vision tower"), std::string::npos);
  EXPECT_FALSE(RenderChat({user}, nullptr, true));

  ChatMessage assistant(ChatRole::kAssistant, "x", std::nullopt, {}, "", {{0, Image(16, 16, 1)}});
  EXPECT_NE(refusal({user, assistant}, &v).find("messages[1]: only user and tool messages carry images"), std::string::npos);

  ChatMessage past_end(ChatRole::kUser, "ab", std::nullopt, {}, "", {{3, Image(16, 16, 1)}});
  EXPECT_NE(refusal({past_end}, &v).find("messages[0]: image 0 is placed outside the content"), std::string::npos);
  ChatMessage backwards(ChatRole::kUser, "ab", std::nullopt, {}, "", {{2, Image(16, 16, 1)}, {1, Image(16, 16, 2)}});
  EXPECT_NE(refusal({backwards}, &v).find("before the previous image"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::engine
