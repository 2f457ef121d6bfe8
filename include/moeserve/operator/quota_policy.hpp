// QuotaPolicy: its limits as the operator reads them, and the one function
// that decides whether a MoEDeployment fits them. The validating webhook and
// the MoEDeployment reconciler both call DecideQuota, so they never disagree.
//
// Which policy governs a MoEDeployment: the one spec.quotaPolicyRef names
// (in its namespace); without a reference, the namespace's default policy,
// the QuotaPolicy named `default`. A namespace with any QuotaPolicy is
// governed: a MoEDeployment there without a reference, where no `default`
// exists, is refused (QuotaPolicyRequired); a reference to a policy that does
// not exist is refused too (QuotaPolicyNotFound). A namespace without
// QuotaPolicies and a MoEDeployment without a reference: ungoverned, admitted.
//
// Sums (GPUs = replicas x nodesPerReplica x the device units each rendered
// pod requests, desired::ServerResources: gpusPerNode, since spec.resources
// may name no device; and replicas) run
// over the MoEDeployments of the namespace governed by the same policy that
// were created before this one (creationTimestamp, then name), plus this one;
// deployments being deleted do not count. First come, first served: when a
// policy is tightened or a deployment got in while the webhook was down, the
// newest deployments are the ones over quota, never the oldest.
//
// Thread safety: pure functions over values.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/reconciler.hpp"

namespace moeserve::op {

// The name that marks a namespace's default QuotaPolicy.
inline constexpr char kDefaultQuotaPolicy[] = "default";

// spec.limits; an unset limit does not limit.
struct QuotaLimits {
  std::optional<int64_t> max_gpus, max_replicas, max_context_tokens;
  std::optional<std::vector<std::string>> allowed_tiers;
  // images: registry or repository prefixes, matched up to a boundary ("/",
  // ":" or "@"), or digests ("sha256:<hex>", or "<repository>@sha256:<hex>")
  // the image must be pinned to (ImageAllowed).
  std::optional<std::vector<std::string>> allowed_images;
  // limits.allowGPUTolerationsWithoutGPUs: a MoEDeployment that requests no
  // GPU may still tolerate a GPU vendor's taint (kGpuVendors).
  bool allow_gpu_tolerations_without_gpus = false;
};

// Whether `image` is one an allowedImages entry allows.
bool ImageAllowed(const std::string& image, const std::string& entry);

// Reads spec.limits of a QuotaPolicy object. Errors (InvalidArgument) name the field.
Result<QuotaLimits> ParseQuotaLimits(const json& policy);

// What one MoEDeployment asks for.
struct QuotaDemand {
  int64_t gpus = 0;      // replicas x nodesPerReplica x device units per rendered pod
  int64_t replicas = 0;  // replica groups
  int64_t context_tokens = 0;
  std::set<std::string> tiers;  // thinking.defaultTier and every tier in thinking.budgets
  std::string image;
};
QuotaDemand DemandOf(const MoEDeploymentSpec& spec);

// One limit the deployment breaks. `requested` orders numeric violations
// (GPUs and replicas: the namespace total; context: the deployment's own);
// `detail` names what a set-valued limit refused (tiers, image).
struct QuotaViolation {
  // "limits.maxGPUs", "limits.allowedImages", "quotaPolicyRef", "spec.tolerations"
  std::string limit;
  int64_t requested = 0;
  std::string detail;
  std::string message;
};

struct QuotaEvaluation {
  std::string policy;  // the governing policy's name; "" when ungoverned
  std::vector<QuotaViolation> violations;
  int64_t namespace_gpus = 0, namespace_replicas = 0;  // this deployment and those before it
  QuotaDecision decision;
};

// `deployments` and `policies` are the objects of md's namespace (others are
// ignored), as a cache holds them; md itself may be among the deployments
// (matched by name and skipped). `spec` is md's parsed spec.
QuotaEvaluation DecideQuota(const json& md, const MoEDeploymentSpec& spec, const std::vector<json>& policies,
                            const std::vector<json>& deployments);

// The name of the policy that governs `md` among `policies` (its namespace's),
// "" when none does. A reference to a missing policy still returns its name.
std::string GoverningPolicy(const json& md, const std::vector<json>& policies);

// For an UPDATE: the violations of `now` that `before` (the same object's
// previous state, judged against the same policies) did not already have at
// least as badly. Lowering a deployment that is over quota is allowed, as is
// any change that leaves its quota footprint alone (finalizers, labels).
std::vector<QuotaViolation> NewOrWorse(const QuotaEvaluation& now, const QuotaEvaluation& before);

}  // namespace moeserve::op
