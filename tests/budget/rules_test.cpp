// budget.rules: the budget decisions every side takes alike (threshold
// reached, limit reached, fits within the limit), the room they leave for a
// float sum, and the default thresholds: a budget that names none gets them,
// and the QuotaPolicy CRD states the same default.
#include <gtest/gtest.h>

#include <cstdlib>
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
