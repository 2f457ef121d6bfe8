// A QuotaPolicy's usage summed over the daemons it governs, kept as
// Prometheus keeps counters across restarts.
//
// Each daemon's GET /v1/usage gives running totals per tenant, tier, period
// and period start, under a ledger id (minted with its database). The sum
// cannot be recomputed from the daemons alone, since a pod may be replaced
// without its volume and start again from zero; so the operator keeps, per
// pod, the totals it last read (last seen) and, per tenant, tier, period and
// start, the sum of everything counted so far. Folding a new reading adds,
// for each row, what grew since last seen:
//   - same ledger id, no count smaller than last seen: the difference;
//   - another ledger id, or any count smaller (a reset, as Prometheus
//     treats a counter that went down): the whole new row, since the
//     ledger started again from zero and what it held before is already in
//     the sum.
// A pod that is not read in a sync adds nothing and keeps its last seen, so
// what it charged meanwhile is counted at its next read: nothing twice,
// nothing lost, as long as a pod whose ledger was lost had not charged
// anything between its last read and the loss (that much is unknowable).
// Rows of past periods leave both maps (Prune).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/common/status.hpp"

namespace moeserve::op {

struct UsageAmount {
  TokenCounts tokens;
  int64_t requests = 0;
  double cost_usd = 0;
  UsageAmount& operator+=(const UsageAmount& o) {
    tokens += o.tokens, requests += o.requests, cost_usd += o.cost_usd;
    return *this;
  }
  bool operator==(const UsageAmount&) const = default;
};

// tenant, tier, period, period start (unix seconds)
using UsageKey = std::tuple<std::string, std::string, BudgetPeriod, int64_t>;
using UsageRows = std::map<UsageKey, UsageAmount>;

// (tenant, period, period start) -> the worst case of the first request a
// `block` budget refused in that period (GET /v1/usage "refusals"): it
// reaches the budget's 100% threshold for alerting (budget_rules.hpp).
using RefusalMap = std::map<std::tuple<std::string, BudgetPeriod, int64_t>, double>;

// One daemon's GET /v1/usage.
struct UsageReading {
  std::string ledger_id;
  UsageRows rows;
  RefusalMap refusals;  // not folded into the totals: the daemon lists them all period long
};
// The body of GET /v1/usage (an admin key's: every tenant); errors name the row.
Result<UsageReading> ParseUsageReading(const nlohmann::json& body);

struct PodLastSeen {
  std::string ledger_id;
  UsageRows rows;
  bool operator==(const PodLastSeen&) const = default;
};

struct UsageTotals {
  UsageRows sum;                              // over every pod, ever
  std::map<std::string, PodLastSeen> pods;    // "namespace/pod" -> last read

  // Adds what `reading` of `pod` holds beyond its last seen; it becomes the last seen.
  void Fold(const std::string& pod, const UsageReading& reading);
  // Drops rows whose period is not the one holding `now` (unix seconds).
  void Prune(int64_t now);
  // What of the sum of (tenant, period, start) came from `pod`'s last read.
  double CountedFrom(const std::string& pod, const std::string& tenant, BudgetPeriod period, int64_t start) const;
  // Per tenant, period and start: all tiers together, and by tier.
  PeriodSpend Spend(const std::string& tenant, BudgetPeriod period, int64_t start) const;
  // Every (tenant, period, start) with usage.
  std::vector<std::tuple<std::string, BudgetPeriod, int64_t>> Periods() const;

  nlohmann::json ToJson() const;
  static Result<UsageTotals> FromJson(const nlohmann::json& j);
  bool operator==(const UsageTotals&) const = default;
};

// What grew from `last` to `now` for one row, resets counted as from zero.
UsageAmount Growth(const UsageAmount& last, const UsageAmount& now, bool same_ledger);

}  // namespace moeserve::op
