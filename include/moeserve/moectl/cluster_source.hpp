// Reads QuotaPolicies through the Kubernetes API (the operator's KubeClient,
// so the kubeconfig is found as moe-operator finds it: --kubeconfig, then
// $KUBECONFIG, then in-cluster, then ~/.kube/config) and turns their status
// (usage, alerts) and spec.budgets into moectl's rows. The status shape is
// docs/crds.md's: usage [{tenant, period, periodStart, spentUSD, tokens}],
// alerts [{tenant, period, periodStart, threshold, firedAt, deliveryId, delivered}].
//
// Thread safety: free functions, no shared state.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/moectl/usage_data.hpp"

namespace moeserve::moectl {

struct ClusterTarget {
  std::string kubeconfig;      // --kubeconfig; empty: as moe-operator resolves it
  std::string ns;              // --namespace; empty: the context's namespace
  bool all_namespaces = false;  // -A
  double timeout_s = 10;
};

// The QuotaPolicy objects (items of the list), sorted by namespace and name.
Result<std::vector<nlohmann::json>> ListQuotaPolicies(const ClusterTarget& target);

// From listed policies; a malformed entry is an error naming the policy.
Result<std::vector<UsageEntry>> UsageFromPolicies(const std::vector<nlohmann::json>& policies);
Result<std::vector<AlertEntry>> AlertsFromPolicies(const std::vector<nlohmann::json>& policies);
// Each budget per tenant: a tenant's own entries, else the "*" entries (as
// the daemon applies them), spend from the newest period in status.usage.
Result<std::vector<BudgetEntry>> BudgetsFromPolicies(const std::vector<nlohmann::json>& policies);

}  // namespace moeserve::moectl
