// Tenants' budgets as a chat request meets them: the tiers a tenant may use,
// its rate limits, its budgets' actions at 100%, the charge of a finished
// request into the durable ledger (usage_ledger.hpp), GET /v1/usage and the
// budget metrics. Owns the ledger and the hook outbox.
//
// Admit decides, in this order: a tier the tenant may not use is 403
// tier_not_allowed; a spent budget whose action is `block` is 403
// budget_exceeded (naming the budget and when it resets); a rate limit is
// 429 rate_limit_exceeded with Retry-After; a spent budget whose action is
// `downgrade` serves the request at `low` and says so. Spend is what the
// ledger committed: a request admitted while others of the tenant are still
// running may end past the limit (they are charged, never refused afterwards).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/global_spend.hpp"
#include "moeserve/daemon/api_error.hpp"
#include "moeserve/daemon/api_keys.hpp"
#include "moeserve/daemon/hook_outbox.hpp"
#include "moeserve/daemon/rate_limiter.hpp"
#include "moeserve/daemon/usage_ledger.hpp"

namespace moeserve::daemon {

class DaemonMetrics;

struct BudgetServiceOptions {
  std::string ledger_path;  // empty: in memory
  BudgetPolicy policy;      // hook secrets already loaded
  HookRetryOptions retry;
  WallClock clock = SystemWallClock();
  bool spend_from_operator = false;
};

class BudgetService {
 public:
  // `metrics` may be null (tests); otherwise it must outlive the service.
  static Result<std::unique_ptr<BudgetService>> Create(BudgetServiceOptions options, DaemonMetrics* metrics);
  ~BudgetService();

  struct Admission {
    std::string tier;          // the tier to serve at
    bool downgraded = false;   // by a spent `downgrade` budget
  };
  ApiResult<Admission> Admit(const Principal& who, const std::string& tier);
  // A finished (or ended) request's tokens; `done` runs once they are committed.
  void Charge(ChargeRecord record, UsageLedger::Done done);
  // The body of GET /v1/usage for `who`: its tenant's rows, or all for admin.
  ApiResult<nlohmann::json> Usage(const Principal& who) const;
  // The operator's global spend (PUT /v1/admin/spend, or the ConfigMap copy
  // at start). Fails (409 conflict) when this daemon is standalone or the
  // spend is another policy's.
  ApiResult<nlohmann::json> SetGlobalSpend(const GlobalSpend& spend);
  // What `tenant` spent in a period as budgets see it: the ledger's, or
  // under an operator the global spend plus what was charged here since.
  double EffectiveSpentUsd(const std::string& tenant, BudgetPeriod period, int64_t period_start) const;
  // moe_budget_remaining_ratio and moe_budget_limit_usd for the current periods.
  void RefreshMetrics();

  UsageLedger& ledger() { return *ledger_; }
  // Stops the outbox and commits what is queued.
  void Stop();

 private:
  BudgetService(BudgetServiceOptions options, DaemonMetrics* metrics)
      : options_(std::move(options)), metrics_(metrics), limiter_(options_.clock) {}
  RateLimits LimitsFor(const std::string& tenant) const;
  struct Shared {
    double spent_usd = 0;         // the policy's, over every daemon
    double counted_here_usd = 0;  // of which from this daemon's ledger
  };

  BudgetServiceOptions options_;
  DaemonMetrics* metrics_;
  RateLimiter limiter_;
  std::unique_ptr<UsageLedger> ledger_;
  std::unique_ptr<HookOutbox> outbox_;
  mutable std::mutex tenants_mu_;
  std::set<std::string> tenants_;  // tenants with budget gauges
  mutable std::mutex global_mu_;
  std::map<std::tuple<std::string, BudgetPeriod, int64_t>, Shared> global_;
  int64_t replicas_ = 1;
};

}  // namespace moeserve::daemon
