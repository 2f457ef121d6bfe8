// The QuotaPolicy reconciler: reports, through the status subresource, how
// much of a policy the MoEDeployments it governs use, and which of them it
// holds back. It decides nothing itself: each deployment is judged by
// DecideQuota, as the webhook and the MoEDeployment reconciler judge it.
//
// Conditions written (status.usage and status.alerts are left as they are):
//  - Ready: True (LimitsValid, message "GPUs 16/32, replicas 2/4 in 2
//    MoEDeployments") or False (InvalidLimits);
//  - QuotaExceeded: True (reason QuotaExceeded, naming the deployments held
//    at QuotaAdmitted=False) or False (WithinQuota).
//
// Thread safety: as Reconciler; one key is never reconciled twice at once.
#pragma once

#include "moeserve/operator/events.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/quota_admission.hpp"
#include "moeserve/operator/reconciler.hpp"

namespace moeserve::op {

class QuotaPolicyReconciler : public Reconciler {
 public:
  QuotaPolicyReconciler(KubeClient& client, ObjectCache& policies, const ObjectCache& moedeployments,
                        const QuotaAdmission& admission)
      : client_(client), policies_(policies), moedeployments_(moedeployments), admission_(admission) {}
  // key: "namespace/name" of a QuotaPolicy.
  Result<ReconcileResult> Reconcile(const std::string& key) override;

 private:
  KubeClient& client_;
  ObjectCache& policies_;
  const ObjectCache& moedeployments_;
  const QuotaAdmission& admission_;
};

}  // namespace moeserve::op
