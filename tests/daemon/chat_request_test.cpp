#include <gtest/gtest.h>

#include "moeserve/chat/chat_request.hpp"
#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {
namespace {

ApiError ErrorOf(const std::string& body) {
  auto r = ParseChatRequest(body);
  EXPECT_FALSE(r.has_value()) << body;
  return r ? ApiError{} : r.error();
}

TEST(ChatRequest, ParsesEveryHonouredField) {
  auto r = ParseChatRequest(R"({
    "model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"hi"}]},
      {"role":"assistant","content":null,"reasoning":"r","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"1"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,
    "max_tokens":5,"max_completion_tokens":7,"temperature":0,"top_p":0.5,"seed":42,"stop":["x","y"],
    "stream":true,"stream_options":{"include_usage":true},"user":"u","response_format":{"type":"json_object"},
    "reasoning_effort":"low","thinking_budget":10,"unknown_field":{"ignored":true}})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[1].content, "hi");
  EXPECT_EQ(r->messages[2].reasoning, "r");
  EXPECT_EQ(r->messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(r->tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r->tool_choice_name, "f");
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_EQ(r->temperature, 0.0f);
  EXPECT_EQ(r->seed, 42u);
  EXPECT_EQ(r->stop.size(), 2u);
  EXPECT_TRUE(r->stream && r->include_usage && r->json_object);
  EXPECT_EQ(r->reasoning_effort, ReasoningEffort::kLow);
  EXPECT_EQ(r->thinking_budget, 10);
}

TEST(ChatRequest, ReasoningContentWinsOverReasoning) {
  auto r = ParseChatRequest(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b","reasoning_content":"rc","reasoning":"r"}]})");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->messages[1].reasoning, "rc");
}

TEST(ChatRequest, ErrorsNameTheCulprit) {
  EXPECT_EQ(ErrorOf("not json").status, 400);
  EXPECT_EQ(ErrorOf("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}").code, "invalid_request_error");
  EXPECT_EQ(ErrorOf("[]").status, 400);
  EXPECT_EQ(ErrorOf("{}").param, "messages");
  EXPECT_EQ(ErrorOf(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":5}]})").param, "messages[0].content");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"max_tokens":"5"})").param, "max_tokens");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"temperature":5})").param, "temperature");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"stream":"yes"})").param, "stream");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"tool_choice":"required"})").param, "tool_choice");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"reasoning_effort":"max"})").param, "reasoning_effort");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"response_format":{"type":"xml"}})").param,
            "response_format.type");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_schema"}})").param,
            "response_format.json_schema");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_schema","json_schema":{"name":"a b"}}})").param,
            "response_format.json_schema.name");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_schema","json_schema":{"name":"r","strict":true,"schema":{"type":"object","properties":{"d":{"type":"string","format":"date"}}}}}})").param,
            "response_format.json_schema.schema");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"d":{"type":"string","format":"uuid"}}}}}]})").param,
            "tools[0].function.parameters");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f"}}],
                        "tool_choice":{"type":"function","function":{"name":"g"}}})").param,
            "tool_choice.function.name");
}

TEST(ChatRequest, ToolHistoryIsChecked) {
  auto e = ErrorOf(R"({"messages":[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"nope","content":"1"}]})");
  EXPECT_EQ(e.code, "invalid_tool_history");
  EXPECT_EQ(e.param, "messages[1].tool_call_id");
  e = ErrorOf(R"({"messages":[{"role":"user","content":"a"},
      {"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"user","content":"again"}]})");
  EXPECT_EQ(e.code, "invalid_tool_history");
  EXPECT_EQ(e.param, "messages[1].tool_calls[0]");
  e = ErrorOf(R"({"messages":[{"role":"user","content":"a"},
      {"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"1"},{"role":"tool","tool_call_id":"c1","content":"2"}]})");
  EXPECT_EQ(e.param, "messages[3].tool_call_id");
  auto ok = ParseChatRequest(R"({"messages":[{"role":"user","content":"a"},
      {"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},
                                        {"id":"c2","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c2","content":"1"},{"role":"tool","tool_call_id":"c1","content":"2"},
      {"role":"user","content":"thanks"}]})");
  EXPECT_TRUE(ok.has_value());
}

}  // namespace
}  // namespace moeserve::daemon

namespace moeserve::daemon {
namespace {

// Found by the chat_request fuzz target: a number past double's range made
// nlohmann throw out_of_range.406 out of the parser.
TEST(ChatRequestNumbers, NumberPastDoubleRangeIsA400) {
  auto r = ParseChatRequest(R"({"messages":[{"role":"user","content":"a"}],"temperature":65e2222000000000000000})");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 400);
}

}  // namespace
}  // namespace moeserve::daemon
