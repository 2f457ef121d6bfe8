// daemon.agent_api: the parts of the Chat Completions API agent frameworks
// lean on, end to end on the tiny model (random weights): a constrained call
// cut short by max_tokens, logprobs, and response_format json_schema.
#include <gtest/gtest.h>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

const json kCalculator = json::parse(R"({"type":"function","function":{"name":"calculator",
  "parameters":{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}}})");

class AgentApi : public SharedDaemonSuite {};

// The streamed events' tool-call deltas, in order.
std::vector<json> ToolCallDeltas(const HttpResponse& r) {
  std::vector<json> out;
  for (const auto& e : r.Events()) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    for (const auto& ch : c["choices"])
      if (ch["delta"].contains("tool_calls"))
        for (const auto& t : ch["delta"]["tool_calls"]) out.push_back(t);
  }
  return out;
}

// thinking_budget 0: the engine closes the reasoning at once, then
// <|tool_call|>, the forced 38-byte id prefix, "name": and the name. Cuts
// inside the id, inside "name": and inside the name itself.
TEST_F(AgentApi, NamedCallCutShortKeepsItsNameAndId) {
  json body = {{"messages", UserTurn("What is 6*7?")},
               {"tools", json::array({kCalculator})},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "calculator"}}}}},
               {"thinking_budget", 0},
               {"seed", 5},
               {"max_tokens", 200}};
  auto full = Chat(port_, body);
  ASSERT_EQ(full.status, 200) << full.body;
  const json full_call = full.Json()["choices"][0]["message"]["tool_calls"][0];
  ASSERT_EQ(full_call["function"]["name"], "calculator");
  const std::string id = full_call["id"];
  for (int max_tokens : {3, 20, 44, 50}) {
    body["max_tokens"] = max_tokens;
    body.erase("stream");
    auto r = Chat(port_, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json choice = r.Json()["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "length");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.body;
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "calculator") << max_tokens;
    EXPECT_EQ(choice["message"]["tool_calls"][0]["id"], id) << max_tokens;

    body["stream"] = true;
    auto s = Chat(port_, body);
    ASSERT_EQ(s.status, 200);
    auto deltas = ToolCallDeltas(s);
    ASSERT_FALSE(deltas.empty()) << s.body;
    EXPECT_EQ(deltas[0]["function"]["name"], "calculator") << s.body;
    EXPECT_EQ(deltas[0]["id"], id);
    for (size_t i = 1; i < deltas.size(); ++i) EXPECT_FALSE(deltas[i]["function"].contains("name"));
  }
}

}  // namespace
}  // namespace moeserve::daemon::testing
