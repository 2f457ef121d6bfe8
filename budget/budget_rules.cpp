#include "moeserve/budget/budget_rules.hpp"

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

}  // namespace moeserve
