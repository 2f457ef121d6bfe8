// daemon.session_gpt_oss: server-kept sessions on a real moe-daemon serving a
// tiny random gpt-oss checkpoint (gpt_oss_checkpoint.hpp). Turns with a tool
// call and its result, a turn carrying the client's own reasoning; each
// turn's prompt against the stateless endpoint's for the same whole
// conversation (harmony's rendering, reasoning before a final answer
// dropped), the prefix cache across turns, every entry stored
// (reasoning included) and counted in the family's tokens, compression at
// the point the harmony prompt passes the budget, the summary generated at
// `low`, and tenant isolation. The model's text is noise, so the checks are
// on what the daemon rendered, stored and reported. The summary generation's
// prompt and reader are checked directly on scripted output.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "gpt_oss_checkpoint.hpp"
#include "moeserve/chat/gpt_oss/gpt_oss_dialect.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/sessions/session_history.hpp"
#include "moeserve/engine/harmony.hpp"
#include "session_checks.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAcme = {{"Authorization", "Bearer sk-acme-0123456789"}};
const std::map<std::string, std::string> kOther = {{"Authorization", "Bearer sk-other-0123456789"}};

const json kWeatherTools = json::parse(R"([{"type":"function","function":{"name":"get_weather",
  "description":"Current weather.","parameters":{"type":"object","properties":{"city":{"type":"string",
  "enum":["Oslo","Rome"]}},"required":["city"],"additionalProperties":false}}}])");

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_sessions_gptoss_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

// A session as its client sees it: the whole conversation so far (what a
// stateless client would send) and the calls of the last answer still open.
struct Conversation {
  std::string id;
  json tools;
  json messages = json::array();
  json pending = json::array();
};

class SessionGptOss : public TinyGptOssSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TinyGptOssConfig(TinyGptOssDir(), "gpt-oss-tiny");
    c.max_context = 1024;
    c.cache_tokens = 1 << 14;
    c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-other-0123456789, tenant: other}
)");
    c.sessions.replica = "r1";
    c.sessions.summary_max_tokens = 32;
    StartSuite(c);
  }

  static Conversation Create(const json& body) {
    Conversation c;
    auto r = Http(port_, "POST", "/v1/sessions", body.dump(), kAcme);
    EXPECT_EQ(r.status, 200) << r.body;
    c.id = r.Json().value("id", "");
    c.tools = body.value("tools", json());
    if (body.contains("system")) c.messages.push_back({{"role", "system"}, {"content", body["system"]}});
    return c;
  }

  // A turn's new messages: the results of the last answer's calls first
  // (a random model may call a tool the turn did not ask for), then `messages`.
  static json NewMessages(const Conversation& c, const json& messages) {
    json sent = json::array();
    for (const auto& call : c.pending)
      sent.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "result of " + call["id"].get<std::string>()}});
    for (const auto& m : messages) sent.push_back(m);
    return sent;
  }

  // One turn of NewMessages; the answer joins the conversation. Returns the response body.
  static json Turn(Conversation& c, const json& messages, json fields) {
    const json sent = NewMessages(c, messages);
    fields["messages"] = sent;
    auto r = Http(port_, "POST", "/v1/sessions/" + c.id + "/chat/completions", fields.dump(), kAcme);
    EXPECT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    if (r.status != 200) return j;
    for (const auto& m : sent) c.messages.push_back(m);
    const json& answer = j["choices"][0]["message"];
    c.messages.push_back(answer);
    c.pending = answer.contains("tool_calls") && answer["tool_calls"].is_array() ? answer["tool_calls"] : json::array();
    return j;
  }

  // prompt_tokens of the same whole conversation sent to the stateless endpoint.
  static int Stateless(const json& messages, const json& tools, json fields) {
    fields["messages"] = messages;
    if (!tools.is_null()) fields["tools"] = tools;
    fields["max_tokens"] = 1;
    auto r = Chat(port_, fields, kAcme);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.Json()["usage"]["prompt_tokens"].get<int>() : -1;
  }

  static json Get(const std::string& id, bool full) {
    auto r = Http(port_, "GET", "/v1/sessions/" + id + (full ? "?full=1" : ""), "", kAcme);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json();
  }

  // Tokens a user message adds to a harmony prompt, by the renderer itself.
  static int64_t RenderedUserTokens(const std::string& text) {
    engine::HarmonySystemOptions s;
    std::vector<engine::ChatMessage> none, one = {{engine::ChatRole::kUser, text, std::nullopt, {}, ""}};
    auto a = engine::RenderHarmonyChat(*tok_, none, nullptr, s, false);
    auto b = engine::RenderHarmonyChat(*tok_, one, nullptr, s, false);
    EXPECT_TRUE(a && b);
    return a && b ? static_cast<int64_t>(b->size() - a->size()) : -1;
  }

};

TEST_F(SessionGptOss, ToolTurnsPromptAsTheStatelessEndpointAndStoreEverything) {
  Conversation c = Create({{"system", "You answer briefly."}, {"tools", kWeatherTools}, {"reasoning_effort", "medium"}});
  ASSERT_TRUE(c.id.starts_with("sess_r1_")) << c.id;

  // 1. A call the turn demands: the server writes its header, the model the arguments.
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  json first = Turn(c, json::array({{{"role", "user"}, {"content", "Weather in Oslo?"}}}),
                    {{"tool_choice", named}, {"max_tokens", 24}, {"seed", 2}});
  ASSERT_EQ(first["choices"][0]["finish_reason"], "tool_calls") << first;
  ASSERT_EQ(c.pending.size(), 1u);
  const std::string call_id = c.pending[0]["id"];
  const int p1 = first["usage"]["prompt_tokens"];
  json history = c.messages;
  history.erase(history.size() - 1);  // the answer is not part of its own prompt
  EXPECT_EQ(p1, Stateless(history, kWeatherTools, {{"tool_choice", named}, {"reasoning_effort", "medium"}}))
      << "the first turn's prompt is the stateless one's";

  // 2. The result: the history comes back from the prefix cache.
  json second = Turn(c, json::array(), {{"max_tokens", 4}, {"seed", 1}});
  ASSERT_TRUE(second.contains("usage")) << second;
  EXPECT_GT(second["usage"]["prompt_tokens"].get<int>(), p1);
  // The cache keeps the first prompt's whole 16-token blocks (its last token is always computed).
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), (p1 - 1) / 16 * 16) << second;
  history = c.messages;
  history.erase(history.size() - 1);
  EXPECT_EQ(second["usage"]["prompt_tokens"], Stateless(history, kWeatherTools, {{"reasoning_effort", "medium"}}));

  // 3. The client's own assistant message with reasoning before a final
  // answer: stored, but harmony leaves that reasoning out of the prompt.
  const std::string thought = "The user asks about Rome; the weather there is mild in spring, so I say so.";
  json third = Turn(c,
                    json::array({{{"role", "user"}, {"content", "And Rome?"}},
                                 {{"role", "assistant"}, {"content", "Mild."}, {"reasoning_content", thought}},
                                 {{"role", "user"}, {"content", "Thanks."}}}),
                    {{"max_tokens", 4}, {"seed", 3}});
  ASSERT_TRUE(third.contains("usage")) << third;
  history = c.messages;
  history.erase(history.size() - 1);
  const int p3 = third["usage"]["prompt_tokens"];
  EXPECT_EQ(p3, Stateless(history, kWeatherTools, {{"reasoning_effort", "medium"}}));
  json without = history;
  for (auto& m : without)
    if (m.contains("reasoning_content") && m["reasoning_content"] == thought) m.erase("reasoning_content");
  EXPECT_EQ(p3, Stateless(without, kWeatherTools, {{"reasoning_effort", "medium"}}))
      << "reasoning before a final answer is not rendered";
  EXPECT_GT(third["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << third;

  // The session holds every entry, the reasoning included, each counted in
  // harmony's tokens (not bytes).
  const json full = Get(c.id, true)["entries"];
  std::set<std::string> kinds;
  bool saw_thought = false, saw_call = false, saw_result = false;
  for (const auto& e : full) {
    kinds.insert(e["kind"].get<std::string>());
    EXPECT_GT(e["tokens"].get<int64_t>(), 0) << e;
    if (e["kind"] == "reasoning" && e["content"] == thought) saw_thought = true;
    if (e["kind"] == "tool_call" && e["tool_call"]["id"] == call_id) {
      saw_call = true;
      EXPECT_EQ(e["tool_call"]["function"]["name"], "get_weather");
    }
    if (e["kind"] == "tool_result" && e["tool_call_id"] == call_id) saw_result = true;
    if (e["kind"] == "text" && e["role"] == "user" && e["content"] == "Weather in Oslo?") {
      EXPECT_EQ(e["tokens"], RenderedUserTokens("Weather in Oslo?")) << e;
    }
  }
  EXPECT_TRUE(saw_thought && saw_call && saw_result) << full.dump();
  for (const char* k : {"text", "reasoning", "tool_call", "tool_result"}) EXPECT_TRUE(kinds.contains(k)) << k;
  EXPECT_EQ(ToolChainProblem(full), "");
  // Without ?full=1 the same entries (nothing was compressed).
  EXPECT_EQ(Get(c.id, false)["entries"].size(), full.size());

  // Another tenant's key finds no such session.
  for (auto [method, path] : {std::pair<std::string, std::string>{"GET", "/v1/sessions/" + c.id},
                              {"POST", "/v1/sessions/" + c.id + "/chat/completions"},
                              {"DELETE", "/v1/sessions/" + c.id}}) {
    auto r = Http(port_, method, path, method == "POST" ? R"({"messages":[{"role":"user","content":"hi"}]})" : "",
                  kOther);
    EXPECT_EQ(r.status, 404) << method << " " << r.body;
    EXPECT_EQ(r.Json()["error"]["code"], "session_not_found") << r.body;
  }
  EXPECT_EQ(Get(c.id, false)["entries"].size(), full.size());
}

// Compression starts exactly when the harmony prompt of the whole
// conversation passes the budget (a count in bytes would start it earlier),
// keeps the compressed prompt within it, and the model's summary runs at
// `low` on the gpt-oss backend.
TEST_F(SessionGptOss, CompressionFollowsTheHarmonyCountAndSummarisesAtLow) {
  constexpr int kBudget = 300, kAnswer = 4;
  Conversation c = Create({{"system", "You are terse."},
                           {"reasoning_effort", "medium"},
                           {"context_policy", {{"max_context_tokens", kBudget}, {"keep_recent_exchanges", 1}}}});
  auto low_requests = [] {
    const json usage = Http(port_, "GET", "/v1/usage", "", kAcme).Json();  // held: rows are read from it
    int64_t n = 0;
    for (const auto& row : usage["data"])
      if (row["tenant"] == "acme" && row["tier"] == "low" && row["period"] == "day") n += row["requests"].get<int64_t>();
    return n;
  };
  const int64_t low_before = low_requests();
  bool compressed = false;
  for (int turn = 0; turn < 16 && !compressed; ++turn) {
    const json user = {{"role", "user"},
                       {"content", "Note " + std::to_string(turn) + ": the parcel for order " +
                                       std::to_string(1000 + turn) + " leaves the depot on day " +
                                       std::to_string(turn + 3) + "."}};
    json whole = c.messages;
    for (const auto& m : NewMessages(c, json::array({user}))) whole.push_back(m);
    const int uncompressed = Stateless(whole, nullptr, {{"reasoning_effort", "medium"}});
    json r = Turn(c, json::array({user}), {{"max_tokens", kAnswer}, {"seed", turn}});
    ASSERT_TRUE(r.contains("usage")) << r;
    const json entries = Get(c.id, false)["entries"];
    for (const auto& e : entries) compressed = compressed || e["kind"] == "summary";
    if (!compressed) {
      EXPECT_LE(uncompressed, kBudget - kAnswer) << "turn " << turn << " fit but nothing was compressed?";
      EXPECT_EQ(r["usage"]["prompt_tokens"], uncompressed) << "turn " << turn;
    } else {
      EXPECT_GT(uncompressed, kBudget - kAnswer) << "turn " << turn << " was compressed while it fit the budget";
      EXPECT_LE(r["usage"]["prompt_tokens"].get<int>(), kBudget - kAnswer) << r;
    }
  }
  ASSERT_TRUE(compressed) << "16 turns never passed a " << kBudget << "-token budget";

  const json full = Get(c.id, true)["entries"];
  int summaries = 0;
  for (const auto& e : full) {
    if (e["kind"] != "summary") continue;
    ++summaries;
    EXPECT_EQ(e["role"], "system");
    ASSERT_TRUE(e["replaces"].is_array() && e["replaces"].size() == 2u) << e;
    EXPECT_GE(e["replaces"][0].get<int64_t>(), 2) << "the system prompt is never replaced";
    EXPECT_LE(e["replaces"][0].get<int64_t>(), e["replaces"][1].get<int64_t>()) << e;
  }
  EXPECT_EQ(summaries, 1);
  EXPECT_EQ(SummaryProblem(full), "") << full.dump();

  // The model's summary is generated (and charged) at `low` after the turn;
  // the turns themselves ran at `medium`.
  int64_t low_after = low_before;
  for (int i = 0; i < 1200 && low_after == low_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    low_after = low_requests();
  }
  EXPECT_EQ(low_after, low_before + 1) << "no low-tier summary generation was charged: "
                                       << Http(port_, "GET", "/v1/usage", "", kAcme).body;
  // Held: a range-for over a member of a temporary would read freed memory.
  const json session = Get(c.id, false);
  for (const auto& e : session["entries"]) {
    if (e["kind"] == "summary") {
      EXPECT_TRUE(e["author"] == "extractive" || e["author"] == "model") << e;
    }
  }
}

// The gpt-oss summary generation, without the model: its prompt is harmony
// at low effort with the fixed instruction, it stops on harmony's stop
// tokens, and its reader keeps the final channel's text, not the analysis.
TEST_F(SessionGptOss, SummaryGenerationIsHarmonyAtLowAndReadsTheFinalChannel) {
  auto serving = std::make_shared<HarmonyServing>();
  serving->tokenizer = tok_;
  auto tokens = engine::HarmonyTokens::From(*tok_);
  ASSERT_TRUE(tokens) << tokens.error().ToString();
  serving->tokens = *tokens;
  auto model = chat::MakeGptOssDialect(serving, ReasoningEffort::kHigh);

  std::vector<engine::ChatMessage> messages = {
      {engine::ChatRole::kSystem, std::string(SummarizationPrompt()), std::nullopt, {}, ""},
      {engine::ChatRole::kUser, "user: hello\nassistant: hi", std::nullopt, {}, ""}};
  auto g = model->SummaryRequest(messages, 40, 8, 5);
  ASSERT_TRUE(g);
  const std::string text = tok_->Decode(g->prompt);
  EXPECT_NE(text.find("Reasoning: low"), std::string::npos) << text;
  EXPECT_NE(text.find(std::string(SummarizationPrompt())), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("<|start|>assistant")) << text;
  EXPECT_EQ(g->stop_tokens, engine::HarmonyStopTokens(*tokens));
  EXPECT_FALSE(g->starts_in_reasoning);
  EXPECT_EQ(g->max_tokens, 40);
  EXPECT_EQ(g->thinking_budget, 8);
  EXPECT_EQ(g->sampling.temperature, 0.0f);

  auto reader = model->MakeSummaryReader();
  auto ids = tok_->Encode(
      "<|channel|>analysis<|message|>Keep it short.<|end|><|start|>assistant<|channel|>final<|message|>"
      "The user greeted; nothing is open.<|return|>",
      engine::AddedTokenText::kMatchAll);
  ASSERT_TRUE(ids);
  for (int id : *ids) (void)reader->OnToken(id, false);
  (void)reader->Finish();
  EXPECT_EQ(reader->content(), "The user greeted; nothing is open.");
  EXPECT_EQ(reader->reasoning(), "Keep it short.");
  EXPECT_EQ(reader->FormatFault(), "");

  // Output that breaks the format is reported, so the session keeps the extractive summary.
  auto broken = model->MakeSummaryReader();
  auto bad = tok_->Encode("<|message|>text", engine::AddedTokenText::kMatchAll);
  ASSERT_TRUE(bad);
  for (int id : *bad) (void)broken->OnToken(id, false);
  (void)broken->Finish();
  EXPECT_NE(broken->FormatFault(), "");

  // An entry counts in the family's tokens: a user entry adds what the renderer adds.
  SessionEntry e;
  e.role = engine::ChatRole::kUser;
  e.kind = EntryKind::kText;
  e.content = "Weather in Oslo, please, and be quick about it.";
  EXPECT_EQ(model->EntryTokens(TranscriptOf(e)), RenderedUserTokens(e.content));
  EXPECT_LT(model->EntryTokens(TranscriptOf(e)), ByteEntryTokens(e));
}

}  // namespace
}  // namespace moeserve::daemon::testing
