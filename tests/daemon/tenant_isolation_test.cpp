// daemon.tenant_isolation: what tenants share in one daemon, over HTTP.
//  - The prefix cache is per tenant: a prompt tenant A sent shows as cached
//    to A's repeat, never to tenant B (cached_tokens would tell B what A
//    asked); only the configured public system prompt is shared.
//  - A `block` budget holds each request's worst case while it runs: eight
//    parallel requests end at most at the budget.
//  - A tenant's requests in flight are capped (429 too_many_concurrent_requests).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "long_stream.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAlpha = {{"Authorization", "Bearer sk-alpha-0123456789"}};
const std::map<std::string, std::string> kBeta = {{"Authorization", "Bearer sk-beta-0123456789"}};
const std::map<std::string, std::string> kThrift = {{"Authorization", "Bearer sk-thrift-0123456789"}};
const std::map<std::string, std::string> kSolo = {{"Authorization", "Bearer sk-solo-0123456789"}};
const std::map<std::string, std::string> kAdmin = {{"Authorization", "Bearer sk-admin-0123456789"}};

constexpr double kThriftBudgetUsd = 0.5;
const std::string kPublicPrompt =
    "You are the support assistant of the Example deployment. Answer briefly, politely and only about the product.";

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_isolation_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

int CachedTokens(const HttpResponse& r) { return r.Json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }

json Ask(json messages, int max_tokens = 2) {
  return {{"messages", std::move(messages)}, {"max_tokens", max_tokens}, {"seed", 5}};
}

json SystemAndUser(const std::string& system, const std::string& user) {
  return json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}});
}

double SpentUsd(int port, const std::string& tenant) {
  double usd = 0;
  const json usage = Http(port, "GET", "/v1/usage", "", kAdmin).Json();
  for (const auto& row : usage["data"])
    if (row["tenant"] == tenant && row["period"] == "day") usd += row["cost_usd"].get<double>();
  return usd;
}

class TenantIsolation : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-alpha-0123456789, tenant: alpha}
  - {key: sk-beta-0123456789, tenant: beta}
  - {key: sk-thrift-0123456789, tenant: thrift}
  - {key: sk-solo-0123456789, tenant: solo}
  - {key: sk-admin-0123456789, tenant: ops, role: admin}
)");
    auto parsed = ParseDaemonConfigYaml(R"(
public_system_prompt: ")" + kPublicPrompt + R"("
pricing:
  low:    {input: 1000, cachedInput: 100, output: 4000, reasoning: 4000}
budgets:
  - {tenant: thrift, period: day, limitUSD: 0.5, action: block}
)", "isolation.yaml", c);
    ASSERT_TRUE(parsed) << parsed.error().ToString();
    StartShared(*parsed);
  }
};

TEST_F(TenantIsolation, APromptCachedForOneTenantIsNotCachedForAnother) {
  ASSERT_NE(daemon_, nullptr);
  const json prompt = Ask(UserTurn("The merger with Initech closes on March 3rd; draft the memo to the board. "
                                   "Include the price of 41 dollars per share and the names of both negotiators."));
  auto first = Chat(port_, prompt, kAlpha);
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_GT(first.Json()["usage"]["prompt_tokens"].get<int>(), 48);  // several cache blocks long
  EXPECT_EQ(CachedTokens(first), 0);
  auto repeat = Chat(port_, prompt, kAlpha);
  ASSERT_EQ(repeat.status, 200) << repeat.body;
  EXPECT_GT(CachedTokens(repeat), 0) << "the tenant's own repeat still hits its cache";
  auto other = Chat(port_, prompt, kBeta);
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_EQ(CachedTokens(other), 0) << "another tenant must not see that this prompt was sent";
}

TEST_F(TenantIsolation, OnlyTheConfiguredPublicSystemPromptIsSharedAcrossTenants) {
  ASSERT_NE(daemon_, nullptr);
  auto a = Chat(port_, Ask(SystemAndUser(kPublicPrompt, "Where is my order 1177?")), kAlpha);
  ASSERT_EQ(a.status, 200) << a.body;
  auto b = Chat(port_, Ask(SystemAndUser(kPublicPrompt, "Can I return a gift?")), kBeta);
  ASSERT_EQ(b.status, 200) << b.body;
  const int shared = CachedTokens(b);
  EXPECT_GT(shared, 0) << "the public system prompt's state is shared";
  EXPECT_LT(shared, b.Json()["usage"]["prompt_tokens"].get<int>() - 8) << "but not alpha's question after it";

  // A tenant's own system prompt, however long, stays its own.
  const std::string own = kPublicPrompt + " Alpha's private escalation code is 7731-KESTREL.";
  ASSERT_EQ(Chat(port_, Ask(SystemAndUser(own, "status?")), kAlpha).status, 200);
  auto probe = Chat(port_, Ask(SystemAndUser(own, "status?")), kBeta);
  ASSERT_EQ(probe.status, 200) << probe.body;
  EXPECT_LE(CachedTokens(probe), shared) << "beta reuses at most the public prefix, never alpha's text";
}

TEST_F(TenantIsolation, ParallelRequestsEndAtMostAtABlockBudget) {
  ASSERT_NE(daemon_, nullptr);
  // Each request's prompt (~200 tokens at $1000 per million) costs about
  // $0.2: eight admitted together would spend about $1.6 of the $0.5.
  std::string filler;
  for (int i = 0; i < 8; ++i) filler += "ledger line " + std::to_string(i) + " ok. ";
  std::vector<HttpResponse> answers(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      // Distinct openings: no request is a cached prefix of another.
      answers[i] = Chat(port_, Ask(UserTurn("Request " + std::to_string(i) + ": " + filler)), kThrift);
    });
  }
  for (auto& t : clients) t.join();
  int served = 0, refused = 0;
  for (const auto& r : answers) {
    if (r.status == 200) ++served;
    if (r.status != 200) {
      EXPECT_EQ(r.status, 403) << r.body;
      EXPECT_EQ(r.Json()["error"]["code"], "budget_exceeded") << r.body;
      ++refused;
    }
  }
  EXPECT_EQ(served + refused, 8);
  ASSERT_GT(answers[0].status, 0);
  if (served > 0) {  // the figures the comment above assumes
    for (const auto& r : answers)
      if (r.status == 200) {
        EXPECT_GT(r.Json()["usage"]["prompt_tokens"].get<int>(), 120);
      }
  }
  EXPECT_GE(served, 1);
  EXPECT_GE(refused, 1);
  const double spent = SpentUsd(port_, "thrift");
  std::printf("8 parallel requests: %d served, %d refused, $%.4f spent of $%.2f\n", served, refused, spent, kThriftBudgetUsd);
  EXPECT_GT(spent, 0.0);
  EXPECT_LE(spent, kThriftBudgetUsd + 1e-9);
}

class TenantConcurrency : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("cap_keys.yaml", R"(
keys:
  - {key: sk-beta-0123456789, tenant: beta}
  - {key: sk-solo-0123456789, tenant: solo}
)");
    auto parsed = ParseDaemonConfigYaml("max_concurrent_per_tenant: 1\n", "cap.yaml", c);
    ASSERT_TRUE(parsed) << parsed.error().ToString();
    StartShared(*parsed);
  }
};

TEST_F(TenantConcurrency, ATenantPastItsConcurrencyCapIs429) {
  ASSERT_NE(daemon_, nullptr);
  // One long streamed answer in flight (its client reads the first token
  // and then stays connected without reading)...
  int64_t whole_tokens = 0;
  json body = LongGreedyRequest(port_, kSolo, 64, &whole_tokens);
  ASSERT_GE(whole_tokens, 64) << "no prompt's greedy answer was long enough to stay in flight";
  body["stream"] = true;
  const std::string text = body.dump();
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-solo-0123456789\r\n"
                          "Content-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text));
  char buf[4096];
  std::string got;
  while (!HasGeneratedText(got)) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << "the stream ended before any generated text:\n" << got;
    got.append(buf, static_cast<size_t>(n));
  }
  // ... so the same tenant's next request passes its cap of 1.
  auto r = Chat(port_, Ask(UserTurn("and one more")), kSolo);
  ::close(fd);
  ASSERT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "too_many_concurrent_requests");
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("max_concurrent_per_tenant"), std::string::npos);
  EXPECT_TRUE(r.headers.contains("retry-after"));
  // Another tenant is not held back, and the slot comes back once the stream ends.
  EXPECT_EQ(Chat(port_, Ask(UserTurn("hello")), kBeta).status, 200);
  HttpResponse again;
  for (int i = 0; i < 500; ++i) {
    again = Chat(port_, Ask(UserTurn("and one more")), kSolo);
    if (again.status != 429) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(again.status, 200) << again.body;
}

}  // namespace
}  // namespace moeserve::daemon::testing
