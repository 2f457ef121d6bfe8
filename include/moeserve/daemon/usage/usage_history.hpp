// Spend over time inside a budget period, for charts (`moectl usage --chart`)
// and GET /v1/usage/history. Beside its per-period totals the ledger keeps one
// row per tenant, tier and UTC hour, written in the same transaction as the
// totals, so an hour's rows always add up to what the period rows say and a
// crash loses or keeps both together. Hours are the resolution: a day has at
// most 24 points, a month at most 744.
//
// Thread safety: the writer is used by the ledger's writer thread inside its
// transaction; UsageHistoryJson may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"  // TokenCounts, BudgetPolicy, periods

struct sqlite3;
struct sqlite3_stmt;

namespace moeserve::daemon {

// One tenant's usage of one tier in one UTC hour.
struct HourlyUsage {
  std::string tier;
  int64_t hour_start = 0;  // unix seconds, a multiple of 3600
  int64_t requests = 0;
  TokenCounts tokens;
  double cost_usd = 0;
};

// Creates the hourly table when missing (databases written before it start
// their history at the first charge after the upgrade).
Status CreateUsageHistoryTable(sqlite3* db);

// Adds charges to their hour inside the caller's open transaction.
class HourlyUsageWriter {
 public:
  explicit HourlyUsageWriter(sqlite3* db);
  ~HourlyUsageWriter();
  HourlyUsageWriter(const HourlyUsageWriter&) = delete;
  HourlyUsageWriter& operator=(const HourlyUsageWriter&) = delete;
  bool ok() const { return stmt_ != nullptr; }
  Status Add(const std::string& tenant, const std::string& tier, int64_t unix_seconds, const TokenCounts& tokens,
             double cost_usd);

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Reads a tenant's hours in [from, to), ordered by hour then tier.
Result<std::vector<HourlyUsage>> ReadHourlyUsage(sqlite3* db, const std::string& tenant, int64_t from, int64_t to);

// The body of GET /v1/usage/history?tenant=&period= for `who`: the current
// period's hours (all tiers summed) with the cumulative spend after each, and
// the budgets the tenant follows. A tenant's key reads only its own tenant
// (tenant may be omitted); an admin key names any tenant.
ApiResult<nlohmann::json> UsageHistoryJson(const UsageLedger& ledger, const Principal& who, std::string_view query);

}  // namespace moeserve::daemon
