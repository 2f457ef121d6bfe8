// daemon.session_compression: a 30-turn tool-calling session on the tiny
// model that overflows a small context: summaries appear with correct
// `replaces` ranges, no tool chain is ever split (checked on every turn),
// ?full=1 keeps every original, and the model writes summaries after the
// turns that needed them.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "session_checks.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAcme = {{"Authorization", "Bearer sk-acme-0123456789"}};

const json kTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "lookup"},
        {"parameters", {{"type", "object"}, {"properties", {{"q", {{"type", "string"}}}}}, {"required", {"q"}}}}}}}});

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_sessions_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

class SessionCompression : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
)");
    c.sessions.replica = "r1";
    c.sessions.summary_max_tokens = 64;
    StartShared(c);
  }
  static std::string Create(const json& body, const std::map<std::string, std::string>& key = kAcme) {
    auto r = Http(port_, "POST", "/v1/sessions", body.dump(), key);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json().value("id", "");
  }
  static HttpResponse Turn(const std::string& id, const json& body,
                           const std::map<std::string, std::string>& key = kAcme) {
    return Http(port_, "POST", "/v1/sessions/" + id + "/chat/completions", body.dump(), key);
  }
  static json Get(const std::string& id, bool full = false) {
    auto r = Http(port_, "GET", "/v1/sessions/" + id + (full ? "?full=1" : ""), "", kAcme);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json();
  }
};

TEST_F(SessionCompression, ThirtyToolTurnsOverflowASmallContextIntoSummaries) {
  const std::string id = Create({{"system", "You call tools."},
                                 {"tools", kTools},
                                 {"context_policy", {{"max_context_tokens", 1200}, {"keep_recent_exchanges", 2}}}});
  std::vector<std::string> users;
  json pending = json::array();  // the last answer's calls
  int summaries_seen = 0, calls_made = 0;
  for (int turn = 0; turn < 30; ++turn) {
    json messages = json::array();
    for (const auto& c : pending) {
      messages.push_back(
          {{"role", "tool"}, {"tool_call_id", c["id"]}, {"content", "result of " + c["id"].get<std::string>()}});
    }
    // Every other turn a new exchange: a user message after the results.
    if (turn % 2 == 0) {
      users.push_back("step " + std::to_string(turn) + ": find item " + std::to_string(turn * 7));
      messages.push_back({{"role", "user"}, {"content", users.back()}});
    }
    json body = {{"messages", messages}, {"max_tokens", 160}, {"seed", turn}};
    body["tool_choice"] = turn % 2 == 0 ? "required" : "none";
    if (turn % 2 == 1) body["max_tokens"] = 24;
    auto r = Turn(id, body);
    ASSERT_EQ(r.status, 200) << "turn " << turn << ": " << r.body;
    json message = r.Json()["choices"][0]["message"];
    pending = message.value("tool_calls", json::array());
    calls_made += static_cast<int>(pending.size());

    json view = Get(id);
    EXPECT_EQ(ToolChainProblem(view["entries"]), "") << "turn " << turn;
    json full = Get(id, true)["entries"];
    EXPECT_EQ(SummaryProblem(full), "") << "turn " << turn;
    for (const auto& e : view["entries"]) summaries_seen += e["kind"] == "summary" ? 1 : 0;
    // The view the model sees fits the policy's budget (the answer's room apart).
    int64_t tokens = 0;
    for (const auto& e : view["entries"]) tokens += e["tokens"].get<int64_t>();
    EXPECT_LE(tokens, 1200) << "turn " << turn;
  }
  EXPECT_GT(summaries_seen, 0) << "30 turns in 1200 tokens must have been compressed";
  EXPECT_GT(calls_made, 10);

  // ?full=1 keeps every original: each user message and call, in order, once.
  json full = Get(id, true)["entries"];
  std::vector<std::string> stored_users;
  int stored_calls = 0, summaries = 0, active_summaries = 0;
  int64_t last_seq = 0;
  for (const auto& e : full) {
    EXPECT_GT(e["seq"].get<int64_t>(), last_seq);
    last_seq = e["seq"];
    if (e["kind"] == "text" && e["role"] == "user") stored_users.push_back(e["content"]);
    if (e["kind"] == "tool_call") ++stored_calls;
    if (e["kind"] == "summary") {
      ++summaries;
      active_summaries += e.contains("replaced_by") ? 0 : 1;
      EXPECT_LE(e["replaces"][0].get<int64_t>(), e["replaces"][1].get<int64_t>());
      EXPECT_TRUE(e["author"] == "extractive" || e["author"] == "model");
    }
  }
  EXPECT_EQ(stored_users, users);
  EXPECT_EQ(stored_calls, calls_made);
  EXPECT_GT(summaries, 0);
  EXPECT_EQ(active_summaries, 1) << "each new summary takes in the one before";
  // The model writes summaries after the turns that needed them: once it is
  // idle, the active summary is the model's (shorter than what it replaces),
  // with the same range.
  for (int i = 0; i < 1500 && daemon_->InFlight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  json settled = Get(id, true)["entries"];
  int model_written = 0;
  for (const auto& e : settled) model_written += e["kind"] == "summary" && e["author"] == "model" ? 1 : 0;
  EXPECT_GT(model_written, 0) << settled.dump();
  EXPECT_EQ(SummaryProblem(settled), "");
  // The default view hides what the summaries replace, and keeps the system prompt first.
  json view = Get(id)["entries"];
  EXPECT_LT(view.size(), full.size());
  EXPECT_EQ(view[0]["role"], "system");
  EXPECT_EQ(view[0]["kind"], "text");
  EXPECT_EQ(view[1]["kind"], "summary");
}

}  // namespace
}  // namespace moeserve::daemon::testing
