// daemon.usage_ledger: the SQLite ledger's arithmetic against a hand-computed
// table, UTC period rollover with an injected clock, durability across a
// reopen, commit-before-acknowledge, and thresholds fired once per period even
// when concurrent charges cross together.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/usage/usage_ledger.hpp"

namespace moeserve::daemon {
namespace {

struct FakeClock {
  std::atomic<double> now{0};
  WallClock fn() {
    return [this] { return now.load(); };
  }
};

// 2026-12-31T23:59:59Z and the second after it: a day's and a month's end.
constexpr int64_t kLastSecondOf2026 = 1798761599;

BudgetPolicy Prices() {
  BudgetPolicy p;
  p.pricing["low"] = {0.20, 0.02, 0.80, 0.60};
  p.pricing["medium"] = {0.40, 0.04, 1.60, 1.20};
  p.pricing["high"] = {0.80, 0.08, 3.20, 2.40};
  return p;
}

std::string TempDb(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/moe_ledger_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name + ".sqlite3";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

const UsageRow* Find(const std::vector<UsageRow>& rows, const std::string& tenant, const std::string& tier,
                     BudgetPeriod period) {
  for (const auto& r : rows) {
    if (r.tenant == tenant && r.tier == tier && r.period == period) return &r;
  }
  return nullptr;
}

TEST(UsageLedger, ArithmeticMatchesAHandComputedTable) {
  FakeClock clock;
  clock.now = 1796000000;  // 2026-11-30
  auto ledger = UsageLedger::Open({"", clock.fn(), Prices()});
  ASSERT_TRUE(ledger) << ledger.error().ToString();
  // tenant, tier, input, cached_input, output, reasoning
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {1000, 500, 200, 100}}));
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {3000, 0, 800, 0}}));
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "medium", {0, 2000, 50, 950}}));
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "high", {250000, 750000, 100000, 400000}}));
  ASSERT_TRUE((*ledger)->ChargeAndWait({"beta", "high", {7, 0, 0, 0}}));
  auto rows = (*ledger)->Rows(std::nullopt);
  ASSERT_TRUE(rows);
  ASSERT_EQ(rows->size(), 8u);  // (acme low, medium, high + beta high) x (day, month)

  // Hand-computed: tokens x USD per million / 1e6.
  // acme low:  input 4000 x 0.20 + cached 500 x 0.02 + output 1000 x 0.80 + reasoning 100 x 0.60
  //          = 0.0008 + 0.00001 + 0.0008 + 0.00006 = 0.00167
  // acme medium: cached 2000 x 0.04 + output 50 x 1.60 + reasoning 950 x 1.20 = 0.00008 + 0.00008 + 0.00114 = 0.0013
  // acme high: 250000 x 0.80 + 750000 x 0.08 + 100000 x 3.20 + 400000 x 2.40 = 0.2 + 0.06 + 0.32 + 0.96 = 1.54
  // beta high: 7 x 0.80 = 0.0000056
  struct Expect {
    const char* tenant;
    const char* tier;
    int64_t requests;
    TokenCounts tokens;
    double cost;
  } table[] = {
      {"acme", "low", 2, {4000, 500, 1000, 100}, 0.00167},
      {"acme", "medium", 1, {0, 2000, 50, 950}, 0.0013},
      {"acme", "high", 1, {250000, 750000, 100000, 400000}, 1.54},
      {"beta", "high", 1, {7, 0, 0, 0}, 0.0000056},
  };
  for (const auto& e : table) {
    for (BudgetPeriod p : kAllPeriods) {
      const UsageRow* r = Find(*rows, e.tenant, e.tier, p);
      ASSERT_NE(r, nullptr) << e.tenant << " " << e.tier << " " << PeriodName(p);
      EXPECT_EQ(r->requests, e.requests) << e.tenant << " " << e.tier;
      EXPECT_EQ(r->tokens, e.tokens) << e.tenant << " " << e.tier;
      EXPECT_NEAR(r->cost_usd, e.cost, 1e-12) << e.tenant << " " << e.tier;
      EXPECT_EQ(r->period_start, PeriodStart(p, 1796000000));
    }
  }
  EXPECT_EQ(PeriodStart(BudgetPeriod::kDay, 1796000000), 1795996800);    // 2026-11-30T00:00:00Z
  EXPECT_EQ(PeriodStart(BudgetPeriod::kMonth, 1796000000), 1793491200);  // 2026-11-01T00:00:00Z
  PeriodSpend s = (*ledger)->Spent("acme", BudgetPeriod::kMonth, 1793491200);
  EXPECT_NEAR(s.spent_usd, 0.00167 + 0.0013 + 1.54, 1e-12);
  EXPECT_EQ(s.tokens, (TokenCounts{254000, 752500, 101050, 401050}));
  auto own = (*ledger)->Rows(std::string("beta"));
  ASSERT_TRUE(own);
  ASSERT_EQ(own->size(), 2u);
  EXPECT_EQ((*own)[0].tenant, "beta");
  // A tier without a price is counted and costs nothing.
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "unpriced", {10, 10, 10, 10}}));
  auto after = (*ledger)->Rows(std::string("acme"));
  const UsageRow* free_row = Find(*after, "acme", "unpriced", BudgetPeriod::kDay);
  ASSERT_NE(free_row, nullptr);
  EXPECT_EQ(free_row->tokens.total(), 40);
  EXPECT_EQ(free_row->cost_usd, 0.0);
}

TEST(UsageLedger, PeriodsRollOverAtUtcBoundaries) {
  EXPECT_EQ(Iso8601Utc(kLastSecondOf2026), "2026-12-31T23:59:59Z");
  EXPECT_EQ(Iso8601Utc(NextPeriodStart(BudgetPeriod::kMonth, kLastSecondOf2026)), "2027-01-01T00:00:00Z");
  EXPECT_EQ(Iso8601Utc(PeriodStart(BudgetPeriod::kMonth, 1772323200 - 1)), "2026-02-01T00:00:00Z");
  EXPECT_EQ(Iso8601Utc(NextPeriodStart(BudgetPeriod::kMonth, 1772323200 - 1)), "2026-03-01T00:00:00Z");

  FakeClock clock;
  clock.now = kLastSecondOf2026;
  BudgetPolicy policy = Prices();
  policy.budgets.push_back({"acme", BudgetPeriod::kDay, 0.001, {1.0}, BudgetAction::kBlock});
  policy.hooks.push_back({"h", "https://example.invalid/", "", "0123456789abcdef", HookFormat::kJson});
  auto ledger = UsageLedger::Open({"", clock.fn(), policy});
  ASSERT_TRUE(ledger);
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {10000, 0, 0, 0}}));  // $0.002: past the day's limit
  EXPECT_EQ(*(*ledger)->CountDeliveries("pending"), 1);
  clock.now = kLastSecondOf2026 + 1;  // 2027-01-01T00:00:00Z
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {1000, 0, 0, 0}}));
  const int64_t old_day = PeriodStart(BudgetPeriod::kDay, kLastSecondOf2026);
  const int64_t new_day = kLastSecondOf2026 + 1;
  EXPECT_EQ(PeriodStart(BudgetPeriod::kMonth, new_day), new_day);
  EXPECT_EQ((*ledger)->Spent("acme", BudgetPeriod::kDay, old_day).spent_usd, 0.0);  // not current: not in memory
  EXPECT_NEAR((*ledger)->Spent("acme", BudgetPeriod::kDay, new_day).spent_usd, 0.0002, 1e-12);
  EXPECT_NEAR((*ledger)->Spent("acme", BudgetPeriod::kMonth, new_day).spent_usd, 0.0002, 1e-12);
  EXPECT_EQ((*ledger)->Spent("acme", BudgetPeriod::kMonth, new_day).tokens.input, 1000);
  auto rows = (*ledger)->Rows(std::nullopt);
  ASSERT_EQ(rows->size(), 4u);  // day and month rows of each year
  for (const auto& r : *rows) {
    const double want = r.period_start < new_day ? 0.002 : 0.0002;
    EXPECT_NEAR(r.cost_usd, want, 1e-12) << PeriodName(r.period) << " " << Iso8601Utc(r.period_start);
  }
  // The new day has not reached its limit: nothing more fired.
  EXPECT_EQ(*(*ledger)->CountDeliveries("pending"), 1);
  // Crossing it again in the new period fires again, once.
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {5000, 0, 0, 0}}));
  EXPECT_EQ(*(*ledger)->CountDeliveries("pending"), 2);
  EXPECT_EQ((*ledger)->stats().alerts, 2u);
}

TEST(UsageLedger, CommittedBeforeDoneAndKeptAcrossReopen) {
  const std::string path = TempDb("reopen");
  FakeClock clock;
  clock.now = 1796000000;
  {
    auto ledger = UsageLedger::Open({path, clock.fn(), Prices()});
    ASSERT_TRUE(ledger) << ledger.error().ToString();
    // In `done`, another connection to the file already sees the charge:
    // what the daemon acknowledges from `done` is on disk.
    std::atomic<int64_t> seen{-1};
    std::promise<void> finished;
    (*ledger)->Charge({"acme", "medium", {11, 22, 33, 44}}, [&](const Status& st) {
      EXPECT_TRUE(st);
      sqlite3* db = nullptr;
      EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
      sqlite3_stmt* q = nullptr;
      sqlite3_prepare_v2(db, "SELECT SUM(output) FROM usage WHERE tenant='acme' AND period='day'", -1, &q, nullptr);
      if (sqlite3_step(q) == SQLITE_ROW) seen = sqlite3_column_int64(q, 0);
      sqlite3_finalize(q);
      sqlite3_close(db);
      finished.set_value();
    });
    finished.get_future().wait();
    EXPECT_EQ(seen.load(), 33);
  }
  auto again = UsageLedger::Open({path, clock.fn(), Prices()});
  ASSERT_TRUE(again);
  auto rows = (*again)->Rows(std::nullopt);
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].tokens, (TokenCounts{11, 22, 33, 44}));
  EXPECT_EQ((*again)->Spent("acme", BudgetPeriod::kDay, PeriodStart(BudgetPeriod::kDay, 1796000000)).tokens.reasoning, 44);
}

TEST(UsageLedger, ConcurrentChargesCrossingAThresholdFireOnce) {
  const std::string path = TempDb("concurrent");
  FakeClock clock;
  clock.now = 1796000000;
  BudgetPolicy policy = Prices();
  // $0.0001 per charge of 500 low input tokens; limit $0.01: 100 charges make 100%.
  policy.budgets.push_back({"*", BudgetPeriod::kMonth, 0.01});
  policy.hooks.push_back({"a", "https://a.invalid/", "", "0123456789abcdef", HookFormat::kJson});
  policy.hooks.push_back({"b", "https://b.invalid/", "", "0123456789abcdef", HookFormat::kSlack});
  {
    auto ledger = UsageLedger::Open({path, clock.fn(), policy});
    ASSERT_TRUE(ledger);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 16; ++i) ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {500, 0, 0, 0}}));
      });
    }
    for (auto& t : threads) t.join();
    // 128 charges: 0.5, 0.8 and 1.0 reached, each once, one delivery per hook.
    EXPECT_EQ((*ledger)->stats().alerts, 3u);
    EXPECT_EQ(*(*ledger)->CountDeliveries("pending"), 6);
    EXPECT_EQ((*ledger)->stats().charges, 128u);
    EXPECT_LT((*ledger)->stats().commits, 128u) << "no group commit happened";
    auto due = (*ledger)->DueDeliveries(clock.now + 1, 100);
    ASSERT_EQ(due->size(), 6u);
    int json_bodies = 0;
    for (const auto& d : *due) {
      auto body = nlohmann::json::parse(d.body, nullptr, false);
      ASSERT_FALSE(body.is_discarded());
      if (d.hook == "b") {
        EXPECT_TRUE(body.contains("text"));
        continue;
      }
      ++json_bodies;
      EXPECT_EQ(body["type"], "budget.threshold");
      EXPECT_EQ(body["tenant"], "acme");
      EXPECT_EQ(body["period"], "month");
      EXPECT_EQ(body["period_start"], "2026-11-01T00:00:00Z");
      EXPECT_EQ(body["budget_usd"], 0.01);
      EXPECT_GE(body["spent_usd"].get<double>(), body["threshold"].get<double>() * 0.01 - 1e-12);
      EXPECT_TRUE(body["by_tier"].contains("low"));
      EXPECT_EQ(body["tokens"]["input"].get<int64_t>() % 500, 0);
    }
    EXPECT_EQ(json_bodies, 3);
  }
  // Reopened: the fired thresholds are remembered, nothing fires twice.
  auto again = UsageLedger::Open({path, clock.fn(), policy});
  ASSERT_TRUE(again);
  ASSERT_TRUE((*again)->ChargeAndWait({"acme", "low", {500, 0, 0, 0}}));
  EXPECT_EQ((*again)->stats().alerts, 0u);
  EXPECT_EQ(*(*again)->CountDeliveries("pending"), 6);
}

}  // namespace
}  // namespace moeserve::daemon
