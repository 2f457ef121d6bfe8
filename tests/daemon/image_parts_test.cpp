// daemon.image_parts: OpenAI image_url content parts in the chat request
// parser: recorded with their message and text offset in user and tool
// messages; refused by name in assistant and system messages, with a bad
// detail or a missing url; audio, video and file parts refused clearly.
#include <gtest/gtest.h>

#include "moeserve/chat/chat_request.hpp"
#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {
namespace {

using json = nlohmann::json;

json ImagePart(const std::string& url, const char* detail = nullptr) {
  json p = {{"type", "image_url"}, {"image_url", {{"url", url}}}};
  if (detail) p["image_url"]["detail"] = detail;
  return p;
}

json Text(const std::string& t) { return {{"type", "text"}, {"text", t}}; }

TEST(ImageParts, UserAndToolPartsAreRecordedWithTheirPlace) {
  json body = {{"messages", json::array({
      {{"role", "user"}, {"content", json::array({Text("look: "), ImagePart("data:a", "low"), Text("and "),
                                                  ImagePart("data:b")})}},
      {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
          {"function", {{"name", "screenshot"}, {"arguments", "{}"}}}}})}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", json::array({Text("shot"), ImagePart("data:c", "high")})}},
  })}};
  auto req = ParseChatRequest(body.dump());
  ASSERT_TRUE(req.has_value()) << req.error().message;
  EXPECT_EQ(req->messages[0].content, "look: and ");
  ASSERT_EQ(req->images.size(), 3u);
  EXPECT_EQ(req->images[0].message, 0u);
  EXPECT_EQ(req->images[0].text_offset, 6u);
  EXPECT_EQ(req->images[0].url, "data:a");
  EXPECT_EQ(req->images[0].detail, "low");
  EXPECT_EQ(req->images[0].param, "messages[0].content[1].image_url.url");
  EXPECT_EQ(req->images[1].text_offset, 10u);
  EXPECT_EQ(req->images[1].detail, "auto");
  EXPECT_EQ(req->images[2].message, 2u);
  EXPECT_EQ(req->images[2].text_offset, 4u);
  EXPECT_EQ(req->images[2].detail, "high");
  EXPECT_EQ(req->messages[2].content, "shot");
}

ApiError Refusal(const json& content, const std::string& role = "user") {
  json body = {{"messages", json::array({{{"role", role}, {"content", content}}})}};
  auto req = ParseChatRequest(body.dump());
  EXPECT_FALSE(req.has_value()) << content.dump();
  return req ? ApiError{} : req.error();
}

TEST(ImageParts, MisplacedOrMalformedPartsAreRefusedByName) {
  auto e = Refusal(json::array({ImagePart("data:a")}), "system");
  EXPECT_EQ(e.param, "messages[0].content[0].type");
  EXPECT_NE(e.message.find("user and tool messages only"), std::string::npos) << e.message;
  e = Refusal(json::array({ImagePart("data:a")}), "assistant");
  EXPECT_NE(e.message.find("user and tool messages only"), std::string::npos) << e.message;
  e = Refusal(json::array({ImagePart("data:a", "medium")}));
  EXPECT_EQ(e.param, "messages[0].content[0].image_url.detail");
  e = Refusal(json::array({{{"type", "image_url"}, {"image_url", {{"url", ""}}}}}));
  EXPECT_EQ(e.param, "messages[0].content[0].image_url.url");
  e = Refusal(json::array({{{"type", "image_url"}, {"image_url", "data:a"}}}));
  EXPECT_EQ(e.param, "messages[0].content[0].image_url");
  e = Refusal(json::array({{{"type", "hologram"}}}));
  EXPECT_EQ(e.message, "'messages[0].content[0].type' must be \"text\" or \"image_url\"");
}

TEST(ImageParts, AudioVideoAndFilePartsAreRefusedClearly) {
  for (const char* kind : {"input_audio", "video_url", "file"}) {
    auto e = Refusal(json::array({Text("hi"), {{"type", kind}}}));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages[0].content[1].type");
    EXPECT_NE(e.message.find("audio, video and file parts are not supported"), std::string::npos) << e.message;
  }
}

}  // namespace
}  // namespace moeserve::daemon
