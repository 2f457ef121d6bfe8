// Tenants' budgets as a chat request meets them: the tiers a tenant may use,
// its rate limits, its budgets' actions at 100%, the charge of a finished
// request into the durable ledger (usage_ledger.hpp), GET /v1/usage and the
// budget metrics. Owns the ledger and the hook outbox.
//
// Admit decides, in this order: a tier the tenant may not use is 403
// tier_not_allowed; a spent budget whose action is `block` is 403
// budget_exceeded (naming the budget and when it resets); a rate limit is
// 429 rate_limit_exceeded with Retry-After; a spent budget whose action is
// `downgrade` serves the request at `low` and says so.
//
// Reserve then holds the request's worst case (every prompt token at the
// input price, max_tokens at the dearer of the output and reasoning prices)
// against the tenant's `block` budgets until its charge is committed: a
// request whose worst case would pass a `block` budget, counting what the
// tenant's requests in flight hold, is 403 budget_exceeded, so parallel
// requests can no longer end past the limit together. It also counts the
// tenant's requests in flight against max_concurrent_per_tenant (429
// too_many_concurrent_requests past it), so one tenant cannot fill the queue.
// A refusal by a `block` budget here reaches that budget's 100% threshold
// for alerting (UsageLedger::Refused, budget_rules.hpp RefusalReachesLimit).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/budget/global_spend.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/usage/hook_outbox.hpp"
#include "moeserve/daemon/usage/rate_limiter.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"

namespace moeserve::daemon {

class DaemonMetrics;

struct BudgetServiceOptions {
  std::string ledger_path;  // empty: in memory
  BudgetPolicy policy;      // hook secrets already loaded
  HookRetryOptions retry;
  WallClock clock = SystemWallClock();
  bool spend_from_operator = false;
  int max_concurrent_per_tenant = 128;  // requests in flight per tenant; at least 1
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
  // What an admitted request holds until it is settled: a slot of its
  // tenant's concurrency and its worst-case cost. Destroying it releases
  // both; the holder destroys it once the request's charge is committed (or
  // the request ended without one: a refused submit, a crash of the sink).
  class Reservation {
   public:
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    double usd() const { return usd_; }

   private:
    friend class BudgetService;
    Reservation(BudgetService& service, std::string tenant, double usd)
        : service_(service), tenant_(std::move(tenant)), usd_(usd) {}
    BudgetService& service_;
    std::string tenant_;
    double usd_;
  };
  // After Admit, at the tier the request runs at: refuses it (above) or
  // holds its slot and worst case. The Reservation must not outlive the service.
  ApiResult<std::unique_ptr<Reservation>> Reserve(const Principal& who, const std::string& tier,
                                                  int64_t prompt_tokens, int64_t max_tokens);
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
  struct Held {
    int requests = 0;
    double usd = 0;
  };
  std::mutex held_mu_;  // taken before global_mu_/the ledger's, never after
  std::map<std::string, Held> held_;  // tenant -> what its requests in flight hold
  void Release(const std::string& tenant, double usd);
};

}  // namespace moeserve::daemon
