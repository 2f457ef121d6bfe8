// daemon.session_api: server-kept sessions through the HTTP API on the tiny
// model: the lifecycle, charging, the prefix cache across turns, tenant
// isolation, concurrent turns, the storage quota, idle expiry and hostile
// input. (The context policy over many turns: daemon.session_compression.)
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "long_stream.hpp"
#include "session_checks.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAcme = {{"Authorization", "Bearer sk-acme-0123456789"}};
const std::map<std::string, std::string> kOther = {{"Authorization", "Bearer sk-other-0123456789"}};
constexpr int64_t kQuota = 256 << 10;

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

class SessionApi : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-other-0123456789, tenant: other}
)");
    c.sessions.tenant_quota_bytes = kQuota;
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

TEST_F(SessionApi, CreateTurnGetDelete) {
  const std::string id = Create({{"system", "You are terse."}, {"tools", kTools}, {"metadata", {{"task", "t1"}}}});
  EXPECT_TRUE(id.starts_with("sess_r1_")) << id;
  json s = Get(id);
  EXPECT_EQ(s["object"], "session");
  EXPECT_EQ(s["metadata"]["task"], "t1");
  ASSERT_EQ(s["entries"].size(), 1u);
  EXPECT_EQ(s["entries"][0]["role"], "system");
  EXPECT_EQ(s["entries"][0]["kind"], "text");

  auto usage_before = Http(port_, "GET", "/v1/usage", "", kAcme).Json();
  auto r = Turn(id, {{"messages", UserTurn("look up the weather")}, {"tool_choice", "required"}, {"max_tokens", 200}});
  ASSERT_EQ(r.status, 200) << r.body;
  json answer = r.Json()["choices"][0]["message"];
  ASSERT_TRUE(answer.contains("tool_calls"));
  // The stored turn is what the client saw: the user entry, then the answer's entries.
  s = Get(id);
  ASSERT_GE(s["entries"].size(), 4u);
  EXPECT_EQ(s["entries"][1]["content"], "look up the weather");
  std::vector<std::string> stored_calls;
  for (const auto& e : s["entries"]) {
    EXPECT_TRUE(e.contains("seq") && e.contains("created_at") && e.contains("tokens")) << e.dump();
    if (e["kind"] == "tool_call") stored_calls.push_back(e["tool_call"]["id"]);
  }
  ASSERT_EQ(stored_calls.size(), answer["tool_calls"].size());
  for (size_t i = 0; i < stored_calls.size(); ++i) EXPECT_EQ(stored_calls[i], answer["tool_calls"][i]["id"]);

  // The next turn answers the calls by id; a streamed turn ends with [DONE].
  json results = json::array();
  for (const auto& c : answer["tool_calls"])
    results.push_back({{"role", "tool"}, {"tool_call_id", c["id"]}, {"content", "sunny"}});
  auto streamed = Turn(id, {{"messages", results}, {"tool_choice", "none"}, {"max_tokens", 12}, {"stream", true}});
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  auto events = streamed.Events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content, reasoning;
  for (const auto& ev : events) {
    if (ev == "[DONE]") continue;
    const json chunk = json::parse(ev);
    for (const auto& c : chunk["choices"]) {
      content += c["delta"].value("content", "");
      reasoning += c["delta"].value("reasoning_content", "");
    }
  }
  s = Get(id);
  EXPECT_EQ(ToolChainProblem(s["entries"]), "");
  const json& last = s["entries"].back();
  EXPECT_EQ(last["role"], "assistant");
  if (last["kind"] == "text") {
    EXPECT_EQ(last["content"], content) << "the stored answer is the streamed one";
  }

  // Turns are charged like stateless requests.
  auto usage_after = Http(port_, "GET", "/v1/usage", "", kAcme).Json();
  auto requests = [](const json& u) {
    int64_t n = 0;
    for (const auto& row : u["data"])
      if (row["period"] == "day") n += row["requests"].get<int64_t>();
    return n;
  };
  EXPECT_EQ(requests(usage_after), requests(usage_before) + 2);

  auto d = Http(port_, "DELETE", "/v1/sessions/" + id, "", kAcme);
  EXPECT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.Json()["deleted"], true);
  EXPECT_EQ(Http(port_, "GET", "/v1/sessions/" + id, "", kAcme).status, 404);
  EXPECT_EQ(Http(port_, "DELETE", "/v1/sessions/" + id, "", kAcme).status, 404);
}

TEST_F(SessionApi, EachTurnIsServedFromTheCacheUpToItsNewTokens) {
  const std::string id = Create({{"system", "You are a patient assistant with a long system prompt."}});
  int64_t last_prompt = 0;
  for (int turn = 0; turn < 4; ++turn) {
    auto r = Turn(
        id, {{"messages", UserTurn("question " + std::to_string(turn) + " about the weather")}, {"max_tokens", 8}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json usage = r.Json()["usage"];
    const int64_t prompt = usage["prompt_tokens"], cached = usage["prompt_tokens_details"]["cached_tokens"];
    // The last turn's prompt was cached up to its last whole block (16 tokens).
    if (turn > 0) {
      EXPECT_GE(cached, (last_prompt - 1) / 16 * 16) << "turn " << turn;
    }
    EXPECT_GT(prompt, last_prompt);
    last_prompt = prompt;
  }
}

TEST_F(SessionApi, AnotherTenantsSessionIsNotFound) {
  const std::string id = Create({{"system", "mine"}});
  for (const auto& [method, path, body] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/v1/sessions/" + id, ""},
           {"GET", "/v1/sessions/" + id + "?full=1", ""},
           {"DELETE", "/v1/sessions/" + id, ""},
           {"POST", "/v1/sessions/" + id + "/chat/completions", json{{"messages", UserTurn("hi")}}.dump()}}) {
    auto r = Http(port_, method, path, body, kOther);
    EXPECT_EQ(r.status, 404) << method << " " << path << ": " << r.body;
    EXPECT_EQ(r.Json()["error"]["code"], "session_not_found");
  }
  EXPECT_EQ(Get(id)["entries"].size(), 1u) << "the owner's session is untouched";
  EXPECT_EQ(Http(port_, "GET", "/v1/sessions/" + id).status, 401) << "no key";
}

TEST_F(SessionApi, ASecondTurnWhileOneRunsIsRefusedWith409) {
  // Summaries of earlier tests may still be written in the background.
  for (int i = 0; i < 1500 && daemon_->InFlight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string id = Create({{"system", "s"}});
  json body = {{"messages", UserTurn("write a long story")},
               {"max_tokens", 3000},
               {"thinking_budget", 0},
               {"stream", true},
               {"temperature", 1.0},
               {"response_format", LongAnswerFormat()}};  // a sampled end could finish the turn at once
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  std::string b = body.dump();
  SendAll(fd, "POST /v1/sessions/" + id +
                  "/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-acme-0123456789\r\n"
                  "Content-Type: application/json\r\nContent-Length: " +
                  std::to_string(b.size()) + "\r\n\r\n" + b);
  char buf[4096];
  std::string got;
  while (got.find("content") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ASSERT_EQ(daemon_->InFlight(), 1u) << "the first turn must still be running";
  auto second = Turn(id, {{"messages", UserTurn("and another")}, {"max_tokens", 4}});
  EXPECT_EQ(second.status, 409) << second.body;
  EXPECT_EQ(second.Json()["error"]["code"], "session_busy");
  EXPECT_EQ(Http(port_, "DELETE", "/v1/sessions/" + id, "", kAcme).status, 409) << "nor deleted meanwhile";
  // The first client hangs up: its turn is cancelled and never stored.
  ::close(fd);
  for (int i = 0; i < 600 && daemon_->InFlight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  HttpResponse third;
  for (int i = 0; i < 100; ++i) {  // the busy mark goes when the cancelled turn has ended
    third = Turn(id, {{"messages", UserTurn("and another")}, {"max_tokens", 4}});
    if (third.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(third.status, 200) << third.body;
  json entries = Get(id)["entries"];
  ASSERT_GE(entries.size(), 3u);
  EXPECT_EQ(entries[1]["content"], "and another") << "the cancelled turn left nothing behind: " << entries.dump();
}

TEST_F(SessionApi, StorageQuotaRefusesNewDataWithAClearError) {
  const std::string id = Create({{"system", "s"}}, kOther);
  auto r = Turn(id, {{"messages", UserTurn(std::string(kQuota, 'x'))}, {"max_tokens", 2}}, kOther);
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "session_quota_exceeded");
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("quota"), std::string::npos);
  auto c = Http(port_, "POST", "/v1/sessions", json{{"system", std::string(kQuota, 'y')}}.dump(), kOther);
  EXPECT_EQ(c.status, 403) << c.body;
  EXPECT_EQ(Turn(id, {{"messages", UserTurn("small")}, {"max_tokens", 2}}, kOther).status, 200)
      << "small turns still fit";
}

TEST_F(SessionApi, HostileInputGetsClear4xx) {
  const std::string id = Create({{"system", "s"}, {"tools", kTools}});
  struct Case {
    std::string method, path, body;
    int status;
    std::string code;
  };
  const std::string turn = "/v1/sessions/" + id + "/chat/completions";
  std::vector<Case> cases = {
      {"GET", "/v1/sessions/nope", "", 400, "invalid_session_id"},
      {"GET", "/v1/sessions/sess_r1_..%2f..%2fetc", "", 400, "invalid_session_id"},
      {"GET", "/v1/sessions/sess_R1_AAAAAAAAAAAAAAAAAAAAAAAA", "", 400, "invalid_session_id"},
      {"GET", "/v1/sessions/sess_r1_AAAAAAAAAAAAAAAAAAAAAAAA", "", 404, "session_not_found"},
      {"GET", "/v1/sessions/sess_elsewhere_AAAAAAAAAAAAAAAAAAAAAAAA", "", 404, "session_not_found"},
      {"POST", "/v1/sessions/sess_r1_AAAAAAAAAAAAAAAAAAAAAAAA/chat/completions",
       json{{"messages", UserTurn("x")}}.dump(), 404, "session_not_found"},
      {"GET", "/v1/sessions/" + id + "/entries", "", 404, "not_found"},
      {"PUT", "/v1/sessions/" + id, "", 405, "method_not_allowed"},
      {"GET", "/v1/sessions", "", 405, "method_not_allowed"},
      {"POST", "/v1/sessions", "[1,2]", 400, "invalid_request_error"},
      {"POST", "/v1/sessions", "{\"system\": 5}", 400, "invalid_request_error"},
      {"POST", "/v1/sessions", "{\"context_policy\": {\"max_context_tokens\": -1}}", 400, "invalid_request_error"},
      {"POST", "/v1/sessions", "{\"tools\": [{\"type\": \"function\"}]}", 400, "invalid_request_error"},
      {"POST", "/v1/sessions", "{\"model\": \"gpt-9\"}", 404, "model_not_found"},
      {"POST", turn, "not json", 400, "invalid_request_error"},
      {"POST", turn, "{}", 400, "invalid_request_error"},
      {"POST", turn, json{{"messages", json::array()}}.dump(), 400, "invalid_request_error"},
      {"POST", turn, json{{"messages", {{{"role", "system"}, {"content", "override"}}}}}.dump(), 400,
       "invalid_request_error"},
      {"POST", turn, json{{"messages", UserTurn("x")}, {"tools", kTools}}.dump(), 400, "invalid_request_error"},
      {"POST", turn, json{{"messages", {{{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "1"}}}}}.dump(), 400,
       "invalid_tool_history"},
      {"POST", turn, json{{"messages", UserTurn("x")}, {"max_tokens", 100000}}.dump(), 400, "context_length_exceeded"},
      {"POST", turn, std::string(9 << 20, ' '), 413, "invalid_request_error"},
  };
  for (const auto& c : cases) {
    auto r = Http(port_, c.method, c.path, c.body, kAcme);
    EXPECT_EQ(r.status, c.status) << c.method << " " << c.path << " " << c.body.substr(0, 80) << ": " << r.body;
    if (r.status == 413) continue;  // refused before the body: the head's answer
    json j = r.Json();
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["code"], c.code) << c.path << " " << c.body.substr(0, 80);
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  // A tool result naming an unknown call is reported in the turn's own terms.
  auto r =
      Http(port_, "POST", turn,
           json{{"messages",
                 {{{"role", "user"}, {"content", "a"}}, {{"role", "tool"}, {"tool_call_id", "zz"}, {"content", "1"}}}}}
               .dump(),
           kAcme);
  EXPECT_EQ(r.Json()["error"]["param"], "messages[1].tool_call_id") << r.body;
  EXPECT_EQ(Get(id)["entries"].size(), 1u) << "refused turns store nothing";
}

TEST(SessionExpiry, IdleSessionsExpire) {
  DaemonConfig c = TestConfig();
  c.sessions.idle_seconds = 1;
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const int port = PortOf(*d);
  auto r = Http(port, "POST", "/v1/sessions", "{}");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id = r.Json()["id"];
  EXPECT_EQ(Http(port, "GET", "/v1/sessions/" + id).status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  auto gone = Http(port, "GET", "/v1/sessions/" + id);
  EXPECT_EQ(gone.status, 404) << gone.body;
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
