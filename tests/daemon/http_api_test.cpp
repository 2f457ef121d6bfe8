// daemon.http_api: the endpoints and every error of api.md's table, through
// real HTTP on loopback against the tiny model.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "moeserve/daemon/metrics.hpp"

namespace moeserve::daemon::testing {
namespace {

class HttpApi : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    std::string keys = ::testing::TempDir() + "/moe_keys_" + std::to_string(::getpid()) + ".yaml";
    std::ofstream(keys) << "keys:\n  - key: sk-test-1\n    tenant: acme\n  - sha256: "
                        << "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n    tenant: empty\n"
                        << "  - key: sk-admin-1\n    tenant: ops\n    role: admin\n";
    auto c = TestConfig();
    c.api_keys_file = keys;
    c.max_body_bytes = 1 << 20;
    StartShared(c);
  }
  static std::map<std::string, std::string> Auth() { return {{"Authorization", "Bearer sk-test-1"}}; }
  static json Error(const HttpResponse& r) {
    auto j = r.Json();
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r.body;
    return j.is_object() && j.contains("error") ? j["error"] : json::object();
  }
};

TEST_F(HttpApi, HealthReadyModels) {
  auto h = Http(port_, "GET", "/healthz");
  EXPECT_EQ(h.status, 200);
  auto r = Http(port_, "GET", "/readyz");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["status"], "ready");
  auto m = Http(port_, "GET", "/v1/models", "", Auth());
  ASSERT_EQ(m.status, 200);
  auto j = m.Json();
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 4096);
  EXPECT_TRUE(j["data"][0].contains("owned_by"));
}

TEST_F(HttpApi, ReadinessReportsAPullInProgress) {
  daemon_->readiness().Set("pulling", "3 of 7 files");
  auto r = Http(port_, "GET", "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.Json()["status"], "pulling");
  EXPECT_EQ(r.Json()["detail"], "3 of 7 files");
  daemon_->readiness().Set("ready");
  EXPECT_EQ(Http(port_, "GET", "/readyz").status, 200);
}

TEST_F(HttpApi, ApiKeys) {
  json body = {{"messages", UserTurn("hi")}, {"max_tokens", 2}};
  auto none = Chat(port_, body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(Error(none)["code"], "invalid_api_key");
  auto wrong = Chat(port_, body, {{"Authorization", "Bearer sk-nope"}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(Http(port_, "GET", "/v1/models").status, 401);
  auto ok = Chat(port_, body, Auth());
  EXPECT_EQ(ok.status, 200) << ok.body;
  // A key listed only by its hash (sha256 of the empty string is never a valid
  // bearer token, so it must still be refused).
  EXPECT_EQ(Chat(port_, body, {{"Authorization", "Bearer "}}).status, 401);
}

TEST_F(HttpApi, EveryClientErrorHasItsStatusCodeAndParam) {
  struct Case {
    std::string body;
    int status;
    std::string code;
    std::string param;  // "" = don't care
  };
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  std::vector<Case> cases = {
      {"not json", 400, "invalid_request_error", ""},
      {"{\"messages\": [", 400, "invalid_request_error", ""},
      {"{}", 400, "invalid_request_error", "messages"},
      {R"({"messages":{}})", 400, "invalid_request_error", "messages"},
      {R"({"messages":[]})", 400, "invalid_request_error", "messages"},
      {R"({"messages":[{"role":"user"}]})", 400, "invalid_request_error", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"a"}],"max_tokens":-1})", 400, "invalid_request_error", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"a"}],"temperature":"hot"})", 400, "invalid_request_error", "temperature"},
      {R"({"messages":[{"role":"user","content":"a"}],"stop":[1]})", 400, "invalid_request_error", "stop[0]"},
      {R"({"messages":[{"role":"user","content":"a"}],"tool_choice":"always",)" + tools + "}", 400, "invalid_request_error", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"a"}],"thinking_budget":-5})", 400, "invalid_request_error", "thinking_budget"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"system","content":"late"}]})", 400, "invalid_request_error", "messages[1]"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"call_x","content":"1"}]})", 400,
       "invalid_tool_history", "messages[1].tool_call_id"},
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"user","content":"b"}]})",
       400, "invalid_tool_history", "messages[1].tool_calls[0]"},
      {R"({"model":"gpt-9","messages":[{"role":"user","content":"a"}]})", 404, "model_not_found", "model"},
      {R"({"messages":[{"role":"user","content":"a"}],"max_tokens":5000})", 400, "context_length_exceeded", ""},
      {R"({"messages":[{"role":"user","content":")" + std::string(5000, 'x') + R"("}]})", 400, "context_length_exceeded", ""},
  };
  for (const auto& c : cases) {
    auto r = Http(port_, "POST", "/v1/chat/completions", c.body, Auth());
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 200) << " -> " << r.body;
    auto e = Error(r);
    EXPECT_EQ(e["code"], c.code) << c.body.substr(0, 200);
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_TRUE(e.contains("type") && e.contains("param"));
    if (!c.param.empty()) {
      EXPECT_EQ(e["param"], c.param) << c.body.substr(0, 200);
    }
    if (c.status == 400 || c.status == 404) {
      EXPECT_EQ(e["type"], "invalid_request_error");
    }
  }
  EXPECT_EQ(Http(port_, "GET", "/v1/chat/completions").status, 405);
  EXPECT_EQ(Http(port_, "GET", "/nope").status, 404);
  auto big = Http(port_, "POST", "/v1/chat/completions", std::string(2 << 20, ' '), Auth());
  EXPECT_EQ(big.status, 413);
}

TEST_F(HttpApi, QueueFullAndDrainingAnswer503WithRetryAfter) {
  // A daemon of its own with room for one waiting sequence and one running.
  auto c = TestConfig();
  c.max_running = 1;
  c.max_queue = 1;
  auto d = StartDaemon(c);
  int port = PortOf(*d);
  json slow = {{"messages", UserTurn("count")}, {"max_tokens", 60}, {"thinking_budget", 0}, {"stream", true}};
  std::vector<std::thread> clients;
  std::vector<int> statuses(6);
  std::vector<bool> retry_after(6);
  for (int i = 0; i < 6; ++i)
    clients.emplace_back([&, i] {
      auto r = Chat(port, slow);
      statuses[i] = r.status;
      retry_after[i] = r.headers.contains("retry-after");
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < 6; ++i)
    if (statuses[i] == 503) {
      EXPECT_TRUE(retry_after[i]);
    }
  int unavailable = 0;
  for (int s : statuses) unavailable += s == 503;
  EXPECT_GE(unavailable, 1) << "6 clients at once never filled a queue of 1";

  std::thread shutdown([&] { d->Shutdown(5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto draining = Chat(port, {{"messages", UserTurn("hi")}, {"max_tokens", 1}});
  shutdown.join();
  if (draining.status != 0) {  // the listener may already be closed
    EXPECT_EQ(draining.status, 503);
    EXPECT_EQ(Error(draining)["code"], "unavailable");
    EXPECT_TRUE(draining.headers.contains("retry-after"));
  }
}

TEST_F(HttpApi, DisconnectedStreamIsCancelled) {
  // Greedy: a sampled end of turn could finish the answer before the client goes.
  json body = {{"messages", UserTurn("go on")}, {"max_tokens", 3000}, {"thinking_budget", 0}, {"stream", true},
               {"temperature", 0}};
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  std::string b = body.dump();
  SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-1\r\nContent-Type: application/json\r\nContent-Length: " +
                  std::to_string(b.size()) + "\r\n\r\n" + b);
  char buf[4096];
  std::string got;
  while (got.find("content") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ASSERT_EQ(daemon_->InFlight(), 1u);
  ::close(fd);
  // The next failed write cancels the sequence; give the scheduler time to run the steps.
  for (int i = 0; i < 600 && daemon_->InFlight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(daemon_->InFlight(), 0u) << "the sequence of a vanished client still runs";
  EXPECT_NE(daemon_->metrics().Scrape().find("moe_client_disconnects_total 1"), std::string::npos);
}

TEST_F(HttpApi, MetricsPassPromtool) {
  Chat(port_, {{"messages", UserTurn("metrics please")}, {"max_tokens", 3}}, Auth());
  // With keys configured, /metrics shows tenant names to admins (and the metrics token) only.
  EXPECT_EQ(Http(port_, "GET", "/metrics").status, 401);
  auto m = Http(port_, "GET", "/metrics", "", {{"Authorization", "Bearer sk-admin-1"}});
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.headers["content-type"].find("text/plain"), std::string::npos);
  for (const char* name : {"moe_requests_total", "moe_request_duration_seconds", "moe_time_to_first_token_seconds",
                           "moe_inter_token_latency_seconds", "moe_tokens_total", "moe_requests_running",
                           "moe_requests_waiting", "moe_kv_cache_usage_ratio", "moe_prefix_cache_hit_ratio",
                           "moe_expert_tokens_total", "moe_weights_bytes_pulled_total"}) {
    // (moe_cost_usd_total, moe_budget_remaining_ratio and moe_alert_deliveries_total
    // are registered but have no samples until the budgets work fills them.)
    EXPECT_NE(m.body.find(name), std::string::npos) << name;
  }
  EXPECT_NE(m.body.find("moe_tokens_total{kind=\"input\",tenant=\"acme\",tier=\"low\"}"), std::string::npos) << m.body;
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool not installed (scripts/setup installs it)";
  std::string file = ::testing::TempDir() + "/moe_metrics_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(file) << m.body;
  std::string cmd = "promtool check metrics < " + file + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace moeserve::daemon::testing
