#include "moeserve/operator/quota_policy.hpp"

#include <algorithm>

#include "moeserve/operator/json_fields.hpp"

namespace moeserve::op {
namespace {

using fields::Field;
using fields::NameOf;
using fields::NamespaceOf;
using fields::Str;
std::string CreatedAt(const json& o) { return Str(Field(o, "metadata"), "creationTimestamp"); }

std::string ListText(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

Result<std::optional<int64_t>> OptionalInt(const json& limits, const char* key) {
  if (!limits.contains(key) || limits[key].is_null()) return std::optional<int64_t>();
  if (!limits[key].is_number_integer() || limits[key].get<int64_t>() < 0)
    return Fail(Error::InvalidArgument(std::string("spec.limits.") + key + ": not a non-negative integer"));
  return std::optional<int64_t>(limits[key].get<int64_t>());
}

Result<std::optional<std::vector<std::string>>> OptionalStrings(const json& limits, const char* key) {
  if (!limits.contains(key) || limits[key].is_null()) return std::optional<std::vector<std::string>>();
  if (!limits[key].is_array()) return Fail(Error::InvalidArgument(std::string("spec.limits.") + key + ": not a list"));
  std::vector<std::string> out;
  for (const auto& v : limits[key]) {
    if (!v.is_string()) return Fail(Error::InvalidArgument(std::string("spec.limits.") + key + ": not a list of strings"));
    out.push_back(v.get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

bool Deleting(const json& o) { return !Field(Field(o, "metadata"), "deletionTimestamp").is_null(); }

// Whether `other` was there before `md`: creationTimestamp (RFC 3339, which
// orders as text), then name. An object not yet stored (no timestamp) is newest.
bool CreatedBefore(const json& other, const json& md) {
  const std::string a = CreatedAt(other), b = CreatedAt(md);
  if (b.empty()) return true;
  if (a != b) return a < b;
  return NameOf(other) < NameOf(md);
}

const json* FindPolicy(const std::vector<json>& policies, const std::string& ns, const std::string& name) {
  for (const auto& p : policies)
    if (NamespaceOf(p) == ns && NameOf(p) == name) return &p;
  return nullptr;
}

std::string ReferencedPolicy(const json& md) { return Str(Field(Field(md, "spec"), "quotaPolicyRef"), "name"); }

// A pod that requests no GPU has no business on a GPU node: tolerating a GPU
// vendor's taint would let it share the node (and, were its devices not
// pinned to none, open them). The violation, when it does.
std::optional<QuotaViolation> GpuTolerationsWithoutGpus(const MoEDeploymentSpec& spec) {
  // Per rendered pod (a deployment scaled to zero still asks for its GPUs).
  if (desired::DeviceUnits(desired::ServerResources(spec)) > 0 || !spec.tolerations.is_array()) return std::nullopt;
  std::vector<std::string> keys;
  std::string first;
  for (size_t i = 0; i < spec.tolerations.size(); ++i) {
    const json& t = spec.tolerations[i];
    if (!t.is_object() || !t.value("key", json()).is_string()) continue;
    const std::string key = t["key"].get<std::string>();
    if (!GpuTaintKey(key)) continue;
    if (keys.empty()) first = "spec.tolerations[" + std::to_string(i) + "].key";
    keys.push_back(key);
  }
  if (keys.empty()) return std::nullopt;
  return QuotaViolation{"spec.tolerations", 0, ListText(keys),
                        first + ": " + keys[0] +
                            " tolerates GPU nodes, but this MoEDeployment requests no GPU "
                            "(spec.parallelism.gpusPerNode is 0); only a QuotaPolicy with "
                            "limits.allowGPUTolerationsWithoutGPUs: true allows that"};
}

// What no group may run at all, as opposed to a sum past a limit (which
// holds the groups there are): an image outside the list, GPU nodes
// without GPUs.
bool Forbidden(const std::vector<QuotaViolation>& violations) {
  for (const auto& v : violations)
    if (v.limit == "limits.allowedImages" || v.limit == "spec.tolerations") return true;
  return false;
}

}  // namespace

bool ImageAllowed(const std::string& image, const std::string& entry) {
  if (entry.empty()) return false;
  // A digest: the image must be pinned to it (any repository, or the one named).
  if (entry.rfind("sha256:", 0) == 0) return image.size() > entry.size() && image.ends_with("@" + entry);
  if (entry.find("@sha256:") != std::string::npos) return image == entry;
  // A prefix ends at a boundary: "registry.internal" is not "registry.internal.evil.example",
  // nor is "team/app" "team/app-debug".
  if (image.rfind(entry, 0) != 0) return false;
  if (image.size() == entry.size()) return true;
  const char last = entry.back(), next = image[entry.size()];
  return last == '/' || last == ':' || last == '@' || next == '/' || next == ':' || next == '@';
}

Result<QuotaLimits> ParseQuotaLimits(const json& policy) {
  const json spec = policy.is_object() ? policy.value("spec", json::object()) : json::object();
  const json limits = spec.is_object() ? spec.value("limits", json::object()) : json::object();
  if (!limits.is_object()) return Fail(Error::InvalidArgument("spec.limits: not an object"));
  QuotaLimits out;
  MOE_ASSIGN_OR_RETURN(out.max_gpus, OptionalInt(limits, "maxGPUs"));
  MOE_ASSIGN_OR_RETURN(out.max_replicas, OptionalInt(limits, "maxReplicas"));
  MOE_ASSIGN_OR_RETURN(out.max_context_tokens, OptionalInt(limits, "maxContextTokens"));
  MOE_ASSIGN_OR_RETURN(out.allowed_tiers, OptionalStrings(limits, "allowedTiers"));
  MOE_ASSIGN_OR_RETURN(out.allowed_images, OptionalStrings(limits, "allowedImages"));
  if (limits.contains("allowGPUTolerationsWithoutGPUs") && !limits["allowGPUTolerationsWithoutGPUs"].is_null()) {
    if (!limits["allowGPUTolerationsWithoutGPUs"].is_boolean())
      return Fail(Error::InvalidArgument("spec.limits.allowGPUTolerationsWithoutGPUs: not a boolean"));
    out.allow_gpu_tolerations_without_gpus = limits["allowGPUTolerationsWithoutGPUs"].get<bool>();
  }
  return out;
}

QuotaDemand DemandOf(const MoEDeploymentSpec& spec) {
  QuotaDemand d;
  d.replicas = std::max(0, spec.replicas);
  // What each rendered pod asks for, from the function that renders it
  // (saturating: an unreadable quantity counts as more than any limit).
  const __int128 gpus = static_cast<__int128>(d.replicas) * std::max(0, spec.nodes_per_replica) *
                        desired::DeviceUnits(desired::ServerResources(spec));
  d.gpus = static_cast<int64_t>(std::min<__int128>(gpus, int64_t{1} << 40));
  d.context_tokens = spec.max_context_tokens;
  d.tiers.insert(spec.default_tier);
  if (spec.thinking_budgets.is_object())
    for (const auto& [tier, budget] : spec.thinking_budgets.items()) d.tiers.insert(tier);
  d.image = spec.image;
  return d;
}

std::string GoverningPolicy(const json& md, const std::vector<json>& policies) {
  const std::string ref = ReferencedPolicy(md);
  if (!ref.empty()) return ref;
  return FindPolicy(policies, NamespaceOf(md), kDefaultQuotaPolicy) ? kDefaultQuotaPolicy : "";
}

QuotaEvaluation DecideQuota(const json& md, const MoEDeploymentSpec& spec, const std::vector<json>& policies,
                            const std::vector<json>& deployments) {
  QuotaEvaluation e;
  const std::string ns = NamespaceOf(md);
  e.policy = GoverningPolicy(md, policies);
  std::vector<std::string> in_namespace;
  for (const auto& p : policies)
    if (NamespaceOf(p) == ns) in_namespace.push_back(NameOf(p));
  std::sort(in_namespace.begin(), in_namespace.end());

  auto refuse = [&](std::string reason, QuotaViolation v) {
    e.decision = {false, std::move(reason), v.message};
    e.violations.push_back(std::move(v));
    e.decision.forbidden = Forbidden(e.violations);
    return e;
  };
  const QuotaDemand own = DemandOf(spec);
  const std::optional<QuotaViolation> gpu_nodes = GpuTolerationsWithoutGpus(spec);
  if (e.policy.empty()) {
    if (in_namespace.empty()) {
      // No policy to allow it: GPU nodes without GPUs are refused everywhere.
      if (gpu_nodes) return refuse("GPUTolerationsWithoutGPUs", *gpu_nodes);
      e.decision = {true, "NoQuotaPolicy", "namespace " + ns + " has no QuotaPolicy"};
      return e;
    }
    return refuse("QuotaPolicyRequired",
                  {"quotaPolicyRef", 0, "",
                   "namespace " + ns + " is governed by QuotaPolicy " + ListText(in_namespace) +
                       " and has no default (a QuotaPolicy named " + kDefaultQuotaPolicy +
                       "); spec.quotaPolicyRef.name must name one"});
  }
  const json* policy = FindPolicy(policies, ns, e.policy);
  if (!policy)
    return refuse("QuotaPolicyNotFound", {"quotaPolicyRef", 0, e.policy,
                                          "QuotaPolicy " + e.policy + " (spec.quotaPolicyRef.name) does not exist in "
                                          "namespace " + ns});
  auto limits = ParseQuotaLimits(*policy);
  if (!limits)
    return refuse("InvalidQuotaPolicy", {"spec.limits", 0, "",
                                         "QuotaPolicy " + e.policy + ": " + limits.error().message()});

  // The namespace's total: this deployment and the ones before it under the same policy.
  e.namespace_gpus = own.gpus;
  e.namespace_replicas = own.replicas;
  for (const auto& other : deployments) {
    if (NamespaceOf(other) != ns || NameOf(other) == NameOf(md) || Deleting(other)) continue;
    if (GoverningPolicy(other, policies) != e.policy || !CreatedBefore(other, md)) continue;
    auto other_spec = ParseMoEDeploymentSpec(Field(other, "spec"));
    if (!other_spec) continue;  // one the operator cannot run holds no groups
    const QuotaDemand d = DemandOf(*other_spec);
    e.namespace_gpus += d.gpus;
    e.namespace_replicas += d.replicas;
  }

  const std::string who = "QuotaPolicy " + e.policy + ": ";
  if (limits->max_gpus && e.namespace_gpus > *limits->max_gpus)
    e.violations.push_back({"limits.maxGPUs", e.namespace_gpus, "",
                            who + "limits.maxGPUs is " + std::to_string(*limits->max_gpus) +
                                "; this MoEDeployment would bring the namespace to " + std::to_string(e.namespace_gpus)});
  if (limits->max_replicas && e.namespace_replicas > *limits->max_replicas)
    e.violations.push_back({"limits.maxReplicas", e.namespace_replicas, "",
                            who + "limits.maxReplicas is " + std::to_string(*limits->max_replicas) +
                                "; this MoEDeployment would bring the namespace to " +
                                std::to_string(e.namespace_replicas)});
  if (limits->max_context_tokens && own.context_tokens > *limits->max_context_tokens)
    e.violations.push_back({"limits.maxContextTokens", own.context_tokens, "",
                            who + "limits.maxContextTokens is " + std::to_string(*limits->max_context_tokens) +
                                "; spec.engine.maxContextTokens asks for " + std::to_string(own.context_tokens)});
  if (limits->allowed_tiers) {
    std::vector<std::string> refused;
    for (const auto& tier : own.tiers)
      if (std::find(limits->allowed_tiers->begin(), limits->allowed_tiers->end(), tier) == limits->allowed_tiers->end())
        refused.push_back(tier);
    if (!refused.empty())
      e.violations.push_back({"limits.allowedTiers", 0, ListText(refused),
                              who + "limits.allowedTiers is " + ListText(*limits->allowed_tiers) +
                                  "; spec.engine.thinking configures " + ListText(refused)});
  }
  if (limits->allowed_images) {
    bool allowed = false;
    for (const auto& entry : *limits->allowed_images) allowed = allowed || ImageAllowed(own.image, entry);
    if (!allowed)
      e.violations.push_back({"limits.allowedImages", 0, own.image,
                              who + "limits.allowedImages is " + ListText(*limits->allowed_images) +
                                  " (prefixes and digests); spec.image is " + own.image});
  }
  if (gpu_nodes && !limits->allow_gpu_tolerations_without_gpus) {
    QuotaViolation v = *gpu_nodes;
    v.message = who + v.message;
    e.violations.push_back(std::move(v));
  }

  if (e.violations.empty()) {
    std::string usage = std::to_string(e.namespace_gpus) + " GPUs" +
                        (limits->max_gpus ? " of " + std::to_string(*limits->max_gpus) : "") + ", " +
                        std::to_string(e.namespace_replicas) + " replicas" +
                        (limits->max_replicas ? " of " + std::to_string(*limits->max_replicas) : "");
    e.decision = {true, "WithinQuota", who + "within limits (namespace total with this MoEDeployment: " + usage + ")"};
    return e;
  }
  std::string message;
  for (const auto& v : e.violations) message += (message.empty() ? "" : "; ") + v.message.substr(message.empty() ? 0 : who.size());
  e.decision = {false, "QuotaExceeded", message};
  e.decision.forbidden = Forbidden(e.violations);
  return e;
}

std::vector<QuotaViolation> NewOrWorse(const QuotaEvaluation& now, const QuotaEvaluation& before) {
  std::vector<QuotaViolation> out;
  for (const auto& v : now.violations) {
    auto old = std::find_if(before.violations.begin(), before.violations.end(),
                            [&](const QuotaViolation& o) { return o.limit == v.limit; });
    if (old == before.violations.end() || v.requested > old->requested || v.detail != old->detail) out.push_back(v);
  }
  return out;
}

}  // namespace moeserve::op
