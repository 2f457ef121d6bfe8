// What the operator keeps of a QuotaPolicy's budgets between syncs: the
// budget record, ConfigMap `BudgetRecordName(namespace, policy)` in the
// operator's own namespace, where tenants cannot write (one object, so one
// write commits a sync):
//   totals.json  the summed usage and each pod's last read (usage_totals.hpp)
//   alerts.json  every threshold alert of the current periods, and of older
//                ones still being delivered, each with the facts of its
//                crossing (spend, budget, action, deployments, hook formats)
//   spend.json   the global spend daemons start from (global_spend.hpp)
// and the parts QuotaPolicy.status shows: status.usage and status.alerts.
// A body is never stored: every post of an alert (a retry, by this operator
// or the next) is rebuilt from its record (AlertBodyOf), the same bytes under
// the same id. The tenant's namespace gets only a copy of spend.json
// (ConfigMap `<policy>-budget`, mounted by daemons that start), which the
// operator writes and never reads.
//
// An alert is decided once per tenant, period, period start and threshold:
// a threshold the summed spend has reached that neither alerts.json nor
// status.alerts holds yet. Both are read, so a ConfigMap lost or replaced by
// hand repeats no alert that status recorded.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/budget/global_spend.hpp"
#include "moeserve/operator/usage_totals.hpp"

namespace moeserve::op {

struct AlertRecord {
  std::string tenant;
  BudgetPeriod period = BudgetPeriod::kDay;
  int64_t period_start = 0;
  double threshold = 0;
  int64_t fired_at = 0;
  std::string delivery_id;
  bool delivered = false;
  bool abandoned = false;                 // retried past the give-up time; delivered stays false
  // The crossing as it was when the alert fired (undelivered alerts only):
  // what its body is rebuilt from.
  PeriodSpend spend;
  double budget_usd = 0;
  BudgetAction action = BudgetAction::kAlert;
  std::string deployment;                 // the payload's "deployment"
  std::vector<std::string> formats;       // "json" / "slack": the hook formats in use when it fired
  std::optional<double> refused_usd;      // reached by a refusal (budget_rules.hpp): the refused worst case
  std::vector<std::string> delivered_to;  // hooks that answered 2xx
};

// The body `a` is posted with to a hook of `format` under QuotaPolicy
// `policy_name`: AlertBody over the recorded crossing, so the same record
// gives the same bytes every time.
std::string AlertBodyOf(const AlertRecord& a, const std::string& policy_name, HookFormat format);
// The record's name for a hook format ("json" / "slack").
std::string FormatName(HookFormat format);

struct BudgetRecord {
  UsageTotals totals;
  std::vector<AlertRecord> alerts;
};

// ConfigMap data (key -> text) to a record; a missing key reads as empty.
// Every field is type-checked; an error names the entry.
Result<BudgetRecord> ParseBudgetRecord(const nlohmann::json& configmap_data);
// The ConfigMap's data for `record`, with spend.json for `policy`.
nlohmann::json BudgetRecordData(const BudgetRecord& record, const std::string& policy, int64_t replicas, int64_t now);

// status.usage: per tenant, period and start, all tiers together.
nlohmann::json StatusUsage(const UsageTotals& totals);
// status.alerts: the records without their crossings.
nlohmann::json StatusAlerts(const std::vector<AlertRecord>& alerts);
// status.alerts back to records (for the union with alerts.json); bad entries are skipped.
std::vector<AlertRecord> ParseStatusAlerts(const nlohmann::json& alerts);

// The alerts `totals` call for under `policy` that `known` does not hold,
// with their crossings and fresh delivery ids; policy.deployment_name is
// what the payload's "deployment" says. A refusal a daemon reported (the
// readings' `refusals`) reaches the 100% threshold of the tenant's `block`
// budgets of that period even where the summed spend stops short of it.
std::vector<AlertRecord> NewAlerts(const UsageTotals& totals, const BudgetPolicy& policy,
                                   const std::vector<AlertRecord>& known, int64_t now,
                                   const RefusalMap& refusals = {});

// The global spend to hand `pod` (nullopt pod: the ConfigMap's copy, for every pod).
GlobalSpend SpendFor(const UsageTotals& totals, const std::string& policy, int64_t replicas, int64_t now,
                     const std::optional<std::string>& pod);

// Whether two alerts are the same decision (tenant, period, start, threshold).
bool SameAlert(const AlertRecord& a, const AlertRecord& b);

}  // namespace moeserve::op
