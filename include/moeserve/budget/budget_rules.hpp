// The budget decisions, stated once. The daemon's ledger (which fires alerts
// as it charges), its admission (which blocks and downgrades), the operator
// (which fires alerts on the spend summed over daemons) and moectl (which
// shows a QuotaPolicy's budgets) all decide with these, so they cannot drift.
//
// Spend is a sum of floating-point costs; every comparison with a limit
// leaves kSpendTolerance of room so that a sum which lands a hair under a
// limit it really reached still counts as reaching it.
//
// Thread safety: constants and pure functions.
#pragma once

#include <array>
#include <functional>
#include <vector>

namespace moeserve {

struct Budget;  // budget_policy.hpp, which includes this header for kDefaultThresholds

inline constexpr double kSpendTolerance = 1e-9;

// The thresholds of a budget that names none (the QuotaPolicy CRD's default
// too: tests/budget checks crds/ against this).
inline constexpr std::array<double, 3> kDefaultThresholds = {0.5, 0.8, 1.0};

// Whether `spent_usd` has reached `threshold` (a fraction in (0, 1]) of
// `limit_usd`: the moment a budget.threshold alert fires.
bool ThresholdReached(double spent_usd, double threshold, double limit_usd);

// Whether `spent_usd` has used up `limit_usd`: a blocking budget refuses
// requests and a downgrading one moves them to the low tier from here on.
bool LimitReached(double spent_usd, double limit_usd);

// Whether a `block` budget's refusal of a request whose worst case is
// `refused_usd`, at a spend of `spent_usd`, reaches the budget's 100%
// threshold for alerting. Admission refuses once spend plus the next
// request's worst case would pass the limit, so spend alone stops short of
// 100% and the alert SREs page on would never fire; the refusal is that
// moment instead. Only a refusal that spend itself causes counts:
//  - the request must fit the limit on its own (one whose worst case alone
//    is past the whole limit says nothing about spend: the client must lower
//    max_tokens);
//  - spend plus the request must pass the limit (a refusal made only by the
//    worst cases held for requests in flight, at 10% spend say, is
//    concurrency, not an exhausted budget: it must not page anyone);
//  - the request must cost something (the daemon's early, zero-cost slot
//    for a request with images is no amount to report).
bool RefusalReachesLimit(double spent_usd, double refused_usd, double limit_usd);

// Whether `threshold` is a budget's 100% threshold (the one a refusal reaches).
bool IsLimitThreshold(double threshold);

// One threshold of a budget that fires now.
struct FiringThreshold {
  double threshold = 0;
  // Reached by a refusal of this `block` budget (RefusalReachesLimit), not by
  // spend: the alert carries the refused request's worst case.
  bool by_refusal = false;
};

// The thresholds of `budget` that fire at a spend of `spent_usd` in one
// period: those reached by spend, or, for a `block` budget whose period saw a
// refusal that reaches its limit (`refused_in_period`), its 100% threshold;
// less those `already_fired` says fired in this period (each fires once per
// period). The daemon's ledger and the operator's usage sync both fire
// through this, each with its own record of what already fired. Ascending
// as the budget lists them; a threshold listed twice fires once.
std::vector<FiringThreshold> ThresholdsToFire(const Budget& budget, double spent_usd, bool refused_in_period,
                                              const std::function<bool(double threshold)>& already_fired);

// Whether a spend of `usd` (spent, held by requests in flight and the worst
// case of a new one) still fits within `limit_usd`.
bool FitsWithinLimit(double usd, double limit_usd);

}  // namespace moeserve
