// What the operator keeps of a QuotaPolicy's budgets between syncs, in
// ConfigMap `<policy>-budget` (one object, so one write commits a sync):
//   totals.json  the summed usage and each pod's last read (usage_totals.hpp)
//   alerts.json  every threshold alert of the current periods, and of older
//                ones still being delivered; an undelivered one keeps the
//                exact bodies it is posted with, so a retry (by this
//                operator or the next) sends the same bytes under the same id
//   spend.json   the global spend daemons start from (global_spend.hpp)
// and the parts QuotaPolicy.status shows: status.usage and status.alerts.
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

#include "moeserve/common/budget_policy.hpp"
#include "moeserve/common/global_spend.hpp"
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
  bool abandoned = false;                     // retried past the give-up time; delivered stays false
  std::map<std::string, std::string> bodies;  // "json" / "slack" -> the body posted (undelivered only)
  std::vector<std::string> delivered_to;      // hooks that answered 2xx
};

struct BudgetRecord {
  UsageTotals totals;
  std::vector<AlertRecord> alerts;
};

// ConfigMap data (key -> text) to a record; a missing key reads as empty.
Result<BudgetRecord> ParseBudgetRecord(const nlohmann::json& configmap_data);
// The ConfigMap's data for `record`, with spend.json for `policy`.
nlohmann::json BudgetRecordData(const BudgetRecord& record, const std::string& policy, int64_t replicas, int64_t now);

// status.usage: per tenant, period and start, all tiers together.
nlohmann::json StatusUsage(const UsageTotals& totals);
// status.alerts: the records without their bodies.
nlohmann::json StatusAlerts(const std::vector<AlertRecord>& alerts);
// status.alerts back to records (for the union with alerts.json); bad entries are skipped.
std::vector<AlertRecord> ParseStatusAlerts(const nlohmann::json& alerts);

// The alerts `totals` call for under `policy` that `known` does not hold,
// with their bodies (one per hook format in use) and fresh delivery ids;
// policy.deployment_name is what the payload's "deployment" says.
std::vector<AlertRecord> NewAlerts(const UsageTotals& totals, const BudgetPolicy& policy,
                                   const std::vector<AlertRecord>& known, int64_t now);

// The global spend to hand `pod` (nullopt pod: the ConfigMap's copy, for every pod).
GlobalSpend SpendFor(const UsageTotals& totals, const std::string& policy, int64_t replicas, int64_t now,
                     const std::optional<std::string>& pod);

// Whether two alerts are the same decision (tenant, period, start, threshold).
bool SameAlert(const AlertRecord& a, const AlertRecord& b);

}  // namespace moeserve::op
