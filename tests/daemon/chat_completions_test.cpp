// daemon.chat_completions: the chat endpoint end to end on the tiny model
// (random weights): response shapes, streaming chunks, tool calls, schema
// constraints, multi-turn history, prefix cache on vs off.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "daemon_harness.hpp"
#include "moeserve/engine/json_grammar.hpp"

namespace moeserve::daemon::testing {
namespace {

const json kCalculator = json::parse(R"({"type":"function","function":{"name":"calculator",
  "description":"Evaluates an arithmetic expression",
  "parameters":{"type":"object","properties":{"expression":{"type":"string"},
    "precision":{"type":"integer"},"mode":{"type":"string","enum":["exact","approx"]},
    "vars":{"type":"array","items":{"type":"number"}}},"required":["expression","mode"]}}})");

class ChatApi : public SharedDaemonSuite {};

// Rebuilds the message of a streamed response from its chunks.
struct Streamed {
  std::string reasoning, content, finish_reason;
  json tool_calls = json::array();
  json usage;
  bool done = false;
};

Streamed Reassemble(const HttpResponse& r) {
  Streamed s;
  auto events = r.Events();
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] == "[DONE]") {
      EXPECT_EQ(i, events.size() - 1) << "[DONE] is the last event";
      s.done = true;
      continue;
    }
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_TRUE(c["id"].get<std::string>().starts_with("chatcmpl-"));
    if (c.contains("usage") && !c["usage"].is_null()) s.usage = c["usage"];
    for (const auto& ch : c["choices"]) {
      EXPECT_EQ(ch["index"], 0);
      const json& d = ch["delta"];
      if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const auto& t : d["tool_calls"]) {
          size_t idx = t["index"];
          while (s.tool_calls.size() <= idx) s.tool_calls.push_back({{"function", {{"arguments", ""}}}});
          json& acc = s.tool_calls[idx];
          if (t.contains("id")) acc["id"] = t["id"], acc["type"] = t["type"];
          if (t["function"].contains("name")) acc["function"]["name"] = t["function"]["name"];
          acc["function"]["arguments"] = acc["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      }
      if (!ch["finish_reason"].is_null()) s.finish_reason = ch["finish_reason"];
    }
  }
  return s;
}

TEST_F(ChatApi, NonStreamedResponseShape) {
  auto r = Chat(port_, {{"model", "tiny"}, {"messages", UserTurn("Hello")}, {"max_tokens", 12}, {"seed", 7}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_TRUE(j["created"].is_number_integer());
  const json& c = j["choices"][0];
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_TRUE(c["message"]["content"].is_string());
  EXPECT_TRUE(c["message"].contains("reasoning_content"));
  std::string fr = c["finish_reason"];
  EXPECT_TRUE(fr == "stop" || fr == "length") << fr;
  const json& u = j["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 0);
  EXPECT_LE(u["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["completion_tokens_details"]["reasoning_tokens"].is_number_integer());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());
  // Reasoning is bounded by the tier's budget (low = 4 in TestConfig) plus nothing else.
  EXPECT_LE(u["completion_tokens_details"]["reasoning_tokens"].get<int>(), 4);
}

TEST_F(ChatApi, StreamingChunksMatchTheNonStreamedAnswer) {
  json body = {{"messages", UserTurn("Tell me something")}, {"max_tokens", 24}, {"seed", 11}, {"temperature", 0.8},
               {"reasoning_effort", "medium"}};
  auto plain = Chat(port_, body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto streamed = Chat(port_, body);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_NE(streamed.headers["content-type"].find("text/event-stream"), std::string::npos);
  // every event is "data: ...\n\n"
  EXPECT_TRUE(streamed.body.starts_with("data: {"));
  EXPECT_TRUE(streamed.body.ends_with("data: [DONE]\n\n"));
  auto events = streamed.Events();
  ASSERT_GE(events.size(), 3u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  json usage_chunk = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_TRUE(usage_chunk["usage"].is_object());
  Streamed s = Reassemble(streamed);
  EXPECT_TRUE(s.done);
  json m = plain.Json()["choices"][0]["message"];
  EXPECT_EQ(s.content, m["content"].is_null() ? "" : m["content"].get<std::string>());
  EXPECT_EQ(s.reasoning, m["reasoning_content"].is_null() ? "" : m["reasoning_content"].get<std::string>());
  EXPECT_EQ(s.finish_reason, plain.Json()["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.usage["completion_tokens"], plain.Json()["usage"]["completion_tokens"]);
  // without include_usage there is no usage chunk
  body.erase("stream_options");
  auto no_usage = Reassemble(Chat(port_, body));
  EXPECT_TRUE(no_usage.usage.is_null());
}

TEST_F(ChatApi, NamedToolCallStreamsAndReassemblesToTheNonStreamedCall) {
  json body = {{"messages", UserTurn("What is 2+2?")}, {"tools", {kCalculator}},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "calculator"}}}}},
               {"max_tokens", 320}, {"seed", 5}, {"thinking_budget", 2}};
  auto plain = Chat(port_, body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  json choice = plain.Json()["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << plain.body;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  json call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "calculator");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  json args = json::parse(call["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(engine::CheckAgainstSchema(nlohmann::ordered_json::parse(args.dump()),
                                 nlohmann::ordered_json::parse(kCalculator["function"]["parameters"].dump())).has_value());

  body["stream"] = true;
  Streamed s = Reassemble(Chat(port_, body));
  EXPECT_EQ(s.finish_reason, "tool_calls");
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.tool_calls[0]["id"], call["id"]);
  EXPECT_EQ(s.tool_calls[0]["function"]["name"], "calculator");
  EXPECT_EQ(s.tool_calls[0]["function"]["arguments"], call["function"]["arguments"]);
}

TEST_F(ChatApi, SchemaConstrainedArgumentsOnAHundredSeeds) {
  // Submitted concurrently, so the engine batches them.
  std::vector<std::future<HttpResponse>> futures;
  for (int seed = 0; seed < 100; ++seed) {
    json body = {{"messages", UserTurn("Compute something")}, {"tools", {kCalculator}}, {"tool_choice", "required"},
                 {"parallel_tool_calls", false}, {"max_tokens", 320}, {"seed", seed}, {"thinking_budget", 0},
                 {"temperature", 1.0}};
    futures.push_back(std::async(std::launch::async, [body] { return Chat(port_, body); }));
  }
  const auto schema = nlohmann::ordered_json::parse(kCalculator["function"]["parameters"].dump());
  for (int seed = 0; seed < 100; ++seed) {
    auto r = futures[seed].get();
    ASSERT_EQ(r.status, 200) << r.body;
    json choice = r.Json()["choices"][0];
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << "seed " << seed << ": " << r.body;
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    std::string args = choice["message"]["tool_calls"][0]["function"]["arguments"];
    auto parsed = nlohmann::ordered_json::parse(args, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << "seed " << seed << ": " << args;
    auto ok = engine::CheckAgainstSchema(parsed, schema);
    EXPECT_TRUE(ok.has_value()) << "seed " << seed << ": " << args << ": " << (ok ? "" : ok.error().message());
  }
}

TEST_F(ChatApi, JsonObjectResponseFormat) {
  for (int seed = 0; seed < 5; ++seed) {
    auto r = Chat(port_, {{"messages", UserTurn("Answer in JSON")}, {"response_format", {{"type", "json_object"}}},
                                   {"max_tokens", 200}, {"seed", seed}, {"thinking_budget", 1}});
    ASSERT_EQ(r.status, 200) << r.body;
    std::string content = r.Json()["choices"][0]["message"]["content"];
    EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << content;
  }
}

TEST_F(ChatApi, FiveTurnToolConversationWithFullHistory) {
  json messages = json::array({{{"role", "system"}, {"content", "You are a calculator agent."}},
                               {{"role", "user"}, {"content", "Add up some numbers."}}});
  int last_prompt_tokens = 0;
  for (int turn = 0; turn < 5; ++turn) {
    json body = {{"messages", messages}, {"tools", {kCalculator}}, {"tool_choice", "required"},
                 {"parallel_tool_calls", false}, {"max_tokens", 320}, {"seed", 100 + turn}, {"thinking_budget", 3}};
    auto r = Chat(port_, body);
    ASSERT_EQ(r.status, 200) << "turn " << turn << ": " << r.body;
    json j = r.Json();
    json msg = j["choices"][0]["message"];
    ASSERT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << r.body;
    int prompt_tokens = j["usage"]["prompt_tokens"];
    EXPECT_GT(prompt_tokens, last_prompt_tokens) << "the history grows every turn";
    if (turn > 0) {
      EXPECT_GT(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << "earlier turns are a cached prefix";
    }
    last_prompt_tokens = prompt_tokens;
    // The assistant turn goes back with its reasoning (as `reasoning`, vLLM's
    // name, on odd turns) and the tool result answers its call.
    json assistant = {{"role", "assistant"}, {"content", msg["content"]}, {"tool_calls", msg["tool_calls"]}};
    if (!msg["reasoning_content"].is_null()) assistant[turn % 2 ? "reasoning" : "reasoning_content"] = msg["reasoning_content"];
    messages.push_back(assistant);
    messages.push_back({{"role", "tool"}, {"tool_call_id", msg["tool_calls"][0]["id"]}, {"content", std::to_string(turn * 7)}});
    if (turn == 2) messages.push_back({{"role", "user"}, {"content", "Now multiply."}});
  }
  // A final answer turn without forcing a call.
  auto r = Chat(port_, {{"messages", messages}, {"tools", {kCalculator}}, {"max_tokens", 8}, {"seed", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
}

TEST_F(ChatApi, ReasoningIsRenderedBackFromEitherFieldName) {
  auto with = [&](const char* field) {
    json messages = json::array({{{"role", "user"}, {"content", "q"}},
                                 {{"role", "assistant"}, {"content", "a"}, {field, "some earlier reasoning"}},
                                 {{"role", "user"}, {"content", "q2"}}});
    return Chat(port_, {{"messages", messages}, {"max_tokens", 1}}).Json()["usage"]["prompt_tokens"].get<int>();
  };
  auto without = Chat(port_, {{"messages", json::array({{{"role", "user"}, {"content", "q"}},
                                                                 {{"role", "assistant"}, {"content", "a"}},
                                                                 {{"role", "user"}, {"content", "q2"}}})},
                                       {"max_tokens", 1}})
                     .Json()["usage"]["prompt_tokens"]
                     .get<int>();
  const int n = static_cast<int>(std::string("some earlier reasoning").size());
  EXPECT_EQ(with("reasoning_content"), without + n);
  EXPECT_EQ(with("reasoning"), without + n);
}

TEST_F(ChatApi, StopStringsEndTheAnswer) {
  // Greedy output of the same prompt, then stop at a piece of it.
  json body = {{"messages", UserTurn("Say something long")}, {"max_tokens", 30}, {"temperature", 0}, {"thinking_budget", 0}};
  auto full = Chat(port_, body).Json();
  std::string content = full["choices"][0]["message"]["content"];
  // Greedy decoding of a fixed model is deterministic: the answer is known to
  // be long enough; if a model change made it too short, this must fail, not skip.
  ASSERT_GE(content.size(), 3u) << "the greedy answer is too short for this check: '" << content << "'";
  // The second character of the answer, whole (a stop string is matched on
  // decoded text, so a piece of a UTF-8 character could never match).
  size_t at = 1;
  while (at < content.size() && (static_cast<unsigned char>(content[at]) & 0xC0) == 0x80) ++at;
  ASSERT_LT(at, content.size()) << "the greedy answer is a single character: '" << content << "'";
  size_t len = 1;
  while (at + len < content.size() && (static_cast<unsigned char>(content[at + len]) & 0xC0) == 0x80) ++len;
  std::string stop = content.substr(at, len);
  body["stop"] = stop;
  auto cut = Chat(port_, body).Json();
  std::string got = cut["choices"][0]["message"]["content"];
  EXPECT_EQ(got, content.substr(0, content.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST(ChatPrefixCache, OnAndOffGiveTheSameTokens) {
  std::vector<json> answers[2];
  for (int on = 0; on < 2; ++on) {
    auto c = TestConfig();
    c.prefix_cache = on == 1;
    auto d = StartDaemon(c);
    int port = PortOf(*d);
    std::string long_system(300, 'S');
    for (int i = 0; i < 3; ++i) {
      json body = {{"messages", json::array({{{"role", "system"}, {"content", long_system}},
                                             {{"role", "user"}, {"content", "question " + std::to_string(i)}}})},
                   {"max_tokens", 16}, {"seed", 3}, {"temperature", 0.9}, {"thinking_budget", 4}};
      auto r = Chat(port, body).Json();
      answers[on].push_back(r);
    }
    if (on == 1) EXPECT_GT(answers[1][2]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
    else EXPECT_EQ(answers[0][2]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
    d->Shutdown(1);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(answers[0][i]["choices"][0]["message"], answers[1][i]["choices"][0]["message"]) << i;
    EXPECT_EQ(answers[0][i]["usage"]["completion_tokens"], answers[1][i]["usage"]["completion_tokens"]);
  }
}

}  // namespace
}  // namespace moeserve::daemon::testing
