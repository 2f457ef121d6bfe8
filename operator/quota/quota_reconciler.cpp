#include "moeserve/operator/quota_reconciler.hpp"

#include "moeserve/common/rfc3339.hpp"

namespace moeserve::op {
namespace {

// As the MoEDeployment reconciler sets them: lastTransitionTime moves only when status does.
void SetCondition(json& conditions, const std::string& type, const std::string& status, const std::string& reason,
                  const std::string& message, int64_t generation) {
  json condition = {{"type", type},       {"status", status},   {"reason", reason},
                    {"message", message}, {"observedGeneration", generation}};
  for (auto& c : conditions) {
    if (!c.is_object() || c.value("type", json()) != type) continue;
    condition["lastTransitionTime"] =
        c.value("status", json()) == status && c.value("lastTransitionTime", json()).is_string()
            ? c["lastTransitionTime"].get<std::string>()
            : NowRfc3339();
    c = condition;
    return;
  }
  condition["lastTransitionTime"] = NowRfc3339();
  conditions.push_back(condition);
}

std::string Limit(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "unlimited"; }

}  // namespace

Result<ReconcileResult> QuotaPolicyReconciler::Reconcile(const std::string& key) {
  // 1. Load the policy. Gone: the deployments it governed are re-judged by
  //    their own reconciles (the informer enqueues them).
  auto cached = policies_.Get(key);
  if (!cached) return ReconcileResult{};
  json policy = *cached;
  const std::string ns = policy["metadata"].value("namespace", ""), name = policy["metadata"].value("name", "");
  const int64_t generation = policy["metadata"].value("generation", int64_t{0});

  // 2. Judge each deployment it governs, as the webhook and the MoEDeployment reconciler do.
  const auto limits = ParseQuotaLimits(policy);
  const std::vector<json> all_policies = policies_.List(ns);
  int64_t gpus = 0, replicas = 0, deployments = 0;
  std::vector<std::string> held;
  for (const auto& md : moedeployments_.List(ns)) {
    if (GoverningPolicy(md, all_policies) != name || md["metadata"].contains("deletionTimestamp")) continue;
    auto spec = ParseMoEDeploymentSpec(md.value("spec", json::object()));
    if (!spec) continue;
    const QuotaEvaluation e = admission_.Evaluate(md, *spec);
    deployments++;
    if (!e.decision.admitted) {
      held.push_back(md["metadata"].value("name", ""));
      continue;
    }
    const QuotaDemand d = DemandOf(*spec);
    gpus += d.gpus;
    replicas += d.replicas;
  }

  // 3. Status: conditions only; usage and alerts belong to budgeting.
  const json old_status = policy.value("status", json::object());
  json status = old_status.is_object() ? old_status : json::object();
  json conditions = status.value("conditions", json::array());
  if (!conditions.is_array()) conditions = json::array();
  if (limits) {
    SetCondition(conditions, "Ready", "True", "LimitsValid",
                 "GPUs " + std::to_string(gpus) + "/" + Limit(limits->max_gpus) + ", replicas " +
                     std::to_string(replicas) + "/" + Limit(limits->max_replicas) + " in " +
                     std::to_string(deployments - static_cast<int64_t>(held.size())) + " admitted MoEDeployments",
                 generation);
  } else {
    SetCondition(conditions, "Ready", "False", "InvalidLimits", limits.error().message(), generation);
  }
  if (held.empty()) {
    SetCondition(conditions, "QuotaExceeded", "False", "WithinQuota",
                 "every MoEDeployment governed by this policy is admitted", generation);
  } else {
    std::string names;
    for (const auto& h : held) names += (names.empty() ? "" : ", ") + h;
    SetCondition(conditions, "QuotaExceeded", "True", "QuotaExceeded",
                 std::to_string(held.size()) + " MoEDeployments held at QuotaAdmitted=False: " + names, generation);
  }
  status["conditions"] = conditions;
  status["observedGeneration"] = generation;
  if (status == old_status) return ReconcileResult{};
  json updated = policy;
  updated["status"] = status;
  const std::string based_on = policy["metadata"].value("resourceVersion", "");
  MOE_ASSIGN_OR_RETURN(json written, client_.UpdateStatus(resources::kQuotaPolicy, updated));
  written["kind"] = resources::kQuotaPolicy.kind;
  written["apiVersion"] = resources::kQuotaPolicy.ApiVersion();
  written["metadata"].erase("managedFields");
  policies_.UpsertIfUnchanged(written, based_on);
  return ReconcileResult{};
}

}  // namespace moeserve::op
