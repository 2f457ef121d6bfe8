#include "moeserve/operator/quota_admission.hpp"

#include "moeserve/operator/vault_paths.hpp"

namespace moeserve::op {
namespace {

constexpr char kGroup[] = "moeserve.io";

// Messages quote what the request held (an image, a parser's view of a bad
// body), which need not be UTF-8; dump() would throw on it.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Joined(const std::vector<QuotaViolation>& violations, const std::string& policy) {
  const std::string who = "QuotaPolicy " + policy + ": ";
  std::string out;
  for (const auto& v : violations) {
    std::string m = v.message;
    if (!out.empty() && m.rfind(who, 0) == 0) m = m.substr(who.size());
    out += (out.empty() ? "" : "; ") + m;
  }
  return out;
}

}  // namespace

QuotaEvaluation QuotaAdmission::Evaluate(const json& md, const MoEDeploymentSpec& spec) const {
  const json meta = md.value("metadata", json::object());
  const std::string ns = meta.is_object() && meta.value("namespace", json()).is_string() ? meta.value("namespace", "") : "";
  return DecideQuota(md, spec, policies_.List(ns), moedeployments_.List(ns));
}

Result<NamespaceObjects> QuotaAdmission::Read(const std::string& ns) const {
  if (live_) return live_(ns);
  return NamespaceObjects{policies_.List(ns), moedeployments_.List(ns)};
}

AdmissionHttpAnswer QuotaAdmission::Review(std::string_view body) const {
  auto request = ParseAdmissionReview(body);
  if (!request) {
    // No uid to answer to: the API server counts a non-200 as the webhook failing.
    json status = {{"kind", "Status"},  {"apiVersion", "v1"}, {"status", "Failure"},
                   {"code", 400},       {"reason", "BadRequest"},
                   {"message", "cannot read the AdmissionReview: " + request.error().message()}};
    return {400, Dump(status)};
  }
  return {200, Dump(Decide(*request))};
}

json QuotaAdmission::Decide(const AdmissionRequest& r) const {
  if (r.group != kGroup || r.resource != "moedeployments" || (r.operation != "CREATE" && r.operation != "UPDATE") ||
      (!r.sub_resource.empty() && r.sub_resource != "scale"))
    return AdmissionResponse(r.uid, true);

  auto objects = Read(r.ns);
  if (!objects)
    return AdmissionResponse(r.uid, false, 503, "reading the namespace's quota: " + objects.error().message());
  // The object to judge, and its previous state on UPDATE.
  json object, old_object;
  if (r.sub_resource == "scale") {
    std::optional<json> stored;
    for (const auto& md : objects->deployments)
      if (md.value("metadata", json::object()).value("name", json()) == r.name) stored = md;
    if (!stored) return AdmissionResponse(r.uid, false, 404, "MoEDeployment " + r.ns + "/" + r.name + " not found");
    const json& scale = r.object;
    if (!scale.is_object() || !scale.contains("spec") || !scale["spec"].is_object() ||
        !scale["spec"].value("replicas", json()).is_number_integer())
      return AdmissionResponse(r.uid, false, 400, "request.object: not an autoscaling/v1 Scale with spec.replicas");
    old_object = *stored;
    object = *stored;
    object["spec"]["replicas"] = scale["spec"]["replicas"];
  } else {
    if (!r.object.is_object()) return AdmissionResponse(r.uid, false, 400, "request.object: missing");
    object = r.object;
    if (r.operation == "UPDATE") old_object = r.old_object;
  }
  if (!object.contains("metadata")) object["metadata"] = json::object();
  if (!object["metadata"].value("namespace", json()).is_string()) object["metadata"]["namespace"] = r.ns;
  if (!object["metadata"].value("name", json()).is_string()) object["metadata"]["name"] = r.name;
  // What is being created is newer than everything stored, whatever its
  // creationTimestamp (whole seconds, so often equal to a neighbour's) says.
  if (r.operation == "CREATE" && r.sub_resource.empty()) object["metadata"].erase("creationTimestamp");

  auto spec = ParseMoEDeploymentSpec(object.value("spec", json::object()));
  if (spec)
    if (Status allowed = CheckScheduling(spec->node_selector, spec->tolerations, spec->affinity, scheduling_); !allowed)
      spec = Fail(allowed.error());
  // The Vault paths it would have copied into its own Secret: judged against
  // the policy that governs it, read live like the rest.
  if (spec)
    if (Status paths = CheckDeploymentVaultPaths(object, *spec, objects->policies, reserved_vault_prefix_); !paths)
      spec = Fail(paths.error());
  if (spec && (!spec->model_credentials.vault_path.empty() || !spec->api_keys.vault_path.empty()))
    if (Status role = CheckDeploymentVaultRole(object, reserved_vault_role_); !role) spec = Fail(role.error());
  if (!spec) {
    // An object stored before a field was refused (spec.cache.hostPath, a
    // GPU in spec.resources) must still lose its finalizer and labels: an
    // UPDATE that leaves such a spec exactly as it was changes nothing the
    // reconciler acts on (it refuses the spec), so it passes.
    if (r.operation == "UPDATE" && r.sub_resource.empty() && old_object.is_object() &&
        old_object.value("spec", json()) == object.value("spec", json()))
      return AdmissionResponse(r.uid, true);
    return AdmissionResponse(r.uid, false, 400, "spec: " + spec.error().message());
  }
  const QuotaEvaluation now = DecideQuota(object, *spec, objects->policies, objects->deployments);
  if (now.decision.admitted) return AdmissionResponse(r.uid, true);

  std::vector<QuotaViolation> refused = now.violations;
  if (r.operation == "UPDATE" && old_object.is_object()) {
    if (!old_object["metadata"].is_object()) old_object["metadata"] = json::object();
    old_object["metadata"]["namespace"] = object["metadata"]["namespace"];
    old_object["metadata"]["name"] = object["metadata"]["name"];
    // Judged against the same deployments: only the change itself counts.
    if (object["metadata"].contains("creationTimestamp"))
      old_object["metadata"]["creationTimestamp"] = object["metadata"]["creationTimestamp"];
    auto old_spec = ParseMoEDeploymentSpec(old_object.value("spec", json::object()));
    if (old_spec)
      refused = NewOrWorse(now, DecideQuota(old_object, *old_spec, objects->policies, objects->deployments));
  }
  if (refused.empty()) return AdmissionResponse(r.uid, true);
  return AdmissionResponse(r.uid, false, 403, Joined(refused, now.policy));
}

}  // namespace moeserve::op
