// budget.rules: the budget decisions every side takes alike (threshold
// reached, limit reached, fits within the limit, which thresholds fire once
// per period), the room they leave for a float sum, and the default
// thresholds: a budget that names none gets them, and the QuotaPolicy CRD
// states the same default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/budget/budget_rules.hpp"

namespace moeserve {
namespace {

// Ten charges of $0.10 sum to a hair under $1.00 in binary floating point.
double TenDimes() {
  double sum = 0;
  for (int i = 0; i < 10; ++i) sum += 0.1;
  return sum;
}

TEST(BudgetRules, ThresholdReachedCountsAFloatSumThatLandsJustUnder) {
  ASSERT_LT(TenDimes(), 1.0);
  EXPECT_TRUE(ThresholdReached(TenDimes(), 1.0, 1.0));
  EXPECT_TRUE(ThresholdReached(TenDimes(), 0.5, 2.0));
  EXPECT_TRUE(ThresholdReached(5.0, 0.5, 10.0));
  EXPECT_FALSE(ThresholdReached(4.99, 0.5, 10.0));
  EXPECT_FALSE(ThresholdReached(0.0, 0.5, 10.0));
}

TEST(BudgetRules, OnlyARefusalThatSpendCausesReachesTheLimitForAlerting) {
  // $9.60 spent of $10, a request of up to $0.50: spend is why it is refused.
  EXPECT_TRUE(RefusalReachesLimit(9.6, 0.5, 10.0));
  // $1 spent: a $0.50 request refused only because requests in flight hold
  // the rest of the room is concurrency, not a spent budget.
  EXPECT_FALSE(RefusalReachesLimit(1.0, 0.5, 10.0));
  // A request larger than the whole budget says nothing about spend.
  EXPECT_FALSE(RefusalReachesLimit(9.6, 12.0, 10.0));
  // The daemon's zero-cost early slot (a request with images) reports no amount.
  EXPECT_FALSE(RefusalReachesLimit(10.5, 0.0, 10.0));
}

TEST(BudgetRules, LimitReachedIsTheFullThreshold) {
  EXPECT_TRUE(LimitReached(TenDimes(), 1.0));
  EXPECT_TRUE(LimitReached(1.5, 1.0));
  EXPECT_FALSE(LimitReached(0.99, 1.0));
  EXPECT_TRUE(LimitReached(0.0, 0.0));  // a zero budget is spent from the start
}

TEST(BudgetRules, FitsWithinLimitAllowsExactlyTheLimit) {
  EXPECT_TRUE(FitsWithinLimit(1.0, 1.0));
  EXPECT_TRUE(FitsWithinLimit(0.1 + 0.2, 0.3));  // 0.30000000000000004
  EXPECT_FALSE(FitsWithinLimit(1.01, 1.0));
}

std::vector<double> Thresholds(const std::vector<FiringThreshold>& f) {
  std::vector<double> out;
  for (const auto& x : f) out.push_back(x.threshold);
  return out;
}

Budget TenDollars(BudgetAction action) {
  Budget b;
  b.limit_usd = 10;
  b.thresholds = {0.5, 0.8, 1.0};
  b.action = action;
  return b;
}

TEST(BudgetRules, ThresholdsFireOncePerPeriodAsSpendReachesThem) {
  const Budget b = TenDollars(BudgetAction::kAlert);
  std::set<double> fired;  // what this period has fired so far
  auto already = [&](double t) { return fired.contains(t); };
  auto fire = [&](double spent) {
    auto f = ThresholdsToFire(b, spent, false, already);
    for (const auto& x : f) {
      EXPECT_FALSE(x.by_refusal) << x.threshold;
      fired.insert(x.threshold);
    }
    return Thresholds(f);
  };
  EXPECT_EQ(fire(4.99), std::vector<double>{});
  EXPECT_EQ(fire(5.0), std::vector<double>{0.5});
  EXPECT_EQ(fire(6.0), std::vector<double>{});  // 50% already fired this period
  EXPECT_EQ(fire(TenDimes() * 10), (std::vector<double>{0.8, 1.0}));  // a float sum a hair under $10
  EXPECT_EQ(fire(20.0), std::vector<double>{});
  // No record of what fired (nullptr): everything reached fires.
  EXPECT_EQ(Thresholds(ThresholdsToFire(b, 8.0, false, nullptr)), (std::vector<double>{0.5, 0.8}));
}

TEST(BudgetRules, ARefusalFiresOnlyABlockingBudgetsFullThreshold) {
  // $9.60 of $10 spent, a refusal in the period: the blocking budget's 100%
  // fires by the refusal, 50% and 80% by spend.
  auto f = ThresholdsToFire(TenDollars(BudgetAction::kBlock), 9.6, true, nullptr);
  ASSERT_EQ(Thresholds(f), (std::vector<double>{0.5, 0.8, 1.0}));
  EXPECT_FALSE(f[0].by_refusal);
  EXPECT_FALSE(f[1].by_refusal);
  EXPECT_TRUE(f[2].by_refusal);
  // Reached by spend, the full threshold is not a refusal's.
  f = ThresholdsToFire(TenDollars(BudgetAction::kBlock), 10.0, true, nullptr);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_FALSE(f[2].by_refusal);
  // An alerting or downgrading budget does not refuse: nothing fires by refusal.
  for (BudgetAction a : {BudgetAction::kAlert, BudgetAction::kDowngrade})
    EXPECT_EQ(Thresholds(ThresholdsToFire(TenDollars(a), 9.6, true, nullptr)), (std::vector<double>{0.5, 0.8}))
        << BudgetActionName(a);
  // Without a refusal the blocking budget stops at what spend reached.
  EXPECT_EQ(Thresholds(ThresholdsToFire(TenDollars(BudgetAction::kBlock), 9.6, false, nullptr)),
            (std::vector<double>{0.5, 0.8}));
  // Already fired by refusal earlier in the period: not again.
  EXPECT_EQ(Thresholds(ThresholdsToFire(TenDollars(BudgetAction::kBlock), 9.6, true,
                                        [](double t) { return t == 1.0; })),
            (std::vector<double>{0.5, 0.8}));
}

TEST(BudgetRules, AThresholdListedTwiceFiresOnce) {
  Budget b = TenDollars(BudgetAction::kAlert);
  b.thresholds = {0.5, 0.5, 1.0};
  EXPECT_EQ(Thresholds(ThresholdsToFire(b, 10.0, false, nullptr)), (std::vector<double>{0.5, 1.0}));
}

TEST(BudgetRules, ABudgetThatNamesNoThresholdsGetsTheDefaults) {
  BudgetPolicy policy;
  ASSERT_TRUE(ParseBudgetSection(policy, "budgets", YAML::Load("[{tenant: a, period: day, limitUSD: 5}]"), "test"));
  ASSERT_EQ(policy.budgets.size(), 1u);
  EXPECT_EQ(policy.budgets[0].thresholds, std::vector<double>(kDefaultThresholds.begin(), kDefaultThresholds.end()));
  EXPECT_EQ(Budget{}.thresholds, std::vector<double>(kDefaultThresholds.begin(), kDefaultThresholds.end()));
}

// The CRD's default is what a QuotaPolicy written without thresholds holds
// once the API server has defaulted it: it must be the same list.
TEST(BudgetRules, TheQuotaPolicyCrdDefaultsToTheSameThresholds) {
  const char* dir = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string root = dir ? dir : MOESERVE_SOURCE_DIR_DEFAULT;
  const YAML::Node crd = YAML::LoadFile(root + "/crds/moeserve.io_quotapolicies.yaml");
  const YAML::Node versions = crd["spec"]["versions"];
  ASSERT_TRUE(versions.IsSequence());
  ASSERT_GT(versions.size(), 0u);
  for (const YAML::Node& v : versions) {
    const YAML::Node thresholds = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["budgets"]["items"]
                                   ["properties"]["thresholds"];
    ASSERT_TRUE(thresholds["default"].IsSequence()) << "version " << v["name"].as<std::string>();
    EXPECT_EQ(thresholds["default"].as<std::vector<double>>(),
              std::vector<double>(kDefaultThresholds.begin(), kDefaultThresholds.end()))
        << "version " << v["name"].as<std::string>();
  }
}

}  // namespace
}  // namespace moeserve
