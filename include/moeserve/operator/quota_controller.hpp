// Quota in the running operator: the QuotaPolicy informer, the decision
// over the caches (QuotaAdmission, also the MoEDeployment reconciler's
// QuotaCheck), the QuotaPolicy reconciler, and the validating webhook.
//
// Keys: QuotaPolicies share the operator's work queue under the prefix
// "quotapolicy:" (a MoEDeployment key, "namespace/name", never has a colon).
// What brings whom back: a QuotaPolicy change (of anything but its status,
// which the usage sync writes every interval) enqueues the policy and every
// MoEDeployment of its namespace; a MoEDeployment change enqueues the policy
// that governs it and, when one does, the other MoEDeployments it governs
// (one lowering its demand may admit another).
//
// Thread safety: Reconcile as Reconciler; handlers run on informer threads;
// Start/Stop from the operator's Run thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "moeserve/operator/admission_webhook.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/quota_admission.hpp"
#include "moeserve/operator/quota_reconciler.hpp"

namespace moeserve::op {

inline constexpr char kQuotaPolicyKeyPrefix[] = "quotapolicy:";

class QuotaController {
 public:
  QuotaController(KubeClient& client, const std::string& watch_namespace, const InformerOptions& informer,
                  WebhookOptions webhook, SchedulingPolicy scheduling, const ObjectCache& moedeployments,
                  std::function<void(const std::string& key)> enqueue);
  ~QuotaController();

  // The QuotaPolicy informer, handed once to the operator, which starts and
  // stops it with the others and keeps it alive longer than this controller.
  std::unique_ptr<Informer> TakeInformer() { return std::move(owned_informer_); }
  QuotaCheck Check() const;
  // The QuotaPolicy cache (the usage sync and the daemons' budgeting read it).
  const ObjectCache& policies() const { return informer_->cache(); }
  // The budgeting of the policy that governs `md` (empty when none does).
  MoEDeploymentSpec::Budgeting BudgetingOf(const json& md) const;
  static bool IsPolicyKey(const std::string& key) { return key.rfind(kQuotaPolicyKeyPrefix, 0) == 0; }
  Result<ReconcileResult> Reconcile(const std::string& key);
  // The operator's MoEDeployment informer tells us what changed.
  void OnMoEDeployment(const json& object);

  // The webhook (when --webhook-addr is set): every replica serves.
  Status StartWebhook();
  void SetLeading(bool leading);
  void Stop();
  const WebhookController* webhook() const { return webhook_.get(); }

 private:
  void EnqueuePolicyOf(const json& md);

  KubeClient& client_;
  WebhookOptions webhook_options_;
  const ObjectCache& moedeployments_;
  std::function<void(const std::string&)> enqueue_;
  std::unique_ptr<Informer> owned_informer_;
  Informer* informer_ = nullptr;
  std::unique_ptr<QuotaAdmission> admission_, webhook_admission_;
  std::unique_ptr<QuotaPolicyReconciler> reconciler_;
  std::unique_ptr<WebhookController> webhook_;
};

}  // namespace moeserve::op
