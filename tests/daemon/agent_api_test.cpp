// daemon.agent_api: the parts of the Chat Completions API agent frameworks
// lean on, end to end on the tiny model (random weights): a constrained call
// cut short by max_tokens, logprobs, and response_format json_schema.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "daemon_harness.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/tokenizer.hpp"

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

// The content tokens' entries of a response: JSON choices[0].logprobs.content
// or, streamed, every chunk's in order.
json LogprobsOf(const HttpResponse& r, bool streamed) {
  if (!streamed) return r.Json()["choices"][0]["logprobs"]["content"];
  json all = json::array();
  for (const auto& e : r.Events()) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    for (const auto& ch : c["choices"]) {
      if (ch["logprobs"].is_null()) continue;
      EXPECT_TRUE(ch["delta"].contains("content")) << "logprobs come with the content they made";
      for (const auto& t : ch["logprobs"]["content"]) all.push_back(t);
    }
  }
  return all;
}

// response_format json_object keeps every generated token a byte of the
// content (reasoning closed at once by thinking_budget 0), so the content
// tokens rebuild the whole sequence; logprobs are taken before that mask.
TEST_F(AgentApi, LogprobsMatchTheModelsLogitsStreamedOrNot) {
  const json messages = UserTurn("Give me JSON");
  json body = {{"messages", messages},       {"response_format", {{"type", "json_object"}}},
               {"thinking_budget", 0},       {"seed", 17},
               {"temperature", 1.3},         {"top_p", 0.9},
               {"max_tokens", 24},           {"logprobs", true},
               {"top_logprobs", 3}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const std::string content = j["choices"][0]["message"]["content"];
  const json entries = LogprobsOf(r, false);
  ASSERT_TRUE(entries.is_array());
  ASSERT_FALSE(entries.empty());
  EXPECT_TRUE(j["choices"][0]["logprobs"]["refusal"].is_null());
  std::vector<int> ids;
  for (const auto& e : entries) {
    ASSERT_EQ(e["bytes"].size(), 1u) << e.dump();
    const int b = e["bytes"][0];
    ids.push_back(b);
    // A byte that is a whole character is that character, any other is \xNN.
    constexpr char kHex[] = "0123456789abcdef";
    std::string text = b < 0x80 ? std::string(1, static_cast<char>(b))
                                : std::string("\\x") + kHex[(b >> 4) & 15] + kHex[b & 15];
    EXPECT_EQ(e["token"], text);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    for (size_t k = 1; k < 3; ++k) EXPECT_LE(e["top_logprobs"][k]["logprob"], e["top_logprobs"][k - 1]["logprob"]);
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
  }
  std::printf("%zu content tokens: %s\n", ids.size(), content.c_str());
  EXPECT_EQ(engine::Tokenizer::Builtin(engine::tok::kFirstPadding).Decode(ids), content);
  const int completion = j["usage"]["completion_tokens"];
  // <|/think|>, the content, and <|end|> unless max_tokens ended it
  EXPECT_EQ(static_cast<int>(ids.size()) + 1 + (j["choices"][0]["finish_reason"] == "stop" ? 1 : 0), completion);

  // The same tokens through the model, in one pass.
  std::vector<engine::ChatMessage> chat = {{engine::ChatRole::kUser, "Give me JSON", std::nullopt, {}, ""}};
  auto prompt = engine::RenderChat(chat, nullptr, true);
  ASSERT_TRUE(prompt);
  std::vector<int> tokens = *prompt;
  tokens.push_back(engine::tok::kEndThink);
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  auto dir = engine::OpenModelDir(TinyModelDir());
  ASSERT_TRUE(dir);
  auto model = engine::Model::Load(*dir);
  ASSERT_TRUE(model);
  engine::KvPool pool(16, 16, (*model)->cache_floats_per_token());
  engine::SequenceCache cache = (*model)->NewSequence();
  ASSERT_TRUE(engine::EnsureBlocks(pool, cache, static_cast<int64_t>(tokens.size())));
  engine::ForwardSegment seg{&cache, std::span<const int>(tokens), true};
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &logits));
  const size_t V = static_cast<size_t>(dir->config.vocab_size);
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* row = logits.data() + (prompt->size() + i) * V;  // the position before content token i
    double mx = -1e30, sum = 0;
    for (int v = 0; v < engine::tok::kFirstPadding; ++v) mx = std::max<double>(mx, row[v]);
    for (int v = 0; v < engine::tok::kFirstPadding; ++v) sum += std::exp(row[v] - mx);
    auto expected = [&](int id) { return row[id] - mx - std::log(sum); };
    EXPECT_NEAR(entries[i]["logprob"].get<double>(), expected(ids[i]), 2e-3) << "token " << i;
    for (const auto& alt : entries[i]["top_logprobs"]) {
      const std::string t = alt["token"];
      ASSERT_FALSE(alt["bytes"].empty());
      const int id = alt["bytes"].size() == 1 ? alt["bytes"][0].get<int>() : -1;
      if (id < 0) continue;  // a special token's text; its value is checked through the order below
      EXPECT_NEAR(alt["logprob"].get<double>(), expected(id), 2e-3) << "token " << i << " alternative " << t;
    }
    std::vector<double> all;
    for (int v = 0; v < engine::tok::kFirstPadding; ++v) all.push_back(expected(v));
    std::sort(all.rbegin(), all.rend());
    for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(entries[i]["top_logprobs"][k]["logprob"].get<double>(), all[k], 2e-3);
  }

  // Streamed: the chunks carry the same entries, in order, with their text.
  body["stream"] = true;
  auto s = Chat(port_, body);
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(LogprobsOf(s, true), entries);
}

TEST_F(AgentApi, LogprobsAreNullUnlessAskedAndTopLogprobsIsValidated) {
  json body = {{"messages", UserTurn("Hello")}, {"max_tokens", 6}, {"seed", 1}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(r.Json()["choices"][0]["logprobs"].is_null());
  auto refused = [&](json extra, const std::string& param) {
    json b = body;
    b.update(extra);
    auto resp = Chat(port_, b);
    EXPECT_EQ(resp.status, 400) << b.dump();
    EXPECT_EQ(resp.Json()["error"]["param"], param) << resp.body;
    EXPECT_EQ(resp.Json()["error"]["type"], "invalid_request_error");
  };
  refused({{"top_logprobs", 2}}, "top_logprobs");
  refused({{"logprobs", false}, {"top_logprobs", 2}}, "top_logprobs");
  refused({{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs");
  refused({{"logprobs", true}, {"top_logprobs", -1}}, "top_logprobs");
  refused({{"logprobs", true}, {"top_logprobs", 1.5}}, "top_logprobs");
  refused({{"logprobs", "yes"}}, "logprobs");
  body["logprobs"] = true;  // top_logprobs absent: no alternatives
  auto plain = Chat(port_, body);
  ASSERT_EQ(plain.status, 200);
  // Held in a variable: a range-for over a member of the temporary Json()
  // would iterate freed memory (AddressSanitizer found it).
  const auto answer = plain.Json();
  const auto& entries = answer["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(entries.empty());
  for (const auto& e : entries) EXPECT_TRUE(e["top_logprobs"].empty());
}

const char* kReportSchema = R"({"$defs":{"Level":{"type":"string","enum":["low","high"]}},
  "type":"object","additionalProperties":false,"required":["title","level","count","note"],
  "properties":{"title":{"type":"string","minLength":2,"maxLength":8},"level":{"$ref":"#/$defs/Level"},
    "count":{"type":"integer","minimum":3,"maximum":40},"note":{"anyOf":[{"type":"string","maxLength":4},{"type":"null"}]}}})";

TEST_F(AgentApi, JsonSchemaAnswersSatisfyTheSchemaStreamedOrNot) {
  const json schema = json::parse(kReportSchema);
  json body = {{"messages", UserTurn("Report")},
               {"response_format", {{"type", "json_schema"},
                                    {"json_schema", {{"name", "report"}, {"strict", true}, {"schema", schema}}}}},
               {"max_tokens", 200}};
  for (int seed : {1, 2, 3}) {
    body["seed"] = seed;
    body.erase("stream");
    auto r = Chat(port_, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json choice = r.Json()["choices"][0];
    ASSERT_EQ(choice["finish_reason"], "stop") << r.body;
    const std::string content = choice["message"]["content"];
    auto value = nlohmann::ordered_json::parse(content, nullptr, false);
    ASSERT_TRUE(value.is_object()) << content;
    auto ok = engine::CheckAgainstSchema(value, nlohmann::ordered_json::parse(kReportSchema));
    EXPECT_TRUE(ok.has_value()) << content << ": " << (ok ? "" : ok.error().message());
    body["stream"] = true;
    auto s = Chat(port_, body);
    ASSERT_EQ(s.status, 200);
    std::string streamed;
    for (const auto& e : s.Events()) {
      if (e == "[DONE]") continue;
      const json chunk = json::parse(e);
      for (const auto& ch : chunk["choices"])
        if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
    }
    EXPECT_EQ(streamed, content);
  }
}

TEST_F(AgentApi, StrictSchemasWithKeywordsNotEnforcedAre400NamingThem) {
  json schema = json::parse(kReportSchema);
  schema["properties"]["title"]["format"] = "hostname";
  json body = {{"messages", UserTurn("Report")},
               {"response_format", {{"type", "json_schema"},
                                    {"json_schema", {{"name", "report"}, {"strict", true}, {"schema", schema}}}}}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "response_format.json_schema.schema");
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("$.properties.title.format"), std::string::npos)
      << r.body;
  // Not strict: the keyword is passed over and the rest is enforced.
  body["response_format"]["json_schema"]["strict"] = false;
  body["max_tokens"] = 200;
  body["seed"] = 4;
  auto loose = Chat(port_, body);
  ASSERT_EQ(loose.status, 200) << loose.body;
  // A strict tool: the same refusal, whatever tool_choice is.
  json tool = kCalculator;
  tool["function"]["strict"] = true;
  tool["function"]["parameters"]["properties"]["expression"]["format"] = "math";
  auto t = Chat(port_, {{"messages", UserTurn("x")}, {"tools", json::array({tool})}});
  ASSERT_EQ(t.status, 400) << t.body;
  EXPECT_EQ(t.Json()["error"]["param"], "tools[0].function.parameters");
  EXPECT_NE(t.Json()["error"]["message"].get<std::string>().find("format"), std::string::npos) << t.body;
  // A schema no value satisfies: 400 naming the field, strict or not.
  json impossible = {{"type", "object"},
                     {"properties", {{"n", {{"type", "integer"}, {"minimum", 0.2}, {"maximum", 0.8}}}}}};
  auto none = Chat(port_, {{"messages", UserTurn("x")},
                           {"response_format", {{"type", "json_schema"},
                                                {"json_schema", {{"name", "n"}, {"schema", impossible}}}}}});
  ASSERT_EQ(none.status, 400) << none.body;
  EXPECT_EQ(none.Json()["error"]["param"], "response_format.json_schema.schema");
}

TEST_F(AgentApi, StrictToolArgumentsSatisfyTheNewKeywords) {
  json tool = {{"type", "function"},
               {"function", {{"name", "report"}, {"strict", true}, {"parameters", json::parse(kReportSchema)}}}};
  json body = {{"messages", UserTurn("x")},
               {"tools", json::array({tool})},
               {"tool_choice", "required"},
               {"parallel_tool_calls", false},
               {"max_tokens", 300},
               {"seed", 8}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json call = r.Json()["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "report");
  auto args = nlohmann::ordered_json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  auto ok = engine::CheckAgainstSchema(args, nlohmann::ordered_json::parse(kReportSchema));
  EXPECT_TRUE(ok.has_value()) << call.dump() << ": " << (ok ? "" : ok.error().message());
}

}  // namespace
}  // namespace moeserve::daemon::testing
