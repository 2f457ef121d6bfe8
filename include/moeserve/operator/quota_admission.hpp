// QuotaAdmission: the quota decision over the informers' caches, for the
// validating webhook (Review: an AdmissionReview body in, the answer out) and
// for the MoEDeployment reconciler (Check, its QuotaCheck). Both end in
// DecideQuota (quota_policy.hpp), so they never disagree.
//
// What the webhook refuses (403, the message names the policy, the limit,
// the requested and the allowed value, as `kubectl apply` prints it):
//  - CREATE of a MoEDeployment that DecideQuota does not admit;
//  - UPDATE of a MoEDeployment, or of its scale subresource (an
//    autoscaling/v1 Scale, judged as the stored MoEDeployment with the new
//    spec.replicas), that breaks a limit the previous state did not already
//    break as badly (NewOrWorse): lowering an over-quota deployment and
//    changes that leave its footprint alone (finalizers) pass.
// Everything else (DELETE, other resources) is allowed. A body that cannot
// be read is answered 400 with the reason, a spec that cannot be read or
// that the operator refuses (a device in spec.resources, a scheduling field
// past the platform's allow-list, a Vault path under the hook keys' reserved
// prefix or outside the QuotaPolicy's spec.vault.allowedPathPrefixes,
// vault_paths.hpp) is refused with 400 naming the field (an
// UPDATE that leaves such a stored spec unchanged passes, so finalizers can
// still go), and a scale of an object the cache has not seen yet
// with 503 (the API server retries or applies failurePolicy).
//
// What the webhook judges against: the namespace's QuotaPolicies and
// MoEDeployments read live from the API server (a cache lags by a watch
// event, and `kubectl apply` of two files in a row must see the first);
// without a reader, the caches. Reading fails -> 503, and the API server
// applies failurePolicy. Two MoEDeployments created at the same instant can
// still both be admitted; the reconciler then holds the newer one at
// QuotaAdmitted=False (first come, first served).
//
// Thread safety: const methods, safe from any thread; the caches lock inside.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/operator/admission_review.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/quota_policy.hpp"

namespace moeserve::op {

struct AdmissionHttpAnswer {
  int http_status = 200;
  std::string body;  // JSON
};

struct NamespaceObjects {
  std::vector<json> policies, deployments;
};
using NamespaceReader = std::function<Result<NamespaceObjects>(const std::string& ns)>;

class QuotaAdmission {
 public:
  QuotaAdmission(const ObjectCache& policies, const ObjectCache& moedeployments, NamespaceReader live = {},
                 SchedulingPolicy scheduling = {}, std::string reserved_vault_prefix = "",
                 std::string reserved_vault_role = "")
      : policies_(policies),
        moedeployments_(moedeployments),
        live_(std::move(live)),
        scheduling_(std::move(scheduling)),
        reserved_vault_prefix_(std::move(reserved_vault_prefix)),
        reserved_vault_role_(std::move(reserved_vault_role)) {}

  QuotaEvaluation Evaluate(const json& md, const MoEDeploymentSpec& spec) const;
  QuotaDecision Check(const json& md, const MoEDeploymentSpec& spec) const { return Evaluate(md, spec).decision; }
  AdmissionHttpAnswer Review(std::string_view body) const;

 private:
  json Decide(const AdmissionRequest& request) const;
  Result<NamespaceObjects> Read(const std::string& ns) const;

  const ObjectCache& policies_;
  const ObjectCache& moedeployments_;
  NamespaceReader live_;
  SchedulingPolicy scheduling_;  // what the webhook lets a spec ask of the scheduler
  // Hook keys' Vault prefix (--hook-vault-prefix), never a MoEDeployment's to name.
  std::string reserved_vault_prefix_;
  // The role hook keys are read with (--hook-vault-role), never a MoEDeployment's.
  std::string reserved_vault_role_;
};

}  // namespace moeserve::op
