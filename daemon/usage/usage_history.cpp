#include "moeserve/daemon/usage/usage_history.hpp"

#include <sqlite3.h>

#include <map>

#include "moeserve/daemon/usage/usage_ledger.hpp"

namespace moeserve::daemon {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS usage_hourly(
  tenant TEXT NOT NULL, tier TEXT NOT NULL, hour_start INTEGER NOT NULL,
  requests INTEGER NOT NULL DEFAULT 0, input INTEGER NOT NULL DEFAULT 0, cached_input INTEGER NOT NULL DEFAULT 0,
  output INTEGER NOT NULL DEFAULT 0, reasoning INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0,
  PRIMARY KEY(tenant, hour_start, tier)) WITHOUT ROWID;
)sql";

constexpr int64_t kHour = 3600;

Error DbError(sqlite3* db, const std::string& what) {
  return Error::Io("usage history: " + what + ": " + (db ? sqlite3_errmsg(db) : "no database"));
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded, as browsers and curl send it; a broken
// escape is kept as written (it then names no tenant).
std::string FormDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && HexDigit(s[i + 1]) >= 0 &&
               HexDigit(s[i + 2]) >= 0) {
      out += static_cast<char>(HexDigit(s[i + 1]) * 16 + HexDigit(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::map<std::string, std::string> ParseQuery(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    std::string key = FormDecode(pair.substr(0, eq));
    out.emplace(std::move(key), eq == std::string_view::npos ? std::string() : FormDecode(pair.substr(eq + 1)));
  }
  return out;
}

ApiError Forbidden(std::string message) {
  return ApiError{403, "permission_error", "permission_denied", std::move(message), "tenant", 0};
}

nlohmann::json TokensJson(const TokenCounts& t) {
  return {{"input", t.input}, {"cached_input", t.cached_input}, {"output", t.output}, {"reasoning", t.reasoning}};
}

}  // namespace

Status CreateUsageHistoryTable(sqlite3* db) {
  char* err = nullptr;
  if (sqlite3_exec(db, kSchema, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Fail(Error::Io("usage history: creating the hourly table: " + msg));
  }
  return Ok();
}

HourlyUsageWriter::HourlyUsageWriter(sqlite3* db) : db_(db) {
  const char* sql =
      "INSERT INTO usage_hourly(tenant, tier, hour_start, requests, input, cached_input, output, reasoning, cost_usd) "
      "VALUES(?1, ?2, ?3, 1, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(tenant, hour_start, tier) DO UPDATE SET "
      "requests = requests + 1, input = input + ?4, cached_input = cached_input + ?5, output = output + ?6, "
      "reasoning = reasoning + ?7, cost_usd = cost_usd + ?8";
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt_);
    stmt_ = nullptr;
  }
}

HourlyUsageWriter::~HourlyUsageWriter() { sqlite3_finalize(stmt_); }

Status HourlyUsageWriter::Add(const std::string& tenant, const std::string& tier, int64_t unix_seconds,
                              const TokenCounts& tokens, double cost_usd) {
  if (!stmt_) return Fail(DbError(db_, "preparing the hourly update"));
  const int64_t hour = unix_seconds - ((unix_seconds % kHour) + kHour) % kHour;
  sqlite3_bind_text(stmt_, 1, tenant.data(), static_cast<int>(tenant.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(stmt_, 2, tier.data(), static_cast<int>(tier.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt_, 3, hour);
  sqlite3_bind_int64(stmt_, 4, tokens.input);
  sqlite3_bind_int64(stmt_, 5, tokens.cached_input);
  sqlite3_bind_int64(stmt_, 6, tokens.output);
  sqlite3_bind_int64(stmt_, 7, tokens.reasoning);
  sqlite3_bind_double(stmt_, 8, cost_usd);
  const int rc = sqlite3_step(stmt_);
  sqlite3_reset(stmt_);
  if (rc != SQLITE_DONE) return Fail(DbError(db_, "updating the hourly usage"));
  return Ok();
}

Result<std::vector<HourlyUsage>> ReadHourlyUsage(sqlite3* db, const std::string& tenant, int64_t from, int64_t to) {
  sqlite3_stmt* q = nullptr;
  const char* sql =
      "SELECT tier, hour_start, requests, input, cached_input, output, reasoning, cost_usd FROM usage_hourly "
      "WHERE tenant = ? AND hour_start >= ? AND hour_start < ? ORDER BY hour_start, tier";
  if (sqlite3_prepare_v2(db, sql, -1, &q, nullptr) != SQLITE_OK) {
    sqlite3_finalize(q);
    return Fail(DbError(db, "reading the hourly usage"));
  }
  sqlite3_bind_text(q, 1, tenant.data(), static_cast<int>(tenant.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(q, 2, from);
  sqlite3_bind_int64(q, 3, to);
  std::vector<HourlyUsage> out;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    HourlyUsage h;
    auto* tier = reinterpret_cast<const char*>(sqlite3_column_text(q, 0));
    h.tier = tier ? tier : "";
    h.hour_start = sqlite3_column_int64(q, 1);
    h.requests = sqlite3_column_int64(q, 2);
    h.tokens = {sqlite3_column_int64(q, 3), sqlite3_column_int64(q, 4), sqlite3_column_int64(q, 5),
                sqlite3_column_int64(q, 6)};
    h.cost_usd = sqlite3_column_double(q, 7);
    out.push_back(std::move(h));
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE) return Fail(DbError(db, "reading the hourly usage"));
  return out;
}

ApiResult<nlohmann::json> UsageHistoryJson(const UsageLedger& ledger, const Principal& who, std::string_view query) {
  const auto params = ParseQuery(query);
  std::string tenant = who.tenant;
  if (auto it = params.find("tenant"); it != params.end() && !it->second.empty()) {
    if (!who.admin && it->second != who.tenant) {
      return ApiFail(Forbidden("The key of tenant " + who.tenant + " may read only its own usage history"));
    }
    tenant = it->second;
  } else if (who.admin) {
    return ApiFail(ApiError::InvalidRequest("An admin key must name the tenant: /v1/usage/history?tenant=NAME", "tenant"));
  }
  BudgetPeriod period = BudgetPeriod::kMonth;
  if (auto it = params.find("period"); it != params.end()) {
    auto p = ParsePeriod(it->second);
    if (!p) return ApiFail(ApiError::InvalidRequest("period must be day or month, not '" + it->second + "'", "period"));
    period = *p;
  }
  const int64_t now = static_cast<int64_t>(ledger.Now());
  const int64_t start = PeriodStart(period, now), end = NextPeriodStart(period, now);
  auto hours = ledger.Hourly(tenant, start, end);
  if (!hours) return ApiFail(ApiError::Internal("The usage ledger could not be read: " + hours.error().message()));

  // One point per hour over all tiers; the tiers stay visible in by_tier.
  nlohmann::json data = nlohmann::json::array();
  double cumulative = 0;
  for (size_t i = 0; i < hours->size();) {
    const int64_t hour = (*hours)[i].hour_start;
    TokenCounts tokens;
    int64_t requests = 0;
    double cost = 0;
    nlohmann::json by_tier = nlohmann::json::object();
    for (; i < hours->size() && (*hours)[i].hour_start == hour; ++i) {
      const HourlyUsage& h = (*hours)[i];
      tokens += h.tokens;
      requests += h.requests;
      cost += h.cost_usd;
      by_tier[h.tier] = h.cost_usd;
    }
    cumulative += cost;
    data.push_back({{"hour_start", Iso8601Utc(hour)},
                    {"requests", requests},
                    {"tokens", TokensJson(tokens)},
                    {"cost_usd", cost},
                    {"by_tier", std::move(by_tier)},
                    {"cumulative_usd", cumulative}});
  }
  nlohmann::json budgets = nlohmann::json::array();
  for (const Budget* b : ledger.policy().BudgetsFor(tenant)) {
    if (b->period != period) continue;
    budgets.push_back({{"tenant", b->tenant},
                       {"period", PeriodName(b->period)},
                       {"limit_usd", b->limit_usd},
                       {"thresholds", b->thresholds},
                       {"action", BudgetActionName(b->action)}});
  }
  return nlohmann::json{{"object", "usage.history"},
                        {"tenant", tenant},
                        {"period", PeriodName(period)},
                        {"period_start", Iso8601Utc(start)},
                        {"period_end", Iso8601Utc(end)},
                        {"now", Iso8601Utc(now)},
                        {"budgets", std::move(budgets)},
                        {"data", std::move(data)}};
}

Result<std::vector<HourlyUsage>> UsageLedger::Hourly(const std::string& tenant, int64_t from, int64_t to) const {
  std::lock_guard lock(db_mu_);
  return ReadHourlyUsage(db_, tenant, from, to);
}

}  // namespace moeserve::daemon
