// The usage sync: every interval (30 s; --usage-sync-interval), while this
// operator leads, for each QuotaPolicy that governs MoEDeployments:
//  1. read the policy's budget record (budget_record.hpp: the summed usage,
//     each pod's last read, the alerts), ConfigMap
//     BudgetRecordName(namespace, policy) in the operator's own namespace
//     (record_namespace), where tenants cannot write: nothing a tenant can
//     write is read back, so none can plant an alert for the operator to
//     sign, lower the sum, or lift a block;
//  2. read GET /v1/usage with the operator's admin key from the node-rank-0
//     pod of every replica group of every MoEDeployment the policy governs
//     (DecideQuota's GoverningPolicy: the reference, else `default`), in
//     parallel; a pod that does not answer adds nothing this time;
//  3. fold the readings into the sum (usage_totals.hpp: resets count from
//     zero), decide the thresholds newly reached (one alert each, with a
//     fresh delivery id and the facts of its crossing), and write the
//     record: this one write commits the sync, so a crash before it counts
//     nothing and a crash after it loses nothing; then the daemons' copy of
//     spend.json in the tenant's namespace (ConfigMap <policy>-budget,
//     written, never read);
//  4. hand the global spend to every pod read (PUT /v1/admin/spend), so each
//     daemon applies the budgets' actions and its share of the rate limits;
//  5. write status.usage and status.alerts;
//  6. post the undelivered alerts to the policy's hooks (the daemon's
//     signed delivery, hook_sender.hpp), each body rebuilt from its record
//     (AlertBodyOf), retried with exponential backoff and jitter until
//     delivered or past the give-up time; then write the record and
//     status.alerts again.
// Nothing is remembered between syncs but the retry schedule: a new leader
// resends an undelivered alert at once, with the same id and body.
//
// Pods are trusted only when they are what the operator made: named
// <group>-0, controlled by the group's StatefulSet, itself controlled by the
// MoEDeployment (uids checked), so the admin key never goes to another pod.
//
// Thread safety: Start/Stop from one thread; SyncOnce from one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/operator/budget_record.hpp"
#include "moeserve/operator/daemon_admin_client.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/reconciler.hpp"

namespace moeserve::op {

struct UsageSyncOptions {
  std::chrono::milliseconds interval{std::chrono::seconds(30)};  // 0: off
  std::chrono::milliseconds request_timeout{std::chrono::seconds(5)};  // per daemon call and hook post
  int parallel = 16;  // daemon calls at once
  // Where budget records live: the operator's own namespace (moe-operator
  // --operator-namespace), which tenants cannot write.
  std::string record_namespace = "moeserve-system";
  double hook_initial_backoff_s = 5, hook_max_backoff_s = 600, hook_give_up_s = 86400;
};

// ConfigMap <policy>-budget in the policy's namespace: the daemons' copy of spend.json.
std::string BudgetConfigMapName(const std::string& policy);
// The budget record of QuotaPolicy <ns>/<policy>, in the operator's namespace:
// moeserve-budget.<ns>.<policy> (a digest of the pair when that is too long).
std::string BudgetRecordName(const std::string& ns, const std::string& policy);
// What a budget record carries: a label to find them, and whose it is.
inline constexpr char kBudgetRecordLabel[] = "moeserve.io/budget-record";
inline constexpr char kBudgetRecordNamespace[] = "moeserve.io/quota-policy-namespace";
inline constexpr char kBudgetRecordPolicy[] = "moeserve.io/quota-policy";
inline constexpr char kBudgetRecordPolicyUid[] = "moeserve.io/quota-policy-uid";

struct UsageSyncStats {
  uint64_t syncs = 0;             // policy syncs committed
  uint64_t pods_read = 0, pods_failed = 0, pushes_failed = 0;
  uint64_t alerts_fired = 0, deliveries = 0, delivery_failures = 0;
  double last_sync_seconds = 0;   // the last SyncOnce, every policy
};

class UsageSync {
 public:
  struct Caches {
    const ObjectCache* policies = nullptr;
    const ObjectCache* moedeployments = nullptr;
    const ObjectCache* statefulsets = nullptr;
    const ObjectCache* secrets = nullptr;
  };
  // `hook_secrets` resolves hooks[].secret (a secretRef or a Vault path).
  UsageSync(KubeClient& client, Caches caches, SecretSource& hook_secrets, UsageSyncOptions options);
  ~UsageSync();

  void Start();  // a thread syncing every interval until Stop
  void Stop();
  // Every policy once; errors are logged and counted, never fatal.
  void SyncOnce();
  UsageSyncStats stats() const;

 private:
  struct Pod {
    std::string key;  // namespace/name
    DaemonEndpoint endpoint;
  };
  Status SyncPolicy(const json& policy);
  std::vector<Pod> PodsOf(const json& md, std::vector<std::string>& problems);
  Result<BudgetPolicy> PolicyOf(const json& policy);
  // ConfigMap <policy>-budget in the policy's namespace, replaced whole.
  Status WriteSpendCopy(const json& policy, const std::string& spend_json);
  // Posts what is due; true when any alert changed.
  bool Deliver(const json& policy, BudgetPolicy& budget, std::vector<AlertRecord>& alerts);

  KubeClient& client_;
  Caches caches_;
  SecretSource& hook_secrets_;
  UsageSyncOptions options_;
  std::map<std::string, std::pair<int, double>> retry_;  // delivery id -> attempts, next attempt (unix s)
  mutable std::mutex stats_mu_;
  UsageSyncStats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve::op
