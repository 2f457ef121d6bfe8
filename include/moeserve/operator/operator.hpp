// moe-operator's runtime: informers feeding a rate-limited work queue,
// workers running the MoEDeployment reconciler (only while leading, when
// leader election is on), controller metrics and health endpoints.
//
// Thread safety: Run blocks on the calling thread; RequestStop and the
// accessors may be called from any thread.
#pragma once

#include <atomic>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "moeserve/operator/hook_secret_source.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/leader_election.hpp"
#include "moeserve/operator/quota_controller.hpp"
#include "moeserve/operator/reconciler.hpp"
#include "moeserve/operator/autoscaler.hpp"
#include "moeserve/operator/usage_sync.hpp"
#include "moeserve/operator/work_queue.hpp"

namespace moeserve::op {

struct OperatorOptions {
  std::string watch_namespace;  // "" = all namespaces
  // Several namespaces (moe-operator --watch-namespace, repeated): listed
  // across the cluster, acted on only there. Empty: as watch_namespace says.
  std::vector<std::string> watch_namespaces;
  int workers = 4;
  bool leader_elect = false;
  LeaderElectionOptions election;
  InformerOptions informer;
  RateLimiterOptions rate_limits;
  MoEDeploymentReconcilerOptions reconciler;
  std::string metrics_addr;  // host:port or :port; "" or "0" = off
  std::string health_addr;
  // QuotaPolicies are read and enforced (reconciler.quota, when unset, is
  // the quota decision); the validating webhook serves when webhook.addr is set.
  WebhookOptions webhook;
  // Budgets: the usage sync runs while leading (interval 0: off).
  UsageSyncOptions usage_sync;
  // Its hooks' keys (hook_secret_source.hpp): Secrets in the operator's
  // namespace (webhook.operator_namespace), Vault paths under
  // hook_secrets.vault_prefix through hook_vault (VaultIntegration::vault_source();
  // null: Vault off) as the operator's own role. MoEDeployments may name
  // nothing under that prefix.
  SecretSource* hook_vault = nullptr;
  HookSecretOptions hook_secrets;
  // spec.autoscaling: the autoscaler runs while leading (interval 0: off).
  AutoscalerOptions autoscaler;
};

class Operator {
 public:
  Operator(KubeClient& client, OperatorOptions options);
  ~Operator();

  // Runs until RequestStop, or until leadership is lost (an error: a process
  // that lost its lease must not keep acting; the caller exits).
  Status Run();
  void RequestStop();

  bool Synced() const;
  bool Leading() const { return leading_; }
  uint64_t reconciles() const { return reconciles_; }
  uint64_t reconcile_errors() const { return reconcile_errors_; }
  size_t QueueDepth() const { return queue_.Len(); }
  const ObjectCache& moedeployments() const;
  const QuotaController& quota() const { return *quota_; }
  UsageSyncStats usage_sync_stats() const { return usage_sync_->stats(); }
  AutoscalerStats autoscaler_stats() const { return autoscaler_->stats(); }

 private:
  struct Metrics;
  struct Servers;
  void StartWorkers();
  void Worker();
  void EnqueueOwner(const json& object);

  KubeClient& client_;
  OperatorOptions options_;
  mutable WorkQueue queue_;
  std::unique_ptr<EventRecorder> events_;
  std::vector<std::unique_ptr<Informer>> informers_;
  Informer* md_informer_ = nullptr;
  ObjectCache secret_cache_;  // the deployments' own Secrets (never listed or watched)
  std::unique_ptr<MoEDeploymentReconciler> reconciler_;
  std::unique_ptr<QuotaController> quota_;
  std::unique_ptr<SecretSource> hook_secret_source_;  // when the reconciler's options name none
  std::unique_ptr<UsageSync> usage_sync_;
  std::unique_ptr<Autoscaler> autoscaler_;
  std::vector<std::thread> workers_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Servers> servers_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> leading_{false};
  std::atomic<bool> lost_leadership_{false};
  // Orders the elector's callbacks against shutdown: leadership gained while
  // Run() is already stopping must not start workers or the usage sync after
  // they were joined (they would never be joined again, and the process hung).
  std::mutex leadership_mu_;
  std::atomic<uint64_t> reconciles_{0}, reconcile_errors_{0};
};

// "host:port" or ":port" to an http:// listener URI; "" when off.
std::string ListenUri(const std::string& addr);

}  // namespace moeserve::op
