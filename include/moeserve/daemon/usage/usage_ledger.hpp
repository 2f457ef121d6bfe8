// The durable usage ledger: one SQLite database (WAL, synchronous=FULL) that
// holds, per tenant, tier, period (`day`, `month`, UTC) and period start,
// the four token kinds, the request count and the cost in USD; the budget
// thresholds already crossed; and the outbox of hook deliveries.
//
// Charging is a group commit. Charge() queues a finished request's usage and
// returns; one writer thread takes everything queued, applies it in a single
// transaction (usage rows, thresholds crossed by it, their alerts and outbox
// rows) and commits it with one WAL fsync, then runs each request's `done`.
// The daemon answers a request only from `done`, so a response whose final
// bytes reached the client is already on disk: a crash before the commit
// loses only requests that were never acknowledged, and they are not charged;
// none is charged twice, since each Charge is applied exactly once. A failed
// commit is reported to `done` (the daemon then answers an error and the
// request is not charged).
//
// Thresholds: after each batch, a tenant's spend in a period (all tiers) is
// compared with each of its budgets (BudgetPolicy::BudgetsFor); a threshold
// reached for the first time in that period is recorded with one outbox row
// per hook, in the same transaction as the usage that reached it. One writer
// decides, so concurrent requests that cross together fire once, and a
// restart neither forgets a fired threshold nor fires it again.
//
// Refusals: Refused() records the first request a `block` budget refused in
// a period (table `refusals`, same writer); it reaches that budget's 100%
// threshold for alerting (budget_rules.hpp RefusalReachesLimit), fired as
// above with the refused amount in the body. GET /v1/usage lists the current
// periods' refusals, so that under an operator, which fires the hooks, the
// operator fires it too.
//
// An empty path keeps the database in memory (nothing survives a restart).
//
// Thread safety: every method may be called from any thread; `done`
// callbacks and the alert notification run on the writer thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/budget/usage_period.hpp"
#include "moeserve/daemon/sqlite_batch_writer.hpp"

struct sqlite3;

namespace moeserve::daemon {
struct HourlyUsage;
}

namespace moeserve::daemon {

struct ChargeRecord {
  std::string tenant;
  std::string tier;
  TokenCounts tokens;
};

struct UsageRow {
  std::string tenant, tier;
  BudgetPeriod period = BudgetPeriod::kDay;
  int64_t period_start = 0;
  int64_t requests = 0;
  TokenCounts tokens;
  double cost_usd = 0;
};

// The first request a `block` budget refused in a period.
struct RefusalRow {
  std::string tenant;
  BudgetPeriod period = BudgetPeriod::kDay;
  int64_t period_start = 0;
  double refused_usd = 0;  // the refused request's worst case
  int64_t at = 0;          // unix seconds
};

struct OutboxEntry {
  std::string id;    // X-MoE-Delivery
  std::string hook;  // HookConfig::name
  std::string body;  // exactly what is posted and signed
  double created_at = 0;
  int attempts = 0;
  double next_attempt_at = 0;
};

struct LedgerStats {
  uint64_t commits = 0;  // transactions committed by the writer (one WAL fsync each)
  uint64_t charges = 0;  // requests charged
  uint64_t alerts = 0;   // thresholds fired
};

class UsageLedger {
 public:
  struct Options {
    std::string path;  // empty: in memory
    WallClock clock = SystemWallClock();
    BudgetPolicy policy;
  };
  static Result<std::unique_ptr<UsageLedger>> Open(Options options);
  // Commits what is queued, then stops the writer.
  ~UsageLedger();

  using Done = std::function<void(const Status& committed)>;
  void Charge(ChargeRecord record, Done done);
  // Charge and wait for the commit (tests, tools).
  Status ChargeAndWait(ChargeRecord record);
  // A `block` budget of `period` refused a request of `tenant` whose worst
  // case was `refused_usd` (the caller has checked RefusalReachesLimit). The
  // first of each period is recorded and reaches the budget's 100%
  // threshold; the rest cost a set lookup, so refusals at any rate queue nothing.
  void Refused(const std::string& tenant, BudgetPeriod period, double refused_usd);
  // The current periods' refusals, every tenant's or one's.
  Result<std::vector<RefusalRow>> Refusals(const std::optional<std::string>& tenant) const;
  // Runs after each commit that fired a threshold (the outbox wakes up).
  void SetAlertListener(std::function<void()> listener);
  // Runs after each commit that charged, with the batch's records and their
  // costs (metrics); a batch of refusals only charged nothing and is not reported.
  void SetCommitListener(std::function<void(const std::vector<std::pair<ChargeRecord, double>>&)> listener);

  // Every row, or one tenant's, ordered by tenant, tier, period, start.
  Result<std::vector<UsageRow>> Rows(const std::optional<std::string>& tenant) const;
  // What `tenant` spent in the current period of `period` starting at
  // `period_start` (committed charges); past periods read as zero here (Rows has them).
  PeriodSpend Spent(const std::string& tenant, BudgetPeriod period, int64_t period_start) const;
  // One tenant's usage per tier and UTC hour in [from, to) (usage_history.hpp).
  Result<std::vector<HourlyUsage>> Hourly(const std::string& tenant, int64_t from, int64_t to) const;
  const BudgetPolicy& policy() const { return options_.policy; }
  // Minted when the database is created, kept with it: totals read under
  // one id only grow; another id means they started again from zero.
  const std::string& ledger_id() const { return ledger_id_; }
  double Now() const { return options_.clock(); }
  LedgerStats stats() const;

  // The outbox (hook_outbox.hpp sends from it).
  Result<std::vector<OutboxEntry>> DueDeliveries(double now, int limit) const;
  std::optional<double> NextDeliveryAt() const;  // earliest pending attempt
  Status MarkDelivered(const std::string& id);
  Status MarkFailed(const std::string& id, const std::string& reason);
  Status Reschedule(const std::string& id, int attempts, double next_attempt_at);
  // Outbox rows by state ("pending", "delivered", "failed"), for tests and status.
  Result<int64_t> CountDeliveries(const std::string& state) const;

 private:
  using SpendKey = std::tuple<std::string, BudgetPeriod, int64_t>;  // tenant, period, start
  using AlertKey = std::tuple<std::string, BudgetPeriod, int64_t, double>;
  struct Pending {
    ChargeRecord record;  // a refusal: only the tenant
    Done done;
    std::optional<RefusalRow> refusal;  // set: a refusal, not a charge
  };
  explicit UsageLedger(Options options) : options_(std::move(options)) {}
  Status Init();
  void WriteBatch(std::vector<Pending>& batch);
  Status CommitBatch(std::vector<Pending>& batch, std::map<SpendKey, PeriodSpend>& spend,
                     std::set<AlertKey>& fired, std::vector<std::pair<ChargeRecord, double>>& costs);
  Status Exec(const char* sql) const;

  Options options_;
  std::string ledger_id_;
  sqlite3* db_ = nullptr;
  mutable std::mutex db_mu_;  // one connection, used by one thread at a time

  mutable std::mutex state_mu_;  // the committed spend and fired thresholds of current periods
  std::map<SpendKey, PeriodSpend> spend_;
  std::set<AlertKey> fired_;
  std::set<SpendKey> refused_;  // refusals of current periods, recorded or queued
  std::function<void()> alert_listener_;
  std::function<void(const std::vector<std::pair<ChargeRecord, double>>&)> commit_listener_;
  LedgerStats stats_;

  SqliteBatchWriter<Pending> writer_;
};

}  // namespace moeserve::daemon
