// daemon.budget_actions: a daemon with tenants, prices, budgets and rate
// limits, over HTTP: 403 tier_not_allowed, 403 budget_exceeded naming the
// budget and its reset, downgrade to low (header and field), 429 with
// Retry-After, /v1/usage access rules (own rows, admin all, no key 401), the
// budget metrics, and usage charged for a client that hangs up.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "long_stream.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAcme = {{"Authorization", "Bearer sk-acme-0123456789"}};
const std::map<std::string, std::string> kBlocked = {{"Authorization", "Bearer sk-blocked-0123456789"}};
const std::map<std::string, std::string> kCheap = {{"Authorization", "Bearer sk-cheap-0123456789"}};
const std::map<std::string, std::string> kBusy = {{"Authorization", "Bearer sk-busy-0123456789"}};
const std::map<std::string, std::string> kAdmin = {{"Authorization", "Bearer sk-admin-0123456789"}};

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_budget_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

class BudgetActions : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("keys.yaml", R"(
tenants:
  acme: {tiers: [low, medium]}
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-blocked-0123456789, tenant: blocked}
  - {key: sk-cheap-0123456789, tenant: cheap}
  - {key: sk-busy-0123456789, tenant: busy}
  - {key: sk-admin-0123456789, tenant: ops, role: admin}
)");
    auto parsed = ParseDaemonConfigYaml(R"(
pricing:
  low:    {input: 1000, cachedInput: 100, output: 4000, reasoning: 4000}
  medium: {input: 2000, cachedInput: 200, output: 8000, reasoning: 8000}
  high:   {input: 4000, cachedInput: 400, output: 16000, reasoning: 16000}
budgets:
  - {tenant: "*", period: month, limitUSD: 1000000}
  - {tenant: blocked, period: day, limitUSD: 0.05, action: block}
  - {tenant: cheap, period: month, limitUSD: 0.001, action: downgrade}
  - {tenant: busy, period: day, limitUSD: 1000000, requestsPerMinute: 2}
)", "budget.yaml", c);
    ASSERT_TRUE(parsed) << parsed.error().ToString();
    StartShared(*parsed);
  }
  static json Ask(const std::string& effort = "low") {
    return {{"messages", UserTurn("hello")}, {"max_tokens", 2}, {"reasoning_effort", effort}, {"seed", 7}};
  }
};

TEST_F(BudgetActions, ATierTheTenantMayNotUseIs403) {
  ASSERT_NE(daemon_, nullptr);
  auto r = Chat(port_, Ask("high"), kAcme);
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.Json()["error"]["code"], "tier_not_allowed");
  EXPECT_EQ(r.Json()["error"]["param"], "reasoning_effort");
  EXPECT_EQ(Chat(port_, Ask("medium"), kAcme).status, 200);
  // Another tenant without a tenants entry may use every tier.
  EXPECT_EQ(Chat(port_, Ask("high"), kAdmin).status, 200);
}

TEST_F(BudgetActions, ASpentBlockBudgetIs403NamingTheBudgetAndItsReset) {
  ASSERT_NE(daemon_, nullptr);
  // Each request holds its worst case (prompt + max_tokens, a few cents at
  // low's prices) while it runs: the first fits the $0.05; within a few
  // requests the next one would pass it.
  ASSERT_EQ(Chat(port_, Ask(), kBlocked).status, 200);
  HttpResponse r = Chat(port_, Ask(), kBlocked);
  for (int i = 0; i < 8 && r.status == 200; ++i) r = Chat(port_, Ask(), kBlocked);
  ASSERT_EQ(r.status, 403) << r.body;
  const json e = r.Json()["error"];
  EXPECT_EQ(e["code"], "budget_exceeded");
  const std::string msg = e["message"];
  EXPECT_NE(msg.find("daily budget of $0.05"), std::string::npos) << msg;
  const std::string reset = Iso8601Utc(NextPeriodStart(BudgetPeriod::kDay, std::time(nullptr)));
  EXPECT_NE(msg.find("resets at " + reset), std::string::npos) << msg;
  // Another tenant is not affected.
  EXPECT_EQ(Chat(port_, Ask(), kAcme).status, 200);
}

TEST_F(BudgetActions, ASpentDowngradeBudgetServesAtLowAndSaysSo) {
  ASSERT_NE(daemon_, nullptr);
  auto first = Chat(port_, Ask("medium"), kCheap);
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(first.Json()["tier"], "medium");
  EXPECT_FALSE(first.headers.contains("x-moe-downgraded"));
  auto r = Chat(port_, Ask("medium"), kCheap);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["tier"], "low");
  EXPECT_EQ(r.Json()["downgraded"], "budget");
  EXPECT_EQ(r.headers["x-moe-downgraded"], "budget");
  json streamed = Ask("high");
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto s = Chat(port_, streamed, kCheap);
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.headers["x-moe-downgraded"], "budget");
  auto events = s.Events();
  ASSERT_GE(events.size(), 2u);
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["tier"], "low");
  EXPECT_EQ(last["downgraded"], "budget");
}

TEST_F(BudgetActions, RequestsPerMinuteLimitIs429WithRetryAfter) {
  ASSERT_NE(daemon_, nullptr);
  EXPECT_EQ(Chat(port_, Ask(), kBusy).status, 200);
  EXPECT_EQ(Chat(port_, Ask(), kBusy).status, 200);
  auto r = Chat(port_, Ask(), kBusy);
  ASSERT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "rate_limit_exceeded");
  ASSERT_TRUE(r.headers.contains("retry-after"));
  const int wait = std::stoi(r.headers["retry-after"]);
  EXPECT_GE(wait, 1);
  EXPECT_LE(wait, 30);  // one request refills in 30 s at 2 a minute
  EXPECT_EQ(Chat(port_, Ask(), kAcme).status, 200);  // per tenant
}

TEST_F(BudgetActions, UsageShowsOwnRowsToATenantAndAllToAnAdmin) {
  ASSERT_NE(daemon_, nullptr);
  ASSERT_EQ(Chat(port_, Ask("low"), kAcme).status, 200);
  EXPECT_EQ(Http(port_, "GET", "/v1/usage").status, 401);
  EXPECT_EQ(Http(port_, "GET", "/v1/usage", "", {{"Authorization", "Bearer sk-wrong"}}).status, 401);
  EXPECT_EQ(Http(port_, "POST", "/v1/usage", "{}", kAcme).status, 405);
  auto own = Http(port_, "GET", "/v1/usage", "", kAcme);
  ASSERT_EQ(own.status, 200) << own.body;
  ASSERT_FALSE(own.Json()["data"].empty()) << own.body;
  std::set<std::string> tenants;
  int64_t input = 0;
  const json own_rows = own.Json()["data"];
  for (const auto& row : own_rows) {
    tenants.insert(row["tenant"]);
    for (const char* k : {"tier", "period", "period_start", "tokens", "cost_usd"}) EXPECT_TRUE(row.contains(k)) << k;
    if (row["period"] == "day") input += row["tokens"]["input"].get<int64_t>() + row["tokens"]["cached_input"].get<int64_t>();
    EXPECT_GT(row["cost_usd"].get<double>(), 0);
  }
  EXPECT_EQ(tenants, std::set<std::string>{"acme"});
  EXPECT_GT(input, 0);
  ASSERT_EQ(Chat(port_, Ask(), kCheap).status, 200);
  auto all = Http(port_, "GET", "/v1/usage", "", kAdmin);
  ASSERT_EQ(all.status, 200);
  tenants.clear();
  const json all_rows = all.Json()["data"];
  for (const auto& row : all_rows) tenants.insert(row["tenant"]);
  EXPECT_TRUE(tenants.contains("acme"));
  EXPECT_TRUE(tenants.contains("cheap"));
}

TEST_F(BudgetActions, UsageAddsUpToTheResponsesUsage) {
  ASSERT_NE(daemon_, nullptr);
  auto total = [&] {
    int64_t prompt = 0, completion = 0;
    const json rows = Http(port_, "GET", "/v1/usage", "", kAdmin).Json()["data"];
    for (const auto& row : rows) {
      if (row["tenant"] != "ops" || row["period"] != "month") continue;
      prompt += row["tokens"]["input"].get<int64_t>() + row["tokens"]["cached_input"].get<int64_t>();
      completion += row["tokens"]["output"].get<int64_t>() + row["tokens"]["reasoning"].get<int64_t>();
    }
    return std::pair{prompt, completion};
  };
  auto before = total();
  auto r = Chat(port_, Ask("medium"), kAdmin);
  ASSERT_EQ(r.status, 200);
  auto after = total();
  EXPECT_EQ(after.first - before.first, r.Json()["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(after.second - before.second, r.Json()["usage"]["completion_tokens"].get<int64_t>());
}

// The month rows' requests and completion tokens of one tenant.
std::pair<int64_t, int64_t> Charged(int port, const std::map<std::string, std::string>& key, const std::string& tenant) {
  int64_t requests = 0, completion = 0;
  const json rows = Http(port, "GET", "/v1/usage", "", key).Json()["data"];
  for (const auto& row : rows) {
    if (row["tenant"] != tenant || row["period"] != "month") continue;
    requests += row["requests"].get<int64_t>();
    completion += row["tokens"]["output"].get<int64_t>() + row["tokens"]["reasoning"].get<int64_t>();
  }
  return {requests, completion};
}

TEST_F(BudgetActions, AClientThatHangsUpIsChargedOnceForWhatWasComputed) {
  ASSERT_NE(daemon_, nullptr);
  // A greedy answer long enough to hang up in the middle of.
  int64_t whole_tokens = 0;
  json body = LongGreedyRequest(port_, kAdmin, 64, &whole_tokens);
  ASSERT_GE(whole_tokens, 64) << "no prompt's greedy answer was long enough to hang up in the middle of";

  const auto before = Charged(port_, kAdmin, "ops");
  body["stream"] = true;
  const std::string text = body.dump();
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-admin-0123456789\r\n"
                          "Content-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text));
  char buf[4096];
  std::string got;
  while (!HasGeneratedText(got)) {  // a token was generated
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << "the stream ended before any generated text:\n" << got;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::pair<int64_t, int64_t> after = before;
  for (int i = 0; i < 500 && after.first == before.first; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    after = Charged(port_, kAdmin, "ops");
  }
  EXPECT_EQ(after.first, before.first + 1);
  EXPECT_GT(after.second, before.second);                 // what was generated before the hang-up
  EXPECT_LT(after.second, before.second + whole_tokens);  // not the whole answer
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Charged(port_, kAdmin, "ops"), after);  // once
}

TEST_F(BudgetActions, AThinkingBudgetCannotBuyMoreThanTheTier) {
  ASSERT_NE(daemon_, nullptr);
  // The test deployment's low tier thinks at most 4 tokens.
  json body = {{"messages", UserTurn("think hard")}, {"max_tokens", 40}, {"reasoning_effort", "low"},
               {"thinking_budget", 100000}, {"seed", 3}};
  auto r = Chat(port_, body, kAcme);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_LE(r.Json()["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 4);
  EXPECT_EQ(r.Json()["tier"], "low");
}

TEST_F(BudgetActions, MetricsShowCostAndBudgets) {
  ASSERT_NE(daemon_, nullptr);
  ASSERT_EQ(Chat(port_, Ask(), kAcme).status, 200);
  auto m = Http(port_, "GET", "/metrics", "", kAdmin);
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("moe_cost_usd_total{tenant=\"acme\",tier=\"low\"}"), std::string::npos);
  EXPECT_NE(m.body.find("moe_budget_limit_usd{period=\"day\",tenant=\"blocked\"} 0.05"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("moe_budget_remaining_ratio{period=\"month\",tenant=\"acme\"}"), std::string::npos);
  auto sample = [&](const std::string& name) {
    size_t at = m.body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(m.body.substr(at + name.size() + 2));
  };
  EXPECT_GE(sample("moe_usage_ledger_commits_total"), 1.0);
  EXPECT_GE(sample("moe_usage_ledger_charges_total"), sample("moe_usage_ledger_commits_total"));
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool not installed";
  std::string file = WriteFile("metrics.txt", m.body);
  EXPECT_EQ(std::system(("promtool check metrics < " + file + " >/dev/null 2>&1").c_str()), 0);
}

}  // namespace
}  // namespace moeserve::daemon::testing
