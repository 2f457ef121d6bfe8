#include "moeserve/budget/budget_rules.hpp"

#include <algorithm>

#include "moeserve/budget/budget_policy.hpp"

namespace moeserve {

bool ThresholdReached(double spent_usd, double threshold, double limit_usd) {
  return spent_usd >= threshold * limit_usd - kSpendTolerance;
}

bool LimitReached(double spent_usd, double limit_usd) { return ThresholdReached(spent_usd, 1.0, limit_usd); }

bool RefusalReachesLimit(double spent_usd, double refused_usd, double limit_usd) {
  return refused_usd > 0 && FitsWithinLimit(refused_usd, limit_usd) && !FitsWithinLimit(spent_usd + refused_usd, limit_usd);
}

bool IsLimitThreshold(double threshold) { return threshold >= 1.0 - kSpendTolerance; }

bool FitsWithinLimit(double usd, double limit_usd) { return usd <= limit_usd + kSpendTolerance; }

std::vector<FiringThreshold> ThresholdsToFire(const Budget& budget, double spent_usd, bool refused_in_period,
                                              const std::function<bool(double threshold)>& already_fired) {
  std::vector<FiringThreshold> out;
  const bool refusal_counts = refused_in_period && budget.action == BudgetAction::kBlock;
  for (double t : budget.thresholds) {
    const bool by_spend = ThresholdReached(spent_usd, t, budget.limit_usd);
    const bool by_refusal = !by_spend && refusal_counts && IsLimitThreshold(t);
    if (!by_spend && !by_refusal) continue;
    const bool listed = std::any_of(out.begin(), out.end(), [t](const FiringThreshold& f) { return f.threshold == t; });
    if (listed || (already_fired && already_fired(t))) continue;
    out.push_back({t, by_refusal});
  }
  return out;
}

}  // namespace moeserve
