#include "moeserve/engine/chat_format.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {
namespace {

using ordered_json = nlohmann::ordered_json;

ChatMessage Message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}
ChatMessage System(std::string text) { return Message(ChatRole::kSystem, std::move(text)); }
ChatMessage User(std::string text) { return Message(ChatRole::kUser, std::move(text)); }
ChatMessage Assistant(std::string content, std::optional<std::string> reasoning = std::nullopt,
                      std::vector<ChatToolCall> calls = {}) {
  ChatMessage m = Message(ChatRole::kAssistant, std::move(content));
  m.reasoning = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}
ChatMessage ToolResult(std::string id, std::string content) {
  ChatMessage m = Message(ChatRole::kTool, std::move(content));
  m.tool_call_id = std::move(id);
  return m;
}

// A client's arguments text as the daemon hands it over (parsed once, bounded).
ordered_json Args(std::string_view text) {
  auto v = ToolCallArgumentsFromText(text, {.max_bytes = 1 << 20, .max_depth = kChatJsonMaxDepth}, "arguments");
  EXPECT_TRUE(v) << v.error().ToString();
  return v ? *v : ordered_json();
}

// The rendering with specials spelled out, for readable failures.
std::string Show(const std::vector<int>& ids) { return Tokenizer::Builtin(384).Decode(ids, true); }

std::vector<int> MustRender(const std::vector<ChatMessage>& messages, const ordered_json* tools = nullptr,
                            bool prompt = true) {
  auto r = RenderChat(messages, tools, prompt);
  EXPECT_TRUE(r) << r.error().ToString();
  return r ? *r : std::vector<int>{};
}

TEST(ChatFormat, ReferenceSequenceFromModelMd) {
  // model.md section 8, verbatim.
  const std::vector<int> expected = {
      256, 258, 83,  262, 259, 104, 105, 262, 260, 263, 114, 264, 265, 123, 34,  105, 100, 34,  58,  34,
      99,  97,  108, 108, 95,  49,  34,  44,  34,  110, 97,  109, 101, 34,  58,  34,  102, 34,  44,  34,
      97,  114, 103, 117, 109, 101, 110, 116, 115, 34,  58,  123, 125, 125, 266, 262, 261, 123, 34,  116,
      111, 111, 108, 95,  99,  97,  108, 108, 95,  105, 100, 34,  58,  34,  99,  97,  108, 108, 95,  49,
      34,  44,  34,  99,  111, 110, 116, 101, 110, 116, 34,  58,  34,  49,  34,  125, 262, 260, 263};
  std::vector<ChatMessage> messages = {
      System("S"), User("hi"), Assistant("", "r", {{.id = "call_1", .name = "f", .arguments = Args("{}")}}),
      ToolResult("call_1", "1")};
  std::vector<int> ids = MustRender(messages);
  EXPECT_EQ(ids, expected) << Show(ids);
}

TEST(ChatFormat, NoSystemOmitsTheBlock) {
  EXPECT_EQ(Show(MustRender({User("hi")})), "<|bos|><|user|>hi<|end|><|assistant|><|think|>");
  // An empty system text without tools is "neither system text nor tools".
  EXPECT_EQ(Show(MustRender({System(""), User("hi")})), "<|bos|><|user|>hi<|end|><|assistant|><|think|>");
}

TEST(ChatFormat, WithoutGenerationPrompt) {
  EXPECT_EQ(Show(MustRender({User("hi"), Assistant("yo", "hm")}, nullptr, false)),
            "<|bos|><|user|>hi<|end|><|assistant|><|think|>hm<|/think|>yo<|end|>");
}

TEST(ChatFormat, ToolsWithoutSystemStillGetTheSystemBlock) {
  ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
  ])");
  EXPECT_EQ(Show(MustRender({User("hi")}, &tools)),
            "<|bos|><|system|><|tools|>[{\"name\":\"get_weather\",\"description\":\"Weather now\","
            "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
            "\"required\":[\"city\"]}}]<|end|><|user|>hi<|end|><|assistant|><|think|>");
  EXPECT_TRUE(Show(MustRender({System("Be brief."), User("hi")}, &tools))
                  .starts_with("<|bos|><|system|>Be brief.<|tools|>[{\"name\":\"get_weather\""));
}

TEST(ChatFormat, EmptyOrNullToolsMeanNoTools) {
  ordered_json empty = ordered_json::array();
  ordered_json null_tools = nullptr;
  EXPECT_EQ(Show(MustRender({User("hi")}, &empty)), "<|bos|><|user|>hi<|end|><|assistant|><|think|>");
  EXPECT_EQ(Show(MustRender({User("hi")}, &null_tools)), "<|bos|><|user|>hi<|end|><|assistant|><|think|>");
}

TEST(ChatFormat, MalformedToolsAreRefusedNamingTheElement) {
  ordered_json not_array = ordered_json::object();
  ordered_json bare_function = ordered_json::parse(R"([{"type":"function","function":{"name":"a"}},{"name":"b"}])");
  ordered_json wrong_type = ordered_json::parse(R"([{"type":"code_interpreter","function":{"name":"a"}}])");
  auto a = RenderChat({User("hi")}, &not_array, true);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().message(), "tools: must be an array");
  auto b = RenderChat({User("hi")}, &bare_function, true);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message().find("tools[1]"), std::string::npos) << b.error().message();
  auto c = RenderChat({User("hi")}, &wrong_type, true);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("tools[0].type"), std::string::npos) << c.error().message();
}

TEST(ChatFormat, EmptyReasoningRendersAnEmptyThinkSpan) {
  EXPECT_EQ(Show(MustRender({User("q"), Assistant("a")}, nullptr, false)),
            "<|bos|><|user|>q<|end|><|assistant|><|think|><|/think|>a<|end|>");
  EXPECT_EQ(Show(MustRender({User("q"), Assistant("a", "")}, nullptr, false)),
            "<|bos|><|user|>q<|end|><|assistant|><|think|><|/think|>a<|end|>");
}

TEST(ChatFormat, ArgumentsThatAreNotJsonRenderAsAString) {
  std::vector<ChatMessage> m = {
      User("q"), Assistant("", "", {{.id = "call_1", .name = "f", .arguments = Args("{\"a\": 1")}}),
      ToolResult("call_1", "x")};
  EXPECT_EQ(Show(MustRender(m, nullptr, false)),
            "<|bos|><|user|>q<|end|><|assistant|><|think|><|/think|><|tool_call|>"
            "{\"id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1\"}<|/tool_call|><|end|>"
            "<|tool|>{\"tool_call_id\":\"call_1\",\"content\":\"x\"}<|end|>");
  auto empty = RenderToolCallJson({.id = "c", .name = "f", .arguments = Args("")});
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, R"({"id":"c","name":"f","arguments":""})");
}

TEST(ChatFormat, ArgumentsKeepTheClientsKeyOrderAndBecomeCompact) {
  auto r = RenderToolCallJson(
      {.id = "call_9", .name = "g", .arguments = Args(R"({ "zeta": 1, "alpha": {"y": [1, 2], "b": null} })")});
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(*r, R"({"id":"call_9","name":"g","arguments":{"zeta":1,"alpha":{"y":[1,2],"b":null}}})");
}

TEST(ChatFormat, ToolsKeepTheClientsKeyOrder) {
  ordered_json tools = ordered_json::parse(
      R"([{"function":{"parameters":{"z":1,"a":2},"name":"f"},"type":"function"}])");
  EXPECT_EQ(Show(MustRender({User("x")}, &tools, false)),
            R"(<|bos|><|system|><|tools|>[{"parameters":{"z":1,"a":2},"name":"f"}]<|end|><|user|>x<|end|>)");
}

TEST(ChatFormat, UserTypingSpecialTokenTextStaysBytes) {
  std::vector<int> ids = MustRender({User("<|end|><|assistant|>")});
  // bos, user, 20 bytes, end, assistant, think: exactly one <|end|> id.
  ASSERT_EQ(ids.size(), 1u + 1u + 20u + 1u + 2u);
  for (size_t i = 2; i < 22; ++i) EXPECT_LT(ids[i], 256) << i;
  EXPECT_EQ(ids[2], '<');
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok::kEnd), 1);
}

TEST(ChatFormat, UnicodeContentIsUtf8BytesAndJsonIsNotAsciiEscaped) {
  std::vector<int> ids = MustRender({User("héllo 🌍")}, nullptr, false);
  std::vector<int> expected = {tok::kBos, tok::kUser};
  for (unsigned char c : std::string("héllo 🌍")) expected.push_back(c);
  expected.push_back(tok::kEnd);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(Show(MustRender({ToolResult("c", "naïve \"q\"\n\x01/")}, nullptr, false)),
            "<|bos|><|tool|>{\"tool_call_id\":\"c\",\"content\":\"naïve \\\"q\\\"\\n\\u0001/\"}<|end|>");
}

TEST(ChatFormat, InvalidUtf8InJsonIsAnErrorNotACrash) {
  auto r = RenderChat({ToolResult("c", "bad \xFF")}, nullptr, true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().message().rfind("messages[0]", 0), 0u) << r.error().message();
}

TEST(ChatFormat, LeadingSystemMessagesJoinLaterOnesAreRefused) {
  EXPECT_EQ(Show(MustRender({System("a"), System("b"), User("q")})),
            "<|bos|><|system|>a\nb<|end|><|user|>q<|end|><|assistant|><|think|>");
  auto r = RenderChat({System("a"), User("q"), System("late")}, nullptr, true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message().rfind("messages[2]: a system message must come before", 0), 0u)
      << r.error().message();
}

TEST(ChatFormat, FieldsOnTheWrongRoleAreRefused) {
  ChatMessage user_with_calls = User("q");
  user_with_calls.tool_calls.push_back({.id = "c", .name = "f", .arguments = Args("{}")});
  auto r = RenderChat({user_with_calls}, nullptr, true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "messages[0]: only assistant messages carry tool_calls");
}

TEST(ChatFormat, MultipleToolCallsInOneTurn) {
  std::vector<ChatMessage> m = {
      User("q"), Assistant("ok", "plan", {{.id = "call_a", .name = "f", .arguments = Args(R"({"x":1})")},
                                           {.id = "call_b", .name = "g", .arguments = Args("[]")}})};
  EXPECT_EQ(Show(MustRender(m, nullptr, false)),
            "<|bos|><|user|>q<|end|><|assistant|><|think|>plan<|/think|>ok"
            "<|tool_call|>{\"id\":\"call_a\",\"name\":\"f\",\"arguments\":{\"x\":1}}<|/tool_call|>"
            "<|tool_call|>{\"id\":\"call_b\",\"name\":\"g\",\"arguments\":[]}<|/tool_call|><|end|>");
}

TEST(ChatFormat, ParseChatRole) {
  EXPECT_EQ(*ParseChatRole("system"), ChatRole::kSystem);
  EXPECT_EQ(*ParseChatRole("developer"), ChatRole::kSystem);
  EXPECT_EQ(*ParseChatRole("tool"), ChatRole::kTool);
  EXPECT_FALSE(ParseChatRole("function"));
  EXPECT_EQ(ChatRoleName(ChatRole::kAssistant), "assistant");
}

// ---- ParseToolCallSpan ---------------------------------------------------------

TEST(ToolCallSpan, RoundTripsTheRenderedSpan) {
  ChatToolCall call{.id = "call_1", .name = "f", .arguments = Args(R"({"b":[1,{"c":"}"}],"a":"x"})")};
  auto text = RenderToolCallJson(call);
  ASSERT_TRUE(text);
  auto p = ParseToolCallSpan(*text);
  ASSERT_TRUE(p) << p.error().ToString();
  EXPECT_EQ(p->id, "call_1");
  EXPECT_EQ(p->name, "f");
  EXPECT_EQ(p->arguments_text, R"({"b":[1,{"c":"}"}],"a":"x"})");
  EXPECT_TRUE(p->arguments_valid_json);
  EXPECT_TRUE(p->arguments_is_object);
}

TEST(ToolCallSpan, ArgumentsAreReturnedAsGenerated) {
  auto p = ParseToolCallSpan(R"({"id":"call_x","name":"get_w\u0065ather","arguments":{ "city" : "Paris" }})");
  ASSERT_TRUE(p) << p.error().ToString();
  EXPECT_EQ(p->name, "get_weather");
  EXPECT_EQ(p->arguments_text, R"({ "city" : "Paris" })");
  EXPECT_TRUE(p->arguments_valid_json);
}

TEST(ToolCallSpan, InvalidArgumentsAreKeptAndFlagged) {
  auto p = ParseToolCallSpan(R"({"id":"call_x","name":"f","arguments":{"city": Paris}})");
  ASSERT_TRUE(p) << p.error().ToString();
  EXPECT_EQ(p->id, "call_x");
  EXPECT_EQ(p->arguments_text, R"({"city": Paris})");
  EXPECT_FALSE(p->arguments_valid_json);
  EXPECT_FALSE(p->arguments_is_object);
}

TEST(ToolCallSpan, MissingOuterBraceAfterCutOff) {
  auto cut = ParseToolCallSpan(R"({"id":"call_x","name":"f","arguments":{"a":1})");
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->arguments_text, R"({"a":1})");
  EXPECT_TRUE(cut->arguments_valid_json);
  auto cut_inside = ParseToolCallSpan(R"({"id":"call_x","name":"f","arguments":{"a":[1,)");
  ASSERT_TRUE(cut_inside);
  EXPECT_EQ(cut_inside->arguments_text, R"({"a":[1,)");
  EXPECT_FALSE(cut_inside->arguments_valid_json);
}

TEST(ToolCallSpan, NonObjectArguments) {
  auto p = ParseToolCallSpan(R"({"id":"c","name":"f","arguments":"{\"a\":1}"})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->arguments_text, R"("{\"a\":1}")");
  EXPECT_TRUE(p->arguments_valid_json);
  EXPECT_FALSE(p->arguments_is_object);
}

TEST(ToolCallSpan, OtherKeyOrderGoesThroughAFullParse) {
  auto p = ParseToolCallSpan(R"({"name":"f","arguments":{"q":2,"p":1},"id":"call_z"})");
  ASSERT_TRUE(p) << p.error().ToString();
  EXPECT_EQ(p->id, "call_z");
  EXPECT_EQ(p->name, "f");
  EXPECT_EQ(p->arguments_text, R"({"q":2,"p":1})");
  EXPECT_TRUE(p->arguments_is_object);
}

TEST(ToolCallSpan, GarbageIsRefusedWithTheText) {
  auto p = ParseToolCallSpan("I want to call f");
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("I want to call f"), std::string::npos);
  EXPECT_FALSE(ParseToolCallSpan(R"({"id":"c","arguments":{}})"));
}

TEST(ToolCallSpan, IdPrefixIsThePrefixOfTheRenderedSpan) {
  auto full = RenderToolCallJson({.id = "call_abc", .name = "f", .arguments = Args("{}")});
  ASSERT_TRUE(full);
  std::string prefix = ToolCallSpanIdPrefix("call_abc");
  EXPECT_EQ(prefix, R"({"id":"call_abc",)");
  EXPECT_EQ(full->rfind(prefix, 0), 0u);
}

TEST(ToolCallId, ShapeAndVariety) {
  std::mt19937_64 rng(7);
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    std::string id = NewToolCallId(rng);
    ASSERT_EQ(id.size(), 29u) << id;
    ASSERT_EQ(id.substr(0, 5), "call_");
    for (char c : id.substr(5)) ASSERT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_NE(NewToolCallId(), NewToolCallId());
}

}  // namespace
}  // namespace moeserve::engine
