// daemon.global_spend: a daemon under the operator (spend_from_operator).
// BudgetService: a tenant's spend is the operator's global figure plus what
// this daemon charged since the operator read it (counted_here_usd), so
// block applies on the global spend; the ConfigMap's copy (no
// counted_here_usd) counts the ledger at load as included; rate limits are
// split by the replica count; a standalone daemon refuses the spend, and a
// daemon with spend_from_operator refuses hooks. Over HTTP, PUT
// /v1/admin/spend: only an admin key (a tenant's key is 403, none 401),
// 405 for another method, 400 naming the field for a hostile body, 409 for
// another policy; and GET /v1/usage carries the ledger id.
#include <gtest/gtest.h>

#include <fstream>

#include "daemon_harness.hpp"
#include "moeserve/daemon/usage/budget_service.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon::testing {
namespace {

constexpr int64_t kNow = 1796385600;  // 2026-12-04T12:00:00Z
const int64_t kMonth = PeriodStart(BudgetPeriod::kMonth, kNow);

BudgetPolicy Policy(int64_t requests_per_minute = 0) {
  BudgetPolicy p;
  p.policy_name = "shared";
  p.pricing["low"] = {0, 0, 1e6, 1e6};  // $1 an output token
  Budget b;
  b.tenant = "*";
  b.period = BudgetPeriod::kMonth;
  b.limit_usd = 10;
  b.action = BudgetAction::kBlock;
  b.requests_per_minute = requests_per_minute;
  p.budgets.push_back(b);
  return p;
}

std::unique_ptr<BudgetService> Service(BudgetPolicy policy, bool under_operator = true) {
  BudgetServiceOptions o;
  o.policy = std::move(policy);
  o.clock = [] { return static_cast<double>(kNow); };
  o.spend_from_operator = under_operator;
  auto s = BudgetService::Create(std::move(o), nullptr);
  EXPECT_TRUE(s) << s.error().ToString();
  return s ? std::move(*s) : nullptr;
}

GlobalSpend Spend(double usd, std::optional<double> counted, int64_t replicas = 1) {
  return {"shared", replicas, kNow, {{"acme", BudgetPeriod::kMonth, kMonth, usd, counted}}};
}

const Principal kAcme{"acme", false, kAllTiers};

TEST(GlobalSpend, BudgetsFollowTheGlobalSpendPlusWhatWasChargedHereSince) {
  auto s = Service(Policy());
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->ledger().ChargeAndWait({"acme", "low", {0, 0, 2, 0}}));  // $2 here
  // The operator counted $9 in all, $2 of it from here: $9.
  ASSERT_TRUE(s->SetGlobalSpend(Spend(9, 2)));
  EXPECT_DOUBLE_EQ(s->EffectiveSpentUsd("acme", BudgetPeriod::kMonth, kMonth), 9);
  EXPECT_TRUE(s->Admit(kAcme, "low"));
  // One more dollar here reaches the $10 limit: blocked, though this ledger holds $3.
  ASSERT_TRUE(s->ledger().ChargeAndWait({"acme", "low", {0, 0, 1, 0}}));
  EXPECT_DOUBLE_EQ(s->EffectiveSpentUsd("acme", BudgetPeriod::kMonth, kMonth), 10);
  auto refused = s->Admit(kAcme, "low");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, "budget_exceeded");
  EXPECT_NE(refused.error().message.find("$10.00"), std::string::npos) << refused.error().message;
  // Another tenant has its own spend.
  EXPECT_TRUE(s->Admit({"globex", false, kAllTiers}, "low"));
  // A later push that counted everything: still $10.
  ASSERT_TRUE(s->SetGlobalSpend(Spend(10, 3)));
  EXPECT_DOUBLE_EQ(s->EffectiveSpentUsd("acme", BudgetPeriod::kMonth, kMonth), 10);
}

TEST(GlobalSpend, TheConfigMapsCopyCountsTheLedgerAtLoadAsIncluded) {
  auto s = Service(Policy());
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->ledger().ChargeAndWait({"acme", "low", {0, 0, 4, 0}}));
  ASSERT_TRUE(s->SetGlobalSpend(Spend(9.5, std::nullopt)));
  EXPECT_DOUBLE_EQ(s->EffectiveSpentUsd("acme", BudgetPeriod::kMonth, kMonth), 9.5);
  ASSERT_TRUE(s->ledger().ChargeAndWait({"acme", "low", {0, 0, 1, 0}}));
  EXPECT_DOUBLE_EQ(s->EffectiveSpentUsd("acme", BudgetPeriod::kMonth, kMonth), 10.5);
  EXPECT_FALSE(s->Admit(kAcme, "low"));
}

TEST(GlobalSpend, RateLimitsAreSplitByTheReplicaCount) {
  auto s = Service(Policy(/*requests_per_minute=*/4));
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->SetGlobalSpend(Spend(0, 0, /*replicas=*/2)));
  EXPECT_TRUE(s->Admit(kAcme, "low"));
  EXPECT_TRUE(s->Admit(kAcme, "low"));
  auto third = s->Admit(kAcme, "low");
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().status, 429);
  EXPECT_NE(third.error().message.find("limit of 2"), std::string::npos) << third.error().message;
}

TEST(GlobalSpend, AStandaloneDaemonRefusesItAndAnOperatedOneRefusesHooks) {
  auto standalone = Service(Policy(), false);
  ASSERT_TRUE(standalone);
  auto refused = standalone->SetGlobalSpend(Spend(100, 0));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().status, 409);
  EXPECT_EQ(refused.error().code, "not_under_operator");
  EXPECT_DOUBLE_EQ(standalone->EffectiveSpentUsd("acme", BudgetPeriod::kMonth, kMonth), 0);

  auto operated = Service(Policy());
  ASSERT_TRUE(operated);
  GlobalSpend other = Spend(100, 0);
  other.policy = "someone-else";
  auto wrong = operated->SetGlobalSpend(other);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, "wrong_policy");

  BudgetPolicy with_hook = Policy();
  HookConfig h;
  h.name = "sre";
  h.url = "https://alerts.example/";
  h.secret = "0123456789abcdef";
  with_hook.hooks.push_back(h);
  BudgetServiceOptions o;
  o.policy = with_hook;
  o.spend_from_operator = true;
  auto s = BudgetService::Create(std::move(o), nullptr);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("spend_from_operator"), std::string::npos);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_global_spend_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

const std::map<std::string, std::string> kAdmin = {{"Authorization", "Bearer sk-admin-0123456789"}};
const std::map<std::string, std::string> kTenant = {{"Authorization", "Bearer sk-acme-0123456789"}};

json Body(double usd) {
  return {{"policy", "shared"},
          {"replicas", 2},
          {"spend", {{{"tenant", "acme"}, {"period", "month"}, {"period_start", Iso8601Utc(PeriodStart(BudgetPeriod::kMonth, std::time(nullptr)))},
                      {"spent_usd", usd}, {"counted_here_usd", 0}}}}};
}

TEST(AdminSpend, OnlyAnAdminKeySetsItAndHostileBodiesAreRefusedByName) {
  DaemonConfig c = TestConfig();
  c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-admin-0123456789, tenant: ops, role: admin}
)");
  auto parsed = ParseDaemonConfigYaml(R"(
policy_name: shared
spend_from_operator: true
pricing:
  low: {output: 1000000, reasoning: 1000000}
budgets:
  - {tenant: "*", period: month, limitUSD: 10, action: block}
)", "config.yaml", c);
  ASSERT_TRUE(parsed) << parsed.error().ToString();
  auto d = Daemon::Create(*parsed);  // no model: the admin API and /v1/usage answer before one loads
  ASSERT_TRUE(d) << d.error().ToString();
  ASSERT_TRUE((*d)->Start());
  const int port = PortOf(**d);

  EXPECT_EQ(Http(port, "PUT", "/v1/admin/spend", Body(50).dump()).status, 401);
  auto tenant = Http(port, "PUT", "/v1/admin/spend", Body(0).dump(), kTenant);
  EXPECT_EQ(tenant.status, 403);
  EXPECT_EQ(tenant.Json()["error"]["code"], "admin_only");
  EXPECT_EQ(Http(port, "POST", "/v1/admin/spend", Body(50).dump(), kAdmin).status, 405);
  EXPECT_EQ(Http(port, "GET", "/v1/admin/spend", "", kAdmin).status, 405);
  for (auto [field, value] : std::vector<std::pair<std::string, json>>{
           {"spent_usd", -1}, {"spent_usd", "12"}, {"period", "week"}, {"period_start", "2026-12-04T00:00:00Z"},
           {"tenant", ""}, {"counted_here_usd", 1e300}}) {
    json bad = Body(1);
    bad["spend"][0][field] = value;
    auto r = Http(port, "PUT", "/v1/admin/spend", bad.dump(), kAdmin);
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_NE(r.Json()["error"].value("message", "").find(field), std::string::npos) << r.body;
  }
  EXPECT_EQ(Http(port, "PUT", "/v1/admin/spend", "{not json", kAdmin).status, 400);
  EXPECT_EQ(Http(port, "PUT", "/v1/admin/spend", json{{"policy", "shared"}, {"replicas", 0}, {"spend", json::array()}}.dump(), kAdmin).status, 400);
  json other = Body(1);
  other["policy"] = "other";
  EXPECT_EQ(Http(port, "PUT", "/v1/admin/spend", other.dump(), kAdmin).status, 409);

  auto ok = Http(port, "PUT", "/v1/admin/spend", Body(50).dump(), kAdmin);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.Json()["entries"], 1);
  EXPECT_EQ(ok.Json()["replicas"], 2);
  // The tenant's budget now reads as spent.
  auto metrics = Http(port, "GET", "/metrics", "", kAdmin);
  EXPECT_NE(metrics.body.find("moe_budget_remaining_ratio{period=\"month\",tenant=\"acme\"} 0"), std::string::npos)
      << metrics.body.substr(0, 4000);

  auto usage = Http(port, "GET", "/v1/usage", "", kAdmin);
  ASSERT_EQ(usage.status, 200);
  const std::string id = usage.Json().value("ledger_id", "");
  EXPECT_TRUE(id.starts_with("ldg_")) << usage.body;
  (*d)->Shutdown(0);
}

TEST(AdminSpend, TheLedgerIdIsKeptWithTheDatabaseAndNewWithANewOne) {
  const std::string path = ::testing::TempDir() + "/moe_global_spend_ledger_" + std::to_string(::getpid()) + ".sqlite3";
  std::filesystem::remove(path);
  std::string first, again, memory;
  for (std::string* out : {&first, &again}) {
    auto l = UsageLedger::Open({path, SystemWallClock(), Policy()});
    ASSERT_TRUE(l);
    *out = (*l)->ledger_id();
  }
  auto m = UsageLedger::Open({"", SystemWallClock(), Policy()});
  ASSERT_TRUE(m);
  memory = (*m)->ledger_id();
  EXPECT_TRUE(first.starts_with("ldg_"));
  EXPECT_EQ(first, again);
  EXPECT_NE(first, memory);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace moeserve::daemon::testing
