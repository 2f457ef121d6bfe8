// daemon.gpt_oss_serve: a real moe-daemon serving a tiny random gpt-oss
// checkpoint (tools/reference/gpt_oss.py, the o200k_harmony tokenizer beside
// it). The model's output is noise, so these tests check the shape of the
// answers and what the daemon did with the request: the prompt it rendered
// (usage.prompt_tokens against the harmony renderer), streamed and
// non-streamed answers agreeing, a named tool call opened by the server's
// header (its arguments constrained by the schema) and the next turn served
// from the prefix cache, the official `openai`
// client, the Responses API's tool loop in harmony, and clear 4xx refusals.
// (What the output parser makes of well-formed output is in
// daemon.harmony_serving, on scripted token streams.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <unistd.h>

#include "daemon_harness.hpp"
#include "gpt_oss_checkpoint.hpp"
#include "moeserve/engine/harmony.hpp"

namespace moeserve::daemon::testing {
namespace {

const char* kWeatherTools = R"([{"type":"function","function":{"name":"get_weather","description":"Current weather.",
  "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]}},"required":["city"],
  "additionalProperties":false}}}])";

class GptOssServe : public TinyGptOssSuite {
 protected:
  static void SetUpTestSuite() { StartSuite(TinyGptOssConfig(TinyGptOssDir(), "gpt-oss-tiny")); }

  // What the harmony renderer makes of `messages` (+ tools) at `effort`.
  static size_t RenderedTokens(const std::vector<engine::ChatMessage>& messages, const nlohmann::ordered_json* tools,
                               engine::HarmonyEffort effort) {
    engine::HarmonySystemOptions s;
    s.effort = effort;
    auto ids = engine::RenderHarmonyChat(*tok_, messages, tools, s, true);
    EXPECT_TRUE(ids) << ids.error().ToString();
    return ids ? ids->size() : 0;
  }

};

engine::ChatMessage User(std::string text) { return {engine::ChatRole::kUser, std::move(text), std::nullopt, {}, ""}; }

TEST_F(GptOssServe, ModelsListsTheServedModel) {
  auto r = Http(port_, "GET", "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["data"][0]["id"], "gpt-oss-tiny");
  EXPECT_EQ(r.Json()["data"][0]["max_model_len"], 512);
}

TEST_F(GptOssServe, ChatAnswersInTheApisShapeFromAHarmonyPrompt) {
  json body = {{"model", "gpt-oss-tiny"}, {"messages", UserTurn("What is 2+2?")}, {"max_tokens", 6}, {"seed", 4},
               {"reasoning_effort", "high"}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "gpt-oss-tiny");
  EXPECT_EQ(j["tier"], "high");
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_string());
  EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length") << choice;
  // The prompt is harmony's rendering at the request's tier.
  EXPECT_EQ(j["usage"]["prompt_tokens"], RenderedTokens({User("What is 2+2?")}, nullptr, engine::HarmonyEffort::kHigh));
  EXPECT_GE(j["usage"]["completion_tokens"].get<int>(), 1);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 6);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

  // Streamed with the same seed: the same answer, in chunks, then usage and [DONE].
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = Chat(port_, body);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_NE(s.headers["content-type"].find("text/event-stream"), std::string::npos);
  auto events = s.Events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content, reasoning, finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (!c["usage"].is_null()) usage = c["usage"];
    for (const auto& ch : c["choices"]) {
      content += ch["delta"].value("content", "");
      if (ch["delta"].contains("reasoning_content")) reasoning += ch["delta"]["reasoning_content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(content, choice["message"]["content"]);
  EXPECT_EQ(reasoning, choice["message"]["reasoning_content"].is_null() ? "" : choice["message"]["reasoning_content"]);
  EXPECT_EQ(finish, choice["finish_reason"]);
  // The same prompt again: its whole 16-token blocks come from the prefix
  // cache the first request filled; the rest of the usage is the same.
  const int prompt_tokens = j["usage"]["prompt_tokens"];
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), (prompt_tokens - 1) / 16 * 16) << usage;
  usage["prompt_tokens_details"] = j["usage"]["prompt_tokens_details"];
  EXPECT_EQ(usage, j["usage"]);
}

TEST_F(GptOssServe, NamedToolChoiceOpensTheCallInThePrompt) {
  const auto tools = nlohmann::ordered_json::parse(kWeatherTools);
  json body = {{"messages", UserTurn("Weather in Oslo?")},
               {"tools", json::parse(kWeatherTools)},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
               {"max_tokens", 24},
               {"seed", 2}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  const json& msg = j["choices"][0]["message"];
  ASSERT_TRUE(msg["tool_calls"].is_array()) << j;
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  // The arguments follow the schema (the random model is constrained), and <|call|> ends the call.
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j;
  auto parsed = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(parsed.is_object()) << msg;
  EXPECT_TRUE(parsed["city"] == "Oslo" || parsed["city"] == "Rome") << parsed;
  EXPECT_EQ(parsed.size(), 1u) << parsed;
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  // The prompt: harmony's rendering with the tools, then the call header the server wrote.
  const auto header = *tok_->Encode("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                                    engine::AddedTokenText::kMatchAll);
  EXPECT_EQ(j["usage"]["prompt_tokens"],
            RenderedTokens({User("Weather in Oslo?")}, &tools, engine::HarmonyEffort::kLow) + header.size());

  // The tool-result turn re-sends that prompt and the call: only what is new
  // is prefilled, from the last whole cache block (16 tokens) that the
  // first prompt filled (its last token is always computed).
  json next = {{"messages", json::array({{{"role", "user"}, {"content", "Weather in Oslo?"}},
                                         msg,
                                         {{"role", "tool"}, {"tool_call_id", msg["tool_calls"][0]["id"]}, {"content", "3C"}}})},
               {"tools", json::parse(kWeatherTools)},
               {"max_tokens", 2}};
  auto t = Chat(port_, next);
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.Json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            (j["usage"]["prompt_tokens"].get<int>() - 1) / 16 * 16)
      << t.body;

  // Streamed: the call's id and name come first, then argument pieces adding up to the same text.
  body["stream"] = true;
  auto s = Chat(port_, body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string args, first_name, first_id;
  for (const auto& e : s.Events()) {
    if (e == "[DONE]") break;
    const json chunk = json::parse(e);  // held: a range-for over a member of a temporary reads freed memory
    for (const auto& ch : chunk["choices"]) {
      if (!ch["delta"].contains("tool_calls")) continue;
      for (const auto& tc : ch["delta"]["tool_calls"]) {
        EXPECT_EQ(tc["index"], 0);
        if (tc.contains("id") && first_id.empty()) {
          first_id = tc["id"];
          first_name = tc["function"]["name"];
        }
        args += tc["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(first_name, "get_weather");
  EXPECT_EQ(first_id, msg["tool_calls"][0]["id"]);  // same seed and prompt, same id
  EXPECT_EQ(args, msg["tool_calls"][0]["function"]["arguments"]);
}

TEST_F(GptOssServe, RequiredToolChoiceCallsOneOfTheTools) {
  json tools = json::parse(kWeatherTools);
  tools.push_back(json::parse(R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object",
      "properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"],"additionalProperties":false}}})"));
  auto r = Chat(port_, {{"messages", UserTurn("Weather or time?")}, {"tools", tools}, {"tool_choice", "required"},
                        {"max_tokens", 32}, {"seed", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j;
  const json& call = j["choices"][0]["message"]["tool_calls"][0];
  const std::string name = call["function"]["name"];
  auto parsed = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(parsed.is_object()) << call;
  if (name == "get_weather") EXPECT_TRUE(parsed["city"] == "Oslo" || parsed["city"] == "Rome") << parsed;
  else if (name == "get_time") EXPECT_TRUE(parsed["zone"] == "UTC" || parsed["zone"] == "CET") << parsed;
  else ADD_FAILURE() << "called " << name;
}

// /v1/responses is a translation onto the chat path, so harmony serves it as
// it serves chat completions: a named call constrained by its schema, its
// result sent back by previous_response_id (the stored conversation in front,
// from the prefix cache), and the continuation streamed as semantic events.
TEST_F(GptOssServe, ResponsesApiToolLoopInHarmony) {
  const json tools = json::parse(R"([{"type":"function","name":"get_weather","strict":true,
    "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]}},"required":["city"],
    "additionalProperties":false}}])");
  auto first = Http(port_, "POST", "/v1/responses",
                    json{{"input", "Weather in Oslo?"}, {"tools", tools}, {"max_output_tokens", 64}, {"seed", 5},
                         {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}}}
                        .dump());
  ASSERT_EQ(first.status, 200) << first.body;
  const json r1 = first.Json();
  json call;
  for (const auto& item : r1["output"])
    if (item["type"] == "function_call") call = item;
  ASSERT_TRUE(call.is_object()) << r1["output"];
  EXPECT_EQ(call["name"], "get_weather");
  const json args = json::parse(call["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << call;
  EXPECT_TRUE(args["city"] == "Oslo" || args["city"] == "Rome") << args;

  const json next = {{"previous_response_id", r1["id"]}, {"tools", tools}, {"max_output_tokens", 8},
                     {"input", {{{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "12 C"}}}}};
  auto second = Http(port_, "POST", "/v1/responses", next.dump());
  ASSERT_EQ(second.status, 200) << second.body;
  const json r2 = second.Json();
  EXPECT_GT(r2["usage"]["input_tokens"].get<int>(), r1["usage"]["input_tokens"].get<int>());
  EXPECT_GT(r2["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0) << r2["usage"];

  json streamed_body = next;
  streamed_body["stream"] = true;
  auto streamed = Http(port_, "POST", "/v1/responses", streamed_body.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  // Named events: "event: <type>\ndata: {...}\n\n".
  std::vector<std::string> events;
  for (size_t at = streamed.body.find("\ndata: "); at != std::string::npos; at = streamed.body.find("\ndata: ", at + 1))
    events.push_back(streamed.body.substr(at + 7, streamed.body.find("\n\n", at) - at - 7));
  ASSERT_GE(events.size(), 3u) << streamed.body;
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(json::parse(events[i])["sequence_number"], i);
  EXPECT_EQ(json::parse(events.front())["type"], "response.created");
  const std::string last = json::parse(events.back())["type"];
  EXPECT_TRUE(last == "response.completed" || last == "response.incomplete") << last;
}

TEST_F(GptOssServe, ConcurrentRequestsAllAnswer) {
  std::vector<std::future<HttpResponse>> runs;
  for (int i = 0; i < 4; ++i) {
    runs.push_back(std::async(std::launch::async, [i] {
      return Chat(port_, {{"messages", UserTurn("request " + std::to_string(i))}, {"max_tokens", 4 + i}, {"seed", i}});
    }));
  }
  for (auto& f : runs) {
    auto r = f.get();
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_LE(r.Json()["usage"]["completion_tokens"].get<int>(), 7);
  }
}

// response_format json_schema: harmony's `# Response Formats` in the
// developer message, and the final answer constrained to the schema. A short
// thinking budget makes the engine close the random model's analysis and open
// the final answer, whose JSON the structure controller then holds to the schema.
TEST_F(GptOssServe, ResponseFormatAnswerSatisfiesTheSchema) {
  const json schema = json::parse(R"({"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]},
      "days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false})");
  for (int seed : {1, 2, 3}) {
    json body = {{"messages", UserTurn("Plan a trip.")},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "trip"}, {"schema", schema}}}}},
                 {"thinking_budget", 4},
                 {"max_tokens", 120},
                 {"seed", seed}};
    auto r = Chat(port_, body);
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j;
    const std::string content = j["choices"][0]["message"]["content"].get<std::string>();
    auto answer = json::parse(content, nullptr, false);
    ASSERT_TRUE(answer.is_object()) << content;
    EXPECT_TRUE(answer["city"] == "Oslo" || answer["city"] == "Rome") << content;
    ASSERT_TRUE(answer["days"].is_number_integer()) << content;
    EXPECT_GE(answer["days"].get<int>(), 1);
    EXPECT_LE(answer["days"].get<int>(), 7);
    EXPECT_EQ(answer.size(), 2u) << content;
    // The schema was rendered as harmony's structured output.
    engine::HarmonySystemOptions s;
    s.effort = engine::HarmonyEffort::kLow;
    s.response_format = engine::HarmonyResponseFormat{"trip", "", nlohmann::ordered_json::parse(schema.dump())};
    auto ids = engine::RenderHarmonyChat(*tok_, {{engine::ChatRole::kUser, "Plan a trip.", std::nullopt, {}, ""}}, nullptr, s, true);
    ASSERT_TRUE(ids);
    EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), ids->size());
  }
}

// Tools under tool_choice auto: the random model chooses for itself, and
// whatever it chooses is well-formed harmony: a call names an offered
// function with arguments satisfying its schema, an answer is text; never a
// broken format (moe_output_format_errors_total stays put).
double FormatErrors(int port) {
  const std::string body = Http(port, "GET", "/metrics").body;
  const std::string name = "moe_output_format_errors_total ";
  const size_t at = body.find("\n" + name);
  EXPECT_NE(at, std::string::npos) << body.substr(0, 2000);
  return at == std::string::npos ? -1 : std::stod(body.substr(at + 1 + name.size()));
}

TEST_F(GptOssServe, AutoToolChoiceOutputIsAlwaysWellFormed) {
  const double before = FormatErrors(port_);
  int calls = 0;
  for (int seed = 1; seed <= 8; ++seed) {
    json body = {{"messages", UserTurn("Weather in Oslo?")},
                 {"tools", json::parse(kWeatherTools)},
                 {"thinking_budget", 6},
                 {"temperature", 2.0},  // flatter: this random model otherwise always picks analysis, then final
                 {"max_tokens", 40},
                 {"seed", seed}};
    auto r = Chat(port_, body);
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    const json& choice = j["choices"][0];
    EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "tool_calls" ||
                choice["finish_reason"] == "length")
        << j;
    EXPECT_FALSE(j.contains("error")) << j;
    if (choice["finish_reason"] != "tool_calls") continue;
    ++calls;
    const json& call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(call["function"]["name"], "get_weather");
    auto args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call;
    EXPECT_TRUE(args["city"] == "Oslo" || args["city"] == "Rome") << args;
  }
  // The seeds are fixed and the model is too: some of them call (an
  // unconstrained random model never writes a valid call header and arguments).
  EXPECT_GT(calls, 0);
  EXPECT_EQ(FormatErrors(port_), before);
}

TEST_F(GptOssServe, HostileRequestsGetClearErrors) {
  auto expect_400 = [](const HttpResponse& r, const std::string& code, const std::string& param) {
    EXPECT_EQ(r.status, 400) << r.body;
    json e = r.Json()["error"];
    EXPECT_EQ(e["code"], code) << r.body;
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << r.body;
    }
    EXPECT_FALSE(e["message"].get<std::string>().empty());
  };
  // A tool schema nothing satisfies.
  expect_400(Chat(port_, {{"messages", UserTurn("hi")},
                          {"tools", json::parse(R"([{"type":"function","function":{"name":"f","parameters":
                               {"type":"object","properties":{"n":{"type":"integer","minimum":5,"maximum":1}}}}}])")}}),
             "invalid_request_error", "tools[0].function.parameters");
  // Parameters that are not a schema object.
  auto not_schema = Chat(port_, {{"messages", UserTurn("hi")},
                                 {"tools", json::parse(R"([{"type":"function","function":{"name":"f","parameters":"x"}}])")}});
  EXPECT_EQ(not_schema.status, 400) << not_schema.body;
  // A prompt longer than the context window (512 tokens here).
  std::string longtext;
  for (int i = 0; i < 800; ++i) longtext += "word" + std::to_string(i) + " ";
  expect_400(Chat(port_, {{"messages", UserTurn(longtext)}}), "context_length_exceeded", "");
  expect_400(Chat(port_, {{"messages", UserTurn("hi")}, {"max_tokens", 100000}}), "context_length_exceeded", "");
  // What this family does not support is refused, not ignored.
  // logprobs are served (daemon.gpt_oss_logprobs); their range is checked.
  expect_400(Chat(port_, {{"messages", UserTurn("hi")}, {"logprobs", true}, {"top_logprobs", 21}}),
             "invalid_request_error", "top_logprobs");
  // A response schema nothing satisfies.
  expect_400(Chat(port_, {{"messages", UserTurn("hi")},
                          {"response_format", json::parse(R"({"type":"json_schema","json_schema":{"name":"n","schema":
                               {"type":"object","properties":{"n":{"type":"integer","minimum":5,"maximum":1}},"required":["n"]}}})")}}),
             "invalid_request_error", "response_format.json_schema.schema");
  // A tool result answering no call.
  expect_400(Chat(port_, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}},
                                                   {{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "1"}}})}}),
             "invalid_tool_history", "");
  // The daemon still serves after all that.
  EXPECT_EQ(Chat(port_, {{"messages", UserTurn("hi")}, {"max_tokens", 2}}).status, 200);
}

TEST_F(GptOssServe, OfficialOpenAiClient) {
  if (!OpenAiClientInstalled()) GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  auto run = RunOpenAiClientScript("tests/daemon/openai_gpt_oss.mjs", daemon_->url() + "/v1");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace moeserve::daemon::testing
