// What moectl shows, whichever source it came from: usage rows (a daemon's
// GET /v1/usage, or QuotaPolicy status.usage), fired alerts (status.alerts),
// budgets with their spend (spec.budgets beside status.usage), and a
// tenant's spend over the period (a daemon's GET /v1/usage/history).
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moeserve::moectl {

struct Tokens {
  int64_t input = 0, cached_input = 0, output = 0, reasoning = 0;
};

struct UsageEntry {
  std::string ns, policy;      // cluster rows: the QuotaPolicy's namespace and name
  std::string tenant;
  std::string tier;            // daemon rows; cluster rows sum every tier and leave it empty
  std::string period;          // "day" | "month"
  std::string period_start;    // RFC 3339, UTC
  std::optional<int64_t> requests;  // daemon rows
  Tokens tokens;
  double spent_usd = 0;
};

struct AlertEntry {
  std::string ns, policy, tenant, period, period_start;
  double threshold = 0;  // a fraction of the budget
  std::string fired_at, delivery_id;
  bool delivered = false;
};

struct BudgetEntry {
  std::string ns, policy;
  std::string tenant;         // a tenant, or "*" when no tenant has spent under a "*" budget yet
  std::string budget_tenant;  // the spec entry's tenant ("*" or the tenant)
  std::string period, period_start;  // period_start empty when nothing was spent yet
  double limit_usd = 0, spent_usd = 0;
  std::vector<double> thresholds;
  std::string action;
  double remaining_usd() const { return limit_usd > spent_usd ? limit_usd - spent_usd : 0.0; }
};

struct BudgetLine {
  double limit_usd = 0;
  std::vector<double> thresholds;  // fractions of limit_usd
  std::string action;
};

// A tenant's cumulative spend within one period, one point per hour with usage.
struct SpendHistory {
  std::string tenant, period;
  int64_t period_start = 0, period_end = 0, now = 0;  // unix seconds
  std::vector<std::pair<int64_t, double>> points;      // (hour start, USD spent up to the hour's end)
  std::vector<BudgetLine> budgets;
};

}  // namespace moeserve::moectl
