// Checkpoint files come from storage a tenant controls, and chat JSON from
// clients: every JSON the engine parses or re-serialises is held to
// kMaxJsonDepth, so a value nested 100,000 deep is a clear error, never a stack
// overflow in a later dump() (nlohmann's dump recurses once per level).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/manifest.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr int kAttackDepth = 100000;

std::string Nested(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

void ExpectDepthError(const Error& e, std::string_view source) {
  EXPECT_NE(e.message().find(std::string(source)), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("nests objects and arrays more than 64 levels deep"), std::string::npos) << e.message();
}

TEST(JsonLimitsFiles, DeepConfigJsonIsAClearError) {
  // Before the limit, the "must be an integer, got <dump>" message recursed
  // through the value and overflowed the stack.
  auto r = ParseModelConfig(R"({"architecture":"moe-dsa-v1","vocab_size":)" + Nested(kAttackDepth) + "}",
                            "m/config.json");
  ASSERT_FALSE(r);
  ExpectDepthError(r.error(), "m/config.json: ");
  EXPECT_EQ(r.error().message().rfind("m/config.json: ", 0), 0u);
}

TEST(JsonLimitsFiles, DeepSafetensorsHeaderIsAClearError) {
  std::string header = R"({"t":{"dtype":"F32","shape":)" + Nested(kAttackDepth) + R"(,"data_offsets":[0,4]}})";
  std::vector<uint8_t> image(8);
  for (int i = 0; i < 8; ++i) image[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  image.insert(image.end(), header.begin(), header.end());
  image.resize(image.size() + 4);
  auto r = SafetensorsFile::FromBytes("m/x.safetensors", image);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
  ExpectDepthError(r.error(), "m/x.safetensors: header: ");
  EXPECT_NE(r.error().message().find("under t.shape[0]"), std::string::npos) << r.error().message();
}

TEST(JsonLimitsFiles, DeepTokenizerJsonIsAClearError) {
  // model.type was dumped into the "expected BPE" message.
  auto r = Tokenizer::FromJsonText(R"({"model":{"type":)" + Nested(kAttackDepth) + "}}", "m/tokenizer.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
  ExpectDepthError(r.error(), "m/tokenizer.json: ");
}

TEST(JsonLimitsFiles, DeepManifestIsAClearError) {
  auto r = ParseManifest(R"({"files":[],"extra":)" + Nested(kAttackDepth) + "}", "m/manifest.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
  ExpectDepthError(r.error(), "m/manifest.json: ");
}

TEST(JsonLimitsFiles, LargeVocabularyLoadsInLinearishTime) {
  // Every padding id up to vocab_size is a model.vocab key. Read into
  // ordered_json (a linear search per key) 200,000 keys took minutes;
  // std::map-backed json takes well under a second.
  constexpr int kVocab = 200000;
  nlohmann::json doc = nlohmann::json::parse(Tokenizer::Builtin(384).ToJson());
  for (int id = 384; id < kVocab; ++id) doc["model"]["vocab"]["<|pad_" + std::to_string(id) + "|>"] = id;
  std::string text = doc.dump();
  auto start = std::chrono::steady_clock::now();
  auto t = Tokenizer::FromJsonText(text, "m/tokenizer.json", kVocab);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(t) << t.error().ToString();
  EXPECT_EQ(t->vocab_size(), kVocab);
  std::printf("tokenizer.json with %d vocab keys (%.1f MB) read in %.2f s\n", kVocab, text.size() / 1e6, s);
  EXPECT_LT(s, 30.0);  // generous for a loaded machine; the quadratic parse took minutes
}

TEST(JsonLimitsChat, ArgumentsTextBoundaryDepth) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = kChatJsonMaxDepth};
  auto at_limit = ToolCallArgumentsFromText(Nested(kChatJsonMaxDepth), limits, "args");
  ASSERT_TRUE(at_limit) << at_limit.error().ToString();
  auto rendered = RenderToolCallJson({.id = "c", .name = "f", .arguments = *at_limit});
  ASSERT_TRUE(rendered) << rendered.error().ToString();
  EXPECT_EQ(*rendered, R"({"id":"c","name":"f","arguments":)" + Nested(kChatJsonMaxDepth) + "}");
  auto over = ToolCallArgumentsFromText(Nested(kChatJsonMaxDepth + 1), limits, "args");
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().message().rfind("args: nests objects and arrays more than 64 levels deep", 0), 0u);
  // Deep text inside a JSON string is text; invalid JSON is kept as a string.
  auto in_string = ToolCallArgumentsFromText("{\"q\":\"" + std::string(kAttackDepth, '[') + "\"}", limits, "args");
  ASSERT_TRUE(in_string);
  EXPECT_TRUE(in_string->is_object());
  auto not_json = ToolCallArgumentsFromText("{\"a\": ", limits, "args");
  ASSERT_TRUE(not_json);
  EXPECT_EQ(*not_json, ordered_json("{\"a\": "));
}

TEST(JsonLimitsChat, RendererRefusesValuesDeeperThanTheLimit) {
  // Values built by a caller that skipped the limits: an error naming the
  // place, not a stack overflow in dump().
  // (Moved, never copied: a copy recurses too.)
  ChatMessage user;
  user.role = ChatRole::kUser;
  user.content = "q";
  ChatMessage assistant;
  assistant.role = ChatRole::kAssistant;
  assistant.tool_calls.push_back({.id = "c", .name = "f", .arguments = ordered_json::parse(Nested(kAttackDepth))});
  std::vector<ChatMessage> messages;
  messages.push_back(user);
  messages.push_back(std::move(assistant));
  auto r = RenderChat(messages, nullptr, false);
  ASSERT_FALSE(r);
  ExpectDepthError(r.error(), "messages[1].tool_calls[0]: arguments: ");

  ordered_json tools = ordered_json::parse(R"([{"type":"function","function":{"name":"f","parameters":)" +
                                           Nested(kAttackDepth) + "}}]");
  auto t = RenderChat({user}, &tools, true);
  ASSERT_FALSE(t);
  ExpectDepthError(t.error(), "tools: ");
}

TEST(JsonLimitsChat, GeneratedDeepArgumentsAreReturnedAsGenerated) {
  // Keys out of the rendered order send the span through a full parse, whose
  // arguments were re-serialised: deep ones count as not valid JSON instead.
  std::string args = Nested(kAttackDepth);
  std::string span = R"({"name":"f","arguments":)" + args + R"(,"id":"c"})";
  auto p = ParseToolCallSpan(span);
  ASSERT_FALSE(p);  // no id and name in the rendered order, and no full parse
  auto in_order = ParseToolCallSpan(R"({"id":"c","name":"f","arguments":)" + args + "}");
  ASSERT_TRUE(in_order);
  EXPECT_FALSE(in_order->arguments_valid_json);
  EXPECT_EQ(in_order->arguments_text, args);
}

}  // namespace
}  // namespace moeserve::engine
