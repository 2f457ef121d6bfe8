// daemon.json_limits: JSON nested past the limit (64 levels) anywhere in a
// request, including inside the tool-call arguments string that the engine
// used to re-parse and re-serialise recursively, is a 400 whose `param` names
// the field; exactly the limit is served; the daemon serves a normal request
// after each.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "daemon_harness.hpp"
#include "moeserve/common/json_limits.hpp"

namespace moeserve::daemon::testing {
namespace {

constexpr int kAttackDepth = 100000;

std::string Nested(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// system, user, an assistant tool call (messages[2]) and its result (messages[3]).
json Conversation(const json& arguments, const json& result_content = "42") {
  json call = {{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", arguments}}}};
  return json::array({
      {{"role", "system"}, {"content", "s"}},
      {{"role", "user"}, {"content", "go"}},
      {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", result_content}},
  });
}

json Tools(const json& parameters = {{"type", "object"}}) {
  return json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", parameters}}}}});
}

json Body(const json& messages, const json& tools = Tools()) {
  return {{"model", "tiny"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 2}};
}

// The body's text with `marker` (a JSON string in it) replaced by raw JSON
// text: a value nested 100,000 deep cannot be built and dumped here, which is
// the point of the limit.
std::string Splice(const json& body, const std::string& marker, const std::string& raw) {
  std::string text = body.dump();
  std::string quoted = json(marker).dump();
  size_t at = text.find(quoted);
  EXPECT_NE(at, std::string::npos) << marker;
  return text.replace(at, quoted.size(), raw);
}

class JsonLimitsHttp : public SharedDaemonSuite {
 protected:
  static void ExpectRefused(const std::string& body, const std::string& param, const std::string& what,
                            const std::string& why = "more than 64 levels deep") {
    auto r = Http(port_, "POST", "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 400) << what << ": " << r.error << r.body.substr(0, 400);
    json j = r.Json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r.body.substr(0, 400);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << what;
    if (param.empty()) {
      EXPECT_TRUE(j["error"]["param"].is_null()) << what << ": " << j.dump();
    } else {
      EXPECT_EQ(j["error"]["param"], param) << what << ": " << j.dump();
    }
    EXPECT_NE(j["error"]["message"].get<std::string>().find(why), std::string::npos)
        << what << ": " << j.dump();
    ExpectAlive(what);
  }
  static void ExpectServed(const std::string& body, const std::string& what) {
    auto r = Http(port_, "POST", "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << what << ": " << r.error << r.body.substr(0, 400);
    ExpectAlive(what);
  }
  static void ExpectAlive(const std::string& after) {
    auto r = Chat(port_, {{"messages", UserTurn("still there?")}, {"max_tokens", 2}});
    ASSERT_EQ(r.status, 200) << "after " << after << ": " << r.error << r.body;
  }
};

TEST_F(JsonLimitsHttp, ArgumentsStringNested100000DeepIsRefused) {
  // The attack: ~200 KB, no key needed. The body's own depth is 6; the depth
  // is inside the string, which the engine used to parse and dump() again
  // while rendering the prompt, and the recursion overflowed the stack.
  std::string body = Body(Conversation(Nested(kAttackDepth))).dump();
  auto start = std::chrono::steady_clock::now();
  ExpectRefused(body, "messages[2].tool_calls[0].function.arguments", "100,000-deep arguments string");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("refused a %zu-byte, %d-deep arguments string (and served the next request) in %.1f ms\n", body.size(),
              kAttackDepth, ms);
  // The same text as an object key's value deeper in the arguments.
  ExpectRefused(Body(Conversation("{\"q\":" + Nested(kAttackDepth) + "}")).dump(),
                "messages[2].tool_calls[0].function.arguments", "deep value under a key of the arguments");
}

TEST_F(JsonLimitsHttp, ArgumentsAtTheLimitAreServedOneMoreIsRefused) {
  ExpectServed(Body(Conversation(Nested(kMaxJsonDepth))).dump(), "arguments exactly 64 deep");
  ExpectRefused(Body(Conversation(Nested(kMaxJsonDepth + 1))).dump(), "messages[2].tool_calls[0].function.arguments",
                "arguments 65 deep");
  // Deep-looking text inside a string of the arguments is text.
  ExpectServed(Body(Conversation("{\"q\":\"" + std::string(1000, '[') + "\"}")).dump(), "brackets inside a string");
  // Arguments that are not JSON at all are still rendered as a string.
  ExpectServed(Body(Conversation("{\"a\": ")).dump(), "arguments that are not JSON");
}

TEST_F(JsonLimitsHttp, ArgumentsObjectNestedDeepIsRefused) {
  json body = Body(Conversation(json{{"q", "@DEEP@"}}));
  ExpectRefused(Splice(body, "@DEEP@", Nested(kAttackDepth)), "messages[2].tool_calls[0].function.arguments",
                "arguments sent as an object");
}

TEST_F(JsonLimitsHttp, ToolSchemaNestedDeepIsRefused) {
  json params = {{"type", "object"}, {"properties", {{"a", {{"enum", "@DEEP@"}}}}}};
  ExpectRefused(Splice(Body(Conversation("{}"), Tools(params)), "@DEEP@", Nested(kAttackDepth)),
                "tools[0].function.parameters", "100,000-deep tool schema");
}

TEST_F(JsonLimitsHttp, ToolResultContentNestedDeepIsRefused) {
  json parts = json::array({{{"type", "text"}, {"text", "r"}, {"extra", "@DEEP@"}}});
  ExpectRefused(Splice(Body(Conversation("{}", parts)), "@DEEP@", Nested(kAttackDepth)), "messages[3].content",
                "deep value in a tool result's content part");
  ExpectRefused(Splice(Body(Conversation("{}", "@DEEP@")), "@DEEP@", Nested(kAttackDepth)), "messages[3].content",
                "tool result content nested directly");
  // A tool result whose text is deep JSON is a string: never parsed, served.
  ExpectServed(Body(Conversation("{}", std::string(1000, '[') + std::string(1000, ']'))).dump(),
               "deep JSON text as a tool result string");
}

TEST_F(JsonLimitsHttp, ResponseFormatNestedDeepIsRefused) {
  json body = Body(Conversation("{}"));
  body["response_format"] = {{"type", "json_object"}, {"json_schema", {{"schema", "@DEEP@"}}}};
  ExpectRefused(Splice(body, "@DEEP@", Nested(kAttackDepth)), "response_format", "deep response_format");
}

TEST_F(JsonLimitsHttp, BodyDepthBoundary) {
  // An unknown field counts too: every value in the body is bounded. Its
  // value below starts at depth 2 (the body object is 1).
  json body = {{"messages", UserTurn("hi")}, {"max_tokens", 2}, {"metadata", "@DEEP@"}};
  ExpectServed(Splice(body, "@DEEP@", Nested(kMaxJsonDepth - 1)), "body exactly 64 deep");
  ExpectRefused(Splice(body, "@DEEP@", Nested(kMaxJsonDepth)), "metadata", "body 65 deep");
  ExpectRefused(Nested(kAttackDepth), "", "a body that is a 100,000-deep array");
}

TEST_F(JsonLimitsHttp, ObjectsWithTooManyKeysAreRefusedQuickly) {
  // Bodies keep the client's key order (ordered_json), whose parse compares
  // each key with every earlier one: 50,000 keys (0.5 MB) took ~10 s of CPU.
  auto keys = [](int n) {
    json o = json::object();
    for (int i = 0; i < n; ++i) o["k" + std::to_string(i)] = 0;
    return o;
  };
  json body = {{"messages", UserTurn("hi")}, {"max_tokens", 2}, {"metadata", keys(256)}};
  ExpectServed(body.dump(), "256 keys in one object");
  body["metadata"] = keys(50000);
  auto start = std::chrono::steady_clock::now();
  ExpectRefused(body.dump(), "metadata", "50,000 keys in one object", "more than 256 keys");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("refused a %zu-byte body with 50,000 keys in one object in %.1f ms\n", body.dump().size(), ms);
  ExpectRefused(Body(Conversation(keys(50000).dump())).dump(), "messages[2].tool_calls[0].function.arguments",
                "50,000 keys in the arguments string", "more than 256 keys");
  ExpectRefused(Body(Conversation("{}"), Tools({{"type", "object"}, {"properties", keys(300)}})).dump(),
                "tools[0].function.parameters", "300 properties in a tool schema", "more than 256 keys");
}

}  // namespace
}  // namespace moeserve::daemon::testing
