// daemon.usage_history: the ledger's hourly rows with an injected clock:
// charges land in their UTC hour, per tier, in the same transaction as the
// period totals (the hours of a period add up to its row), survive a reopen;
// UsageHistoryJson gives the current period's hours with the cumulative
// spend, the tenant's budgets, and refuses another tenant's key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "moeserve/daemon/usage/usage_history.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"

namespace moeserve::daemon {
namespace {

struct FakeClock {
  std::atomic<double> now{0};
  WallClock fn() {
    return [this] { return now.load(); };
  }
};

constexpr int64_t kDec4 = 1796342400;  // 2026-12-04T00:00:00Z

BudgetPolicy Policy() {
  BudgetPolicy p;
  p.pricing["low"] = {1.0, 1.0, 1.0, 1.0};      // $1 per million tokens of any kind
  p.pricing["high"] = {10.0, 10.0, 10.0, 10.0};
  Budget b;
  b.tenant = "*";
  b.period = BudgetPeriod::kDay;
  b.limit_usd = 1.0;
  b.thresholds = {0.5, 1.0};
  b.action = BudgetAction::kBlock;
  p.budgets.push_back(b);
  return p;
}

std::string TempDb() {
  std::string dir = ::testing::TempDir() + "/moe_history_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/ledger.sqlite3";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

TEST(UsageHistory, ChargesLandInTheirHourAndAddUpToThePeriod) {
  FakeClock clock;
  const std::string path = TempDb();
  {
    auto ledger = UsageLedger::Open({path, clock.fn(), Policy()});
    ASSERT_TRUE(ledger) << ledger.error().ToString();
    clock.now = kDec4 + 3600 + 59;  // 01:00:59
    ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {100000, 0, 50000, 0}}));   // $0.15
    clock.now = kDec4 + 2 * 3600 - 1;  // 01:59:59, same hour
    ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "high", {10000, 0, 0, 0}}));        // $0.10
    clock.now = kDec4 + 5 * 3600;  // 05:00:00
    ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {0, 200000, 0, 100000}}));   // $0.30
    ASSERT_TRUE((*ledger)->ChargeAndWait({"other", "low", {999999, 0, 0, 0}}));
  }
  auto ledger = UsageLedger::Open({path, clock.fn(), Policy()});  // reopened: nothing lost
  ASSERT_TRUE(ledger) << ledger.error().ToString();
  auto hours = (*ledger)->Hourly("acme", kDec4, kDec4 + 86400);
  ASSERT_TRUE(hours) << hours.error().ToString();
  ASSERT_EQ(hours->size(), 3u);
  EXPECT_EQ((*hours)[0].hour_start, kDec4 + 3600);
  EXPECT_EQ((*hours)[0].tier, "high");
  EXPECT_NEAR((*hours)[0].cost_usd, 0.10, 1e-12);
  EXPECT_EQ((*hours)[1].hour_start, kDec4 + 3600);
  EXPECT_EQ((*hours)[1].tier, "low");
  EXPECT_NEAR((*hours)[1].cost_usd, 0.15, 1e-12);
  EXPECT_EQ((*hours)[1].tokens, (TokenCounts{100000, 0, 50000, 0}));
  EXPECT_EQ((*hours)[2].hour_start, kDec4 + 5 * 3600);
  EXPECT_EQ((*hours)[2].requests, 1);
  EXPECT_EQ((*hours)[2].tokens, (TokenCounts{0, 200000, 0, 100000}));
  // The hours add up to the day's rows.
  auto rows = (*ledger)->Rows(std::string("acme"));
  ASSERT_TRUE(rows);
  double day_total = 0, hour_total = 0;
  for (const auto& r : *rows)
    if (r.period == BudgetPeriod::kDay) day_total += r.cost_usd;
  for (const auto& h : *hours) hour_total += h.cost_usd;
  EXPECT_NEAR(day_total, 0.55, 1e-12);
  EXPECT_NEAR(hour_total, day_total, 1e-12);
  // A window that ends before 05:00 leaves that hour out.
  auto early = (*ledger)->Hourly("acme", kDec4, kDec4 + 5 * 3600);
  ASSERT_TRUE(early);
  EXPECT_EQ(early->size(), 2u);
}

TEST(UsageHistory, JsonHasTheCumulativeSpendBudgetsAndAccessRules) {
  FakeClock clock;
  clock.now = kDec4 + 2 * 3600 + 10;
  auto ledger = UsageLedger::Open({"", clock.fn(), Policy()});
  ASSERT_TRUE(ledger) << ledger.error().ToString();
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {200000, 0, 0, 0}}));  // $0.20 at 02:00
  clock.now = kDec4 + 7 * 3600 + 10;
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {0, 0, 300000, 0}}));  // $0.30 at 07:00
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "high", {0, 0, 0, 10000}}));  // $0.10 at 07:00
  clock.now = kDec4 + 9 * 3600;

  Principal acme{"acme", false, kAllTiers};
  auto j = UsageHistoryJson(**ledger, acme, "period=day");
  ASSERT_TRUE(j) << j.error().message;
  EXPECT_EQ((*j)["tenant"], "acme");
  EXPECT_EQ((*j)["period_start"], "2026-12-04T00:00:00Z");
  EXPECT_EQ((*j)["period_end"], "2026-12-05T00:00:00Z");
  EXPECT_EQ((*j)["now"], "2026-12-04T09:00:00Z");
  const auto& data = (*j)["data"];
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0]["hour_start"], "2026-12-04T02:00:00Z");
  EXPECT_NEAR(data[0]["cumulative_usd"].get<double>(), 0.20, 1e-12);
  EXPECT_EQ(data[1]["hour_start"], "2026-12-04T07:00:00Z");
  EXPECT_NEAR(data[1]["cost_usd"].get<double>(), 0.40, 1e-12);
  EXPECT_NEAR(data[1]["cumulative_usd"].get<double>(), 0.60, 1e-12);
  EXPECT_NEAR(data[1]["by_tier"]["high"].get<double>(), 0.10, 1e-12);
  EXPECT_EQ(data[1]["requests"], 2);
  ASSERT_EQ((*j)["budgets"].size(), 1u);
  EXPECT_EQ((*j)["budgets"][0]["action"], "block");
  EXPECT_EQ((*j)["budgets"][0]["limit_usd"], 1.0);
  // The month's history has the same hours; it has no month budget.
  auto month = UsageHistoryJson(**ledger, acme, "");
  ASSERT_TRUE(month);
  EXPECT_EQ((*month)["period"], "month");
  EXPECT_EQ((*month)["data"].size(), 2u);
  EXPECT_TRUE((*month)["budgets"].empty());

  auto other = UsageHistoryJson(**ledger, acme, "tenant=beta");
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().status, 403);
  Principal admin{"ops", true, kAllTiers};
  EXPECT_EQ(UsageHistoryJson(**ledger, admin, "period=day").error().status, 400);
  auto by_admin = UsageHistoryJson(**ledger, admin, "tenant=ac%6De&period=day");  // form-encoded name
  ASSERT_TRUE(by_admin) << by_admin.error().message;
  EXPECT_EQ((*by_admin)["data"].size(), 2u);
  EXPECT_EQ(UsageHistoryJson(**ledger, acme, "period=year").error().status, 400);
}

}  // namespace
}  // namespace moeserve::daemon
