#include "moeserve/daemon/usage/budget_service.hpp"

#include <cmath>
#include <cstdio>

#include "moeserve/budget/budget_rules.hpp"
#include "moeserve/daemon/metrics.hpp"

namespace moeserve::daemon {

namespace {
std::string Usd(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "$%.2f", v);
  return buf;
}
}  // namespace

Result<std::unique_ptr<BudgetService>> BudgetService::Create(BudgetServiceOptions options, DaemonMetrics* metrics) {
  std::unique_ptr<BudgetService> s(new BudgetService(std::move(options), metrics));
  UsageLedger::Options lo;
  lo.path = s->options_.ledger_path;
  lo.clock = s->options_.clock;
  lo.policy = s->options_.policy;
  MOE_ASSIGN_OR_RETURN(s->ledger_, UsageLedger::Open(std::move(lo)));
  for (const auto& b : s->options_.policy.budgets) {
    if (b.tenant != "*") s->tenants_.insert(b.tenant);
  }
  const int64_t now = static_cast<int64_t>(s->options_.clock());
  if (auto rows = s->ledger_->Rows(std::nullopt)) {
    for (const auto& r : *rows) {
      if (r.period_start == PeriodStart(r.period, now)) s->tenants_.insert(r.tenant);
    }
  }
  if (metrics) {
    s->ledger_->SetCommitListener([metrics](const std::vector<std::pair<ChargeRecord, double>>& costs) {
      for (const auto& [r, usd] : costs) metrics->AddCost(r.tenant, r.tier, usd);
      metrics->AddLedgerCommit(costs.size());
    });
  }
  if (s->options_.spend_from_operator && !s->options_.policy.hooks.empty())
    return Fail(Error::InvalidArgument("hooks and spend_from_operator exclude each other: under an operator the "
                                       "operator fires the policy's hooks"));
  if (!s->options_.policy.hooks.empty()) {
    std::function<void(const std::string&)> on_result;
    if (metrics) on_result = [metrics](const std::string& result) { metrics->AddAlertDelivery(result); };
    s->outbox_ = std::make_unique<HookOutbox>(*s->ledger_, s->options_.retry, std::move(on_result));
    s->ledger_->SetAlertListener([o = s->outbox_.get()] { o->Wake(); });
    s->outbox_->Start();  // deliveries left pending by the last run go out now
  }
  return s;
}

BudgetService::~BudgetService() { Stop(); }

void BudgetService::Stop() {
  if (outbox_) outbox_->Stop();
}

RateLimits BudgetService::LimitsFor(const std::string& tenant) const {
  RateLimits l;
  auto tighter = [](int64_t have, int64_t add) { return add > 0 && (have == 0 || add < have) ? add : have; };
  for (const Budget* b : options_.policy.BudgetsFor(tenant)) {
    l.requests_per_minute = tighter(l.requests_per_minute, b->requests_per_minute);
    l.tokens_per_minute = tighter(l.tokens_per_minute, b->tokens_per_minute);
  }
  // Replicas share a policy's limits: each takes its part, rounded up so a
  // small limit never becomes none.
  int64_t replicas;
  {
    std::lock_guard lock(global_mu_);
    replicas = replicas_;
  }
  auto part = [replicas](int64_t v) { return v > 0 ? (v + replicas - 1) / replicas : v; };
  l.requests_per_minute = part(l.requests_per_minute);
  l.tokens_per_minute = part(l.tokens_per_minute);
  return l;
}

ApiResult<BudgetService::Admission> BudgetService::Admit(const Principal& who, const std::string& tier) {
  if (!(who.tiers & TierBit(tier))) {
    return ApiFail(ApiError{403, "permission_error", "tier_not_allowed",
                            "Tenant " + who.tenant + " may not use the " + tier + " tier (allowed: " +
                                TierSetNames(who.tiers) + "); choose another reasoning_effort",
                            "reasoning_effort", 0});
  }
  Admission a{tier, false};
  const int64_t now = static_cast<int64_t>(options_.clock());
  const auto budgets = options_.policy.BudgetsFor(who.tenant);
  for (const Budget* b : budgets) {
    if (b->action != BudgetAction::kBlock) continue;
    const int64_t start = PeriodStart(b->period, now);
    const double spent = EffectiveSpentUsd(who.tenant, b->period, start);
    if (!LimitReached(spent, b->limit_usd)) continue;
    const std::string name(PeriodAdjective(b->period));
    return ApiFail(ApiError{403, "permission_error", "budget_exceeded",
                            "Tenant " + who.tenant + " has spent " + Usd(spent) + " of its " + name +
                                " budget of " + Usd(b->limit_usd) + " (policy " + options_.policy.policy_name +
                                ", budget for " + (b->tenant == "*" ? std::string("every tenant") : "tenant " + b->tenant) +
                                "); it resets at " + Iso8601Utc(NextPeriodStart(b->period, now)),
                            "", 0});
  }
  const RateLimits limits = LimitsFor(who.tenant);
  if (auto d = limiter_.Admit(who.tenant, limits); !d.allowed) {
    return ApiFail(ApiError::RateLimited(
        "Tenant " + who.tenant + " is over its " +
            (d.by_tokens ? "tokens-per-minute limit of " + std::to_string(limits.tokens_per_minute)
                         : "requests-per-minute limit of " + std::to_string(limits.requests_per_minute)) +
            "; retry after " + std::to_string(d.retry_after_seconds) + " s",
        d.retry_after_seconds));
  }
  for (const Budget* b : budgets) {
    if (b->action != BudgetAction::kDowngrade || tier == "low") continue;
    if (LimitReached(EffectiveSpentUsd(who.tenant, b->period, PeriodStart(b->period, now)), b->limit_usd)) {
      a.tier = "low";
      a.downgraded = true;
    }
  }
  return a;
}

ApiResult<std::unique_ptr<BudgetService::Reservation>> BudgetService::Reserve(const Principal& who,
                                                                                const std::string& tier,
                                                                                int64_t prompt_tokens,
                                                                                int64_t max_tokens) {
  const double worst = std::max(options_.policy.Cost(tier, TokenCounts{prompt_tokens, 0, max_tokens, 0}),
                                options_.policy.Cost(tier, TokenCounts{prompt_tokens, 0, 0, max_tokens}));
  const int64_t now = static_cast<int64_t>(options_.clock());
  // One lock over check and hold: two requests of a tenant cannot both see
  // the same room.
  std::lock_guard lock(held_mu_);
  Held& held = held_[who.tenant];
  if (held.requests >= options_.max_concurrent_per_tenant) {
    return ApiFail(ApiError{429, "rate_limit_error", "too_many_concurrent_requests",
                            "Tenant " + who.tenant + " already has " + std::to_string(held.requests) +
                                " requests in flight, its limit (max_concurrent_per_tenant); retry when one has finished",
                            "", 1});
  }
  for (const Budget* b : options_.policy.BudgetsFor(who.tenant)) {
    if (b->action != BudgetAction::kBlock) continue;
    const double spent = EffectiveSpentUsd(who.tenant, b->period, PeriodStart(b->period, now));
    if (FitsWithinLimit(spent + held.usd + worst, b->limit_usd)) continue;
    const std::string name(PeriodAdjective(b->period));
    const double held_usd = held.usd;
    // Spend stops short of the limit here, so this refusal is the budget's
    // 100% for alerting (budget_rules.hpp); the ledger fires it once a period.
    if (RefusalReachesLimit(spent, worst, b->limit_usd)) ledger_->Refused(who.tenant, b->period, worst);
    if (held.requests == 0) held_.erase(who.tenant);  // `held` is gone from here on
    return ApiFail(ApiError{403, "permission_error", "budget_exceeded",
                            "Tenant " + who.tenant + " has spent " + Usd(spent) + " of its " + name + " budget of " +
                                Usd(b->limit_usd) + " (policy " + options_.policy.policy_name + ", budget for " +
                                (b->tenant == "*" ? std::string("every tenant") : "tenant " + b->tenant) +
                                ") and its requests in flight hold up to " + Usd(held_usd) +
                                "; this request could cost up to " + Usd(worst) + " (" + std::to_string(prompt_tokens) +
                                " prompt tokens, max_tokens " + std::to_string(max_tokens) +
                                "): lower max_tokens or wait for the requests in flight; the budget resets at " +
                                Iso8601Utc(NextPeriodStart(b->period, now)),
                            "", 0});
  }
  ++held.requests;
  held.usd += worst;
  return std::unique_ptr<Reservation>(new Reservation(*this, who.tenant, worst));
}

BudgetService::Reservation::~Reservation() { service_.Release(tenant_, usd_); }

void BudgetService::Release(const std::string& tenant, double usd) {
  std::lock_guard lock(held_mu_);
  auto it = held_.find(tenant);
  if (it == held_.end()) return;
  it->second.usd = std::max(0.0, it->second.usd - usd);
  if (--it->second.requests <= 0) held_.erase(it);
}

void BudgetService::Charge(ChargeRecord record, UsageLedger::Done done) {
  limiter_.Consume(record.tenant, LimitsFor(record.tenant), record.tokens.total());
  {
    std::lock_guard lock(tenants_mu_);
    tenants_.insert(record.tenant);
  }
  ledger_->Charge(std::move(record), std::move(done));
}

ApiResult<nlohmann::json> BudgetService::Usage(const Principal& who) const {
  auto rows = ledger_->Rows(who.admin ? std::nullopt : std::optional<std::string>(who.tenant));
  if (!rows) return ApiFail(ApiError::Internal("The usage ledger could not be read: " + rows.error().message()));
  nlohmann::json data = nlohmann::json::array();
  for (const auto& r : *rows) {
    data.push_back({{"tenant", r.tenant},
                    {"tier", r.tier},
                    {"period", PeriodName(r.period)},
                    {"period_start", Iso8601Utc(r.period_start)},
                    {"requests", r.requests},
                    {"tokens",
                     {{"input", r.tokens.input},
                      {"cached_input", r.tokens.cached_input},
                      {"output", r.tokens.output},
                      {"reasoning", r.tokens.reasoning}}},
                    {"cost_usd", r.cost_usd}});
  }
  auto refusals = ledger_->Refusals(who.admin ? std::nullopt : std::optional<std::string>(who.tenant));
  if (!refusals) return ApiFail(ApiError::Internal("The usage ledger could not be read: " + refusals.error().message()));
  nlohmann::json refused = nlohmann::json::array();
  for (const auto& r : *refusals) {
    refused.push_back({{"tenant", r.tenant},
                       {"period", PeriodName(r.period)},
                       {"period_start", Iso8601Utc(r.period_start)},
                       {"refused_usd", r.refused_usd},
                       {"at", Iso8601Utc(r.at)}});
  }
  return nlohmann::json{{"object", "list"},
                        {"ledger_id", ledger_->ledger_id()},
                        {"data", std::move(data)},
                        {"refusals", std::move(refused)}};
}

double BudgetService::EffectiveSpentUsd(const std::string& tenant, BudgetPeriod period, int64_t period_start) const {
  const double local = ledger_->Spent(tenant, period, period_start).spent_usd;
  std::lock_guard lock(global_mu_);
  auto it = global_.find({tenant, period, period_start});
  if (it == global_.end()) return local;
  return it->second.spent_usd + std::max(0.0, local - it->second.counted_here_usd);
}

ApiResult<nlohmann::json> BudgetService::SetGlobalSpend(const GlobalSpend& spend) {
  if (!options_.spend_from_operator)
    return ApiFail(ApiError{409, "invalid_request_error", "not_under_operator",
                            "This daemon is standalone (spend_from_operator is off): it keeps its own budgets and "
                            "fires its own hooks",
                            "", 0});
  if (spend.policy != options_.policy.policy_name)
    return ApiFail(ApiError{409, "invalid_request_error", "wrong_policy",
                            "This daemon follows QuotaPolicy " + options_.policy.policy_name + ", not " + spend.policy,
                            "policy", 0});
  std::map<std::tuple<std::string, BudgetPeriod, int64_t>, Shared> next;
  for (const auto& e : spend.spend) {
    // Without counted_here_usd (the ConfigMap's copy), what this ledger holds now is taken as counted.
    const double counted = e.counted_here_usd ? *e.counted_here_usd
                                              : ledger_->Spent(e.tenant, e.period, e.period_start).spent_usd;
    next[{e.tenant, e.period, e.period_start}] = {e.spent_usd, counted};
    std::lock_guard lock(tenants_mu_);
    tenants_.insert(e.tenant);
  }
  {
    std::lock_guard lock(global_mu_);
    global_ = std::move(next);
    replicas_ = spend.replicas;
  }
  return nlohmann::json{{"policy", spend.policy}, {"entries", spend.spend.size()}, {"replicas", spend.replicas}};
}

void BudgetService::RefreshMetrics() {
  if (!metrics_) return;
  std::set<std::string> tenants;
  {
    std::lock_guard lock(tenants_mu_);
    tenants = tenants_;
  }
  const int64_t now = static_cast<int64_t>(options_.clock());
  for (const auto& tenant : tenants) {
    for (const Budget* b : options_.policy.BudgetsFor(tenant)) {
      const double spent = EffectiveSpentUsd(tenant, b->period, PeriodStart(b->period, now));
      const double remaining = b->limit_usd > 0 ? std::max(0.0, 1.0 - spent / b->limit_usd) : 0.0;
      metrics_->SetBudget(tenant, std::string(PeriodName(b->period)), b->limit_usd, remaining);
    }
  }
}

}  // namespace moeserve::daemon
