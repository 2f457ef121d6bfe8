#include "moeserve/daemon/usage/usage_ledger.hpp"

#include <openssl/rand.h>
#include <sqlite3.h>

#include <algorithm>
#include <future>

#include "moeserve/budget/budget_alert.hpp"
#include "moeserve/budget/budget_rules.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/daemon/usage/usage_history.hpp"
#include "sqlite_statement.hpp"

namespace moeserve::daemon {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS usage(
  tenant TEXT NOT NULL, tier TEXT NOT NULL, period TEXT NOT NULL, period_start INTEGER NOT NULL,
  requests INTEGER NOT NULL DEFAULT 0, input INTEGER NOT NULL DEFAULT 0, cached_input INTEGER NOT NULL DEFAULT 0,
  output INTEGER NOT NULL DEFAULT 0, reasoning INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0,
  PRIMARY KEY(tenant, tier, period, period_start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alerts(
  tenant TEXT NOT NULL, period TEXT NOT NULL, period_start INTEGER NOT NULL, threshold REAL NOT NULL,
  fired_at INTEGER NOT NULL, PRIMARY KEY(tenant, period, period_start, threshold)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox(
  id TEXT PRIMARY KEY, hook TEXT NOT NULL, body TEXT NOT NULL, created_at REAL NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL, state TEXT NOT NULL DEFAULT 'pending',
  last_error TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(state, next_attempt_at);
CREATE TABLE IF NOT EXISTS refusals(
  tenant TEXT NOT NULL, period TEXT NOT NULL, period_start INTEGER NOT NULL, refused_usd REAL NOT NULL,
  at INTEGER NOT NULL, PRIMARY KEY(tenant, period, period_start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
)sql";

using Stmt = SqliteStatement;

Error DbError(sqlite3* db, const std::string& what) {
  return Error::Io("usage ledger: " + what + ": " + (db ? sqlite3_errmsg(db) : "no database"));
}

std::string RandomId(const char* prefix) {
  unsigned char raw[16];
  if (RAND_bytes(raw, sizeof raw) != 1) {
    for (auto& b : raw) b = static_cast<unsigned char>(std::rand());
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (unsigned char b : raw) id += {kHex[b >> 4], kHex[b & 15]};
  return id;
}

}  // namespace

Status UsageLedger::Exec(const char* sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Fail(Error::Io("usage ledger " + (options_.path.empty() ? std::string("(memory)") : options_.path) + ": " + msg));
  }
  return Ok();
}

Result<std::unique_ptr<UsageLedger>> UsageLedger::Open(Options options) {
  std::unique_ptr<UsageLedger> l(new UsageLedger(std::move(options)));
  MOE_TRY(l->Init());
  l->writer_.Start([p = l.get()](std::vector<Pending>& batch) { p->WriteBatch(batch); });
  return l;
}

Status UsageLedger::Init() {
  // Durable commits: a committed charge survives a crash of the process and of the machine.
  MOE_ASSIGN_OR_RETURN(db_, OpenDurableDatabase(options_.path, "usage ledger"));
  MOE_TRY(Exec(kSchema));
  MOE_TRY(CreateUsageHistoryTable(db_));
  // The ledger's identity: minted with the database, so a reader that sees
  // another id knows the totals started again from zero (a new volume, or
  // an in-memory ledger after a restart).
  {
    Stmt put(db_, "INSERT OR IGNORE INTO meta(key, value) VALUES('ledger_id', ?)");
    if (!put.ok()) return Fail(DbError(db_, "writing the ledger id"));
    put.Bind(1, RandomId("ldg_"));
    if (put.Step() != SQLITE_DONE) return Fail(DbError(db_, "writing the ledger id"));
    Stmt get(db_, "SELECT value FROM meta WHERE key = 'ledger_id'");
    if (!get.ok() || get.Step() != SQLITE_ROW) return Fail(DbError(db_, "reading the ledger id"));
    ledger_id_ = get.Text(0);
  }
  // The current periods' spend and fired thresholds, so that a restarted
  // daemon enforces and alerts from where it stopped.
  const int64_t now = static_cast<int64_t>(options_.clock());
  for (BudgetPeriod p : kAllPeriods) {
    const int64_t start = PeriodStart(p, now);
    Stmt q(db_, "SELECT tenant, tier, input, cached_input, output, reasoning, cost_usd FROM usage "
                "WHERE period = ? AND period_start = ?");
    if (!q.ok()) return Fail(DbError(db_, "reading usage"));
    q.Bind(1, std::string(PeriodName(p))).Bind(2, start);
    while (q.Step() == SQLITE_ROW) {
      PeriodSpend& s = spend_[{q.Text(0), p, start}];
      TokenCounts t{q.Int(2), q.Int(3), q.Int(4), q.Int(5)};
      s.spent_usd += q.Real(6);
      s.tokens += t;
      s.by_tier[q.Text(1)] = {t, q.Real(6)};
    }
    Stmt a(db_, "SELECT tenant, threshold FROM alerts WHERE period = ? AND period_start = ?");
    if (!a.ok()) return Fail(DbError(db_, "reading alerts"));
    a.Bind(1, std::string(PeriodName(p))).Bind(2, start);
    while (a.Step() == SQLITE_ROW) fired_.insert({a.Text(0), p, start, a.Real(1)});
    Stmt r(db_, "SELECT tenant FROM refusals WHERE period = ? AND period_start = ?");
    if (!r.ok()) return Fail(DbError(db_, "reading refusals"));
    r.Bind(1, std::string(PeriodName(p))).Bind(2, start);
    while (r.Step() == SQLITE_ROW) refused_.insert({r.Text(0), p, start});
  }
  return Ok();
}

UsageLedger::~UsageLedger() {
  writer_.Stop();  // commits what is queued while the database is still open
  if (db_) sqlite3_close_v2(db_);
}

void UsageLedger::Charge(ChargeRecord record, Done done) {
  Pending p{std::move(record), std::move(done)};
  if (writer_.Push(std::move(p))) return;
  if (p.done) p.done(Fail(Error::Unavailable("usage ledger: closed")));  // refused: Push left it whole
}

Status UsageLedger::ChargeAndWait(ChargeRecord record) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  Charge(std::move(record), [promise](const Status& st) { promise->set_value(st); });
  return future.get();
}

void UsageLedger::Refused(const std::string& tenant, BudgetPeriod period, double refused_usd) {
  const int64_t now = static_cast<int64_t>(options_.clock());
  const SpendKey key{tenant, period, PeriodStart(period, now)};
  {
    std::lock_guard lock(state_mu_);
    if (!refused_.insert(key).second) return;  // recorded, or queued
  }
  Pending p;
  p.record.tenant = tenant;
  p.refusal = RefusalRow{tenant, period, std::get<2>(key), refused_usd, now};
  if (writer_.Push(std::move(p))) return;
  std::lock_guard lock(state_mu_);
  refused_.erase(key);  // closed: nothing recorded
}

Result<std::vector<RefusalRow>> UsageLedger::Refusals(const std::optional<std::string>& tenant) const {
  const int64_t now = static_cast<int64_t>(options_.clock());
  std::lock_guard lock(db_mu_);
  std::vector<RefusalRow> out;
  for (BudgetPeriod p : kAllPeriods) {
    Stmt q(db_, tenant ? "SELECT tenant, refused_usd, at, period_start FROM refusals WHERE period = ? AND period_start = ? "
                         "AND tenant = ? ORDER BY tenant"
                       : "SELECT tenant, refused_usd, at, period_start FROM refusals WHERE period = ? AND period_start = ? "
                         "ORDER BY tenant");
    if (!q.ok()) return Fail(DbError(db_, "reading refusals"));
    q.Bind(1, std::string(PeriodName(p))).Bind(2, PeriodStart(p, now));
    if (tenant) q.Bind(3, *tenant);
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) out.push_back({q.Text(0), p, q.Int(3), q.Real(1), q.Int(2)});
    if (rc != SQLITE_DONE) return Fail(DbError(db_, "reading refusals"));
  }
  return out;
}

void UsageLedger::SetAlertListener(std::function<void()> listener) {
  std::lock_guard lock(state_mu_);
  alert_listener_ = std::move(listener);
}

void UsageLedger::SetCommitListener(std::function<void(const std::vector<std::pair<ChargeRecord, double>>&)> l) {
  std::lock_guard lock(state_mu_);
  commit_listener_ = std::move(l);
}

void UsageLedger::WriteBatch(std::vector<Pending>& batch) {
  std::map<SpendKey, PeriodSpend> spend;
  std::set<AlertKey> fired;
  std::vector<std::pair<ChargeRecord, double>> costs;
  Status st = CommitBatch(batch, spend, fired, costs);
  std::function<void()> on_alert;
  std::function<void(const std::vector<std::pair<ChargeRecord, double>>&)> on_commit;
  {
    std::lock_guard lock(state_mu_);
    if (st) {
      for (auto& [k, v] : spend) spend_[k] = std::move(v);
      const size_t before = fired_.size();
      fired_.insert(fired.begin(), fired.end());
      stats_.alerts += fired_.size() - before;
      // Past periods are only in the database: a long-running daemon's
      // memory does not grow by a period's worth per tenant every day.
      const int64_t now = static_cast<int64_t>(options_.clock());
      std::erase_if(spend_, [&](const auto& e) { return std::get<2>(e.first) < PeriodStart(std::get<1>(e.first), now); });
      std::erase_if(fired_, [&](const AlertKey& k) { return std::get<2>(k) < PeriodStart(std::get<1>(k), now); });
      std::erase_if(refused_, [&](const SpendKey& k) { return std::get<2>(k) < PeriodStart(std::get<1>(k), now); });
      stats_.commits += 1;
      stats_.charges += static_cast<uint64_t>(std::count_if(batch.begin(), batch.end(), [](const Pending& p) { return !p.refusal; }));
    } else {
      // Not recorded: the next refusal of the period tries again.
      for (const auto& p : batch)
        if (p.refusal) refused_.erase({p.refusal->tenant, p.refusal->period, p.refusal->period_start});
    }
    on_alert = alert_listener_;
    on_commit = commit_listener_;
  }
  if (!st) log::Error("usage ledger: a batch of " + std::to_string(batch.size()) + " charges was not committed: " +
                      st.error().message());
  // A batch of refusals only charged nothing: the commit metrics count charging commits.
  if (st && on_commit && !costs.empty()) on_commit(costs);
  for (auto& p : batch) {
    if (p.done) p.done(st);
  }
  if (st && !fired.empty() && on_alert) on_alert();
}

Status UsageLedger::CommitBatch(std::vector<Pending>& batch, std::map<SpendKey, PeriodSpend>& spend,
                                std::set<AlertKey>& fired, std::vector<std::pair<ChargeRecord, double>>& costs) {
  const BudgetPolicy& policy = options_.policy;
  const double now_exact = options_.clock();
  const int64_t now = static_cast<int64_t>(now_exact);
  std::lock_guard db_lock(db_mu_);
  MOE_TRY(Exec("BEGIN IMMEDIATE"));
  auto rollback = [&](Error e) -> Status {
    (void)Exec("ROLLBACK");
    return Fail(std::move(e));
  };
  Stmt upsert(db_, "INSERT INTO usage(tenant, tier, period, period_start, requests, input, cached_input, output, "
                   "reasoning, cost_usd) VALUES(?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9) "
                   "ON CONFLICT(tenant, tier, period, period_start) DO UPDATE SET requests = requests + 1, "
                   "input = input + ?5, cached_input = cached_input + ?6, output = output + ?7, "
                   "reasoning = reasoning + ?8, cost_usd = cost_usd + ?9");
  if (!upsert.ok()) return rollback(DbError(db_, "preparing the usage update"));
  Stmt refusal(db_, "INSERT OR IGNORE INTO refusals(tenant, period, period_start, refused_usd, at) VALUES(?, ?, ?, ?, ?)");
  if (!refusal.ok()) return rollback(DbError(db_, "preparing the refusal insert"));
  HourlyUsageWriter hourly(db_);  // the same transaction, so the hours add up to the periods
  std::set<std::string> tenants;
  std::map<SpendKey, double> refused;  // this batch's refusals -> the refused amount
  {
    std::lock_guard lock(state_mu_);
    for (const auto& p : batch) {
      for (BudgetPeriod period : kAllPeriods) {
        SpendKey key{p.record.tenant, period, PeriodStart(period, now)};
        if (!spend.contains(key)) {
          auto it = spend_.find(key);
          spend[key] = it == spend_.end() ? PeriodSpend{} : it->second;
        }
      }
    }
  }
  for (const auto& p : batch) {
    if (p.refusal) {
      const RefusalRow& f = *p.refusal;
      refusal.Bind(1, f.tenant).Bind(2, std::string(PeriodName(f.period))).Bind(3, f.period_start);
      refusal.Bind(4, f.refused_usd).Bind(5, f.at);
      if (refusal.Step() != SQLITE_DONE) return rollback(DbError(db_, "recording a refusal"));
      refusal.Reset();
      refused.emplace(SpendKey{f.tenant, f.period, f.period_start}, f.refused_usd);
      tenants.insert(f.tenant);
      continue;
    }
    const ChargeRecord& r = p.record;
    const double cost = policy.Cost(r.tier, r.tokens);
    costs.emplace_back(r, cost);
    if (Status st = hourly.Add(r.tenant, r.tier, now, r.tokens, cost); !st) return rollback(st.error());
    tenants.insert(r.tenant);
    for (BudgetPeriod period : kAllPeriods) {
      const int64_t start = PeriodStart(period, now);
      upsert.Bind(1, r.tenant).Bind(2, r.tier).Bind(3, std::string(PeriodName(period))).Bind(4, start);
      upsert.Bind(5, r.tokens.input).Bind(6, r.tokens.cached_input).Bind(7, r.tokens.output).Bind(8, r.tokens.reasoning);
      upsert.Bind(9, cost);
      if (upsert.Step() != SQLITE_DONE) return rollback(DbError(db_, "updating usage"));
      upsert.Reset();
      PeriodSpend& s = spend[{r.tenant, period, start}];
      s.spent_usd += cost;
      s.tokens += r.tokens;
      auto& tier = s.by_tier[r.tier];
      tier.first += r.tokens;
      tier.second += cost;
    }
  }
  // Thresholds this batch reached for the first time in their period.
  Stmt alert(db_, "INSERT INTO alerts(tenant, period, period_start, threshold, fired_at) VALUES(?, ?, ?, ?, ?)");
  Stmt outbox(db_, "INSERT INTO outbox(id, hook, body, created_at, attempts, next_attempt_at, state) "
                   "VALUES(?, ?, ?, ?, 0, ?, 'pending')");
  if (!alert.ok() || !outbox.ok()) return rollback(DbError(db_, "preparing the alert inserts"));
  for (const std::string& tenant : tenants) {
    for (const Budget* b : policy.BudgetsFor(tenant)) {
      const int64_t start = PeriodStart(b->period, now);
      const PeriodSpend& s = spend[{tenant, b->period, start}];
      // A refusal in this period fires a `block` budget's 100% threshold (ThresholdsToFire).
      const auto refusal_of = refused.find({tenant, b->period, start});
      const bool refused_here = refusal_of != refused.end();
      auto already_fired = [&](double t) {
        const AlertKey key{tenant, b->period, start, t};
        std::lock_guard lock(state_mu_);
        return fired.contains(key) || fired_.contains(key);
      };
      for (const auto& [t, by_refusal] : ThresholdsToFire(*b, s.spent_usd, refused_here, already_fired)) {
        const AlertKey key{tenant, b->period, start, t};
        alert.Bind(1, tenant).Bind(2, std::string(PeriodName(b->period))).Bind(3, start).Bind(4, t).Bind(5, now);
        if (alert.Step() != SQLITE_DONE) return rollback(DbError(db_, "recording an alert"));
        alert.Reset();
        const ThresholdCrossing c{tenant, b, start, t, s, now,
                                  by_refusal ? std::optional<double>(refusal_of->second) : std::nullopt};
        for (const HookConfig& h : policy.hooks) {
          outbox.Bind(1, RandomId("dlv_")).Bind(2, h.name).Bind(3, AlertBody(c, policy, h.format));
          outbox.Bind(4, now_exact).Bind(5, now_exact);
          if (outbox.Step() != SQLITE_DONE) return rollback(DbError(db_, "queueing a delivery"));
          outbox.Reset();
        }
        fired.insert(key);
        log::Info("budget: tenant " + tenant + " reached " + std::to_string(static_cast<int>(t * 100 + 0.5)) +
                  "% of its " + std::string(PeriodName(b->period)) + " budget" +
                  (by_refusal ? " (a request was refused)" : ""));
      }
    }
  }
  if (Status st = Exec("COMMIT"); !st) return rollback(st.error());
  return Ok();
}

Result<std::vector<UsageRow>> UsageLedger::Rows(const std::optional<std::string>& tenant) const {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, tenant ? "SELECT tenant, tier, period, period_start, requests, input, cached_input, output, reasoning, "
                       "cost_usd FROM usage WHERE tenant = ? ORDER BY tenant, tier, period, period_start"
                     : "SELECT tenant, tier, period, period_start, requests, input, cached_input, output, reasoning, "
                       "cost_usd FROM usage ORDER BY tenant, tier, period, period_start");
  if (!q.ok()) return Fail(DbError(db_, "reading usage"));
  if (tenant) q.Bind(1, *tenant);
  std::vector<UsageRow> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    UsageRow r;
    r.tenant = q.Text(0);
    r.tier = q.Text(1);
    r.period = ParsePeriod(q.Text(2)).value_or(BudgetPeriod::kDay);
    r.period_start = q.Int(3);
    r.requests = q.Int(4);
    r.tokens = {q.Int(5), q.Int(6), q.Int(7), q.Int(8)};
    r.cost_usd = q.Real(9);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return Fail(DbError(db_, "reading usage"));
  return out;
}

PeriodSpend UsageLedger::Spent(const std::string& tenant, BudgetPeriod period, int64_t period_start) const {
  std::lock_guard lock(state_mu_);
  auto it = spend_.find({tenant, period, period_start});
  return it == spend_.end() ? PeriodSpend{} : it->second;
}

LedgerStats UsageLedger::stats() const {
  std::lock_guard lock(state_mu_);
  return stats_;
}

Result<std::vector<OutboxEntry>> UsageLedger::DueDeliveries(double now, int limit) const {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, "SELECT id, hook, body, created_at, attempts, next_attempt_at FROM outbox "
              "WHERE state = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?");
  if (!q.ok()) return Fail(DbError(db_, "reading the outbox"));
  q.Bind(1, now).Bind(2, static_cast<int64_t>(limit));
  std::vector<OutboxEntry> out;
  while (q.Step() == SQLITE_ROW) {
    out.push_back({q.Text(0), q.Text(1), q.Text(2), q.Real(3), static_cast<int>(q.Int(4)), q.Real(5)});
  }
  return out;
}

std::optional<double> UsageLedger::NextDeliveryAt() const {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, "SELECT MIN(next_attempt_at) FROM outbox WHERE state = 'pending'");
  if (!q.ok() || q.Step() != SQLITE_ROW || q.Null(0)) return std::nullopt;
  return q.Real(0);
}

Status UsageLedger::MarkDelivered(const std::string& id) {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, "UPDATE outbox SET state = 'delivered', attempts = attempts + 1 WHERE id = ?");
  q.Bind(1, id);
  if (!q.ok() || q.Step() != SQLITE_DONE) return Fail(DbError(db_, "marking a delivery"));
  return Ok();
}

Status UsageLedger::MarkFailed(const std::string& id, const std::string& reason) {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, "UPDATE outbox SET state = 'failed', last_error = ? WHERE id = ?");
  q.Bind(1, reason).Bind(2, id);
  if (!q.ok() || q.Step() != SQLITE_DONE) return Fail(DbError(db_, "marking a delivery"));
  return Ok();
}

Status UsageLedger::Reschedule(const std::string& id, int attempts, double next_attempt_at) {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, "UPDATE outbox SET attempts = ?, next_attempt_at = ? WHERE id = ?");
  q.Bind(1, static_cast<int64_t>(attempts)).Bind(2, next_attempt_at).Bind(3, id);
  if (!q.ok() || q.Step() != SQLITE_DONE) return Fail(DbError(db_, "rescheduling a delivery"));
  return Ok();
}

Result<int64_t> UsageLedger::CountDeliveries(const std::string& state) const {
  std::lock_guard lock(db_mu_);
  Stmt q(db_, "SELECT COUNT(*) FROM outbox WHERE state = ?");
  q.Bind(1, state);
  if (!q.ok() || q.Step() != SQLITE_ROW) return Fail(DbError(db_, "counting deliveries"));
  return q.Int(0);
}

}  // namespace moeserve::daemon
