// The body of a budget.threshold alert, as hooks receive it:
//   {"type":"budget.threshold","tenant","policy","deployment","period","period_start",
//    "threshold","spent_usd","budget_usd","tokens":{"input","cached_input","output","reasoning"},
//    "by_tier":{"<tier>":{"tokens":{...},"cost_usd"}},"at"}
// plus "refused_usd" (the refused request's worst case) when the threshold
// was reached by a refusal rather than by spend (budget_rules.hpp,
// RefusalReachesLimit),
// or, for a hook with `format: slack`, a Slack incoming-webhook message
// {"text": "..."} saying the same in words.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>

#include "moeserve/budget/budget_policy.hpp"

namespace moeserve {

struct ThresholdCrossing {
  std::string tenant;
  const Budget* budget = nullptr;
  int64_t period_start = 0;
  double threshold = 0;
  PeriodSpend spend;
  int64_t at = 0;  // unix seconds
  // Set when a `block` budget refused a request before spend reached the
  // threshold: what that request could have cost.
  std::optional<double> refused_usd;
};

std::string AlertBody(const ThresholdCrossing& c, const BudgetPolicy& policy, HookFormat format);

}  // namespace moeserve
