// The global spend a moe-operator hands back to each daemon of a QuotaPolicy:
// what the policy's tenants spent per period, summed over every node-rank-0
// pod of every MoEDeployment the policy governs. One JSON shape serves the
// daemon's `PUT /v1/admin/spend` body and the `spend.json` key of ConfigMap
// `<policy>-budget`, from which a daemon that (re)starts takes it:
//
//   {"policy": "team-a", "replicas": 4, "synced_at": "2026-12-04T10:00:30Z",
//    "spend": [{"tenant": "acme", "period": "day", "period_start": "2026-12-04T00:00:00Z",
//               "spent_usd": 12.5, "counted_here_usd": 3.25}]}
//
// `counted_here_usd` is how much of `spent_usd` the operator took from the
// receiving daemon's own ledger (its last read); the daemon adds what it
// charged since: effective spend = spent_usd + max(0, own ledger now -
// counted_here_usd). Absent (the ConfigMap's copy, which serves every pod):
// the daemon counts its own ledger at load as already included.
// `replicas`: how many daemons share the policy's rate limits (each applies
// 1/replicas of a budget's requestsPerMinute and tokensPerMinute).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/budget/usage_period.hpp"

namespace moeserve {

struct GlobalSpendEntry {
  std::string tenant;
  BudgetPeriod period = BudgetPeriod::kDay;
  int64_t period_start = 0;  // unix seconds
  double spent_usd = 0;
  std::optional<double> counted_here_usd;
  bool operator==(const GlobalSpendEntry&) const = default;
};

struct GlobalSpend {
  std::string policy;
  int64_t replicas = 1;
  int64_t synced_at = 0;  // unix seconds
  std::vector<GlobalSpendEntry> spend;
  bool operator==(const GlobalSpend&) const = default;
};

nlohmann::json GlobalSpendJson(const GlobalSpend& s);
// Errors (kInvalidArgument) name the field; bounded: at most 100,000 entries.
Result<GlobalSpend> ParseGlobalSpend(const nlohmann::json& j);

}  // namespace moeserve
