#include "moeserve/operator/scheduling_policy.hpp"

#include <algorithm>

namespace moeserve::op {
namespace {

constexpr const char* kControlPlaneKeys[] = {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"};

bool ControlPlaneKey(const std::string& key) {
  return std::find(std::begin(kControlPlaneKeys), std::end(kControlPlaneKeys), key) != std::end(kControlPlaneKeys);
}

bool Named(const std::vector<std::string>& list, const std::string& key) {
  return std::find(list.begin(), list.end(), key) != list.end();
}

// Control-plane keys only by name; others by name or "*".
bool Allowed(const std::vector<std::string>& list, const std::string& key) {
  return Named(list, key) || (!ControlPlaneKey(key) && Named(list, "*"));
}

std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string ListText(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

Status Refuse(const std::string& field, const std::string& why) { return Fail(Error::InvalidArgument(field + ": " + why)); }

Status CheckTolerations(const nlohmann::json& tolerations, const SchedulingPolicy& policy) {
  if (tolerations.is_null()) return Ok();
  if (!tolerations.is_array()) return Refuse("spec.tolerations", "not a list");
  for (size_t i = 0; i < tolerations.size(); ++i) {
    const std::string field = "spec.tolerations[" + std::to_string(i) + "]";
    const nlohmann::json& t = tolerations[i];
    if (!t.is_object()) return Refuse(field, "not an object");
    const nlohmann::json key = t.value("key", nlohmann::json(""));
    const nlohmann::json op = t.value("operator", nlohmann::json("Equal"));
    if (!key.is_string()) return Refuse(field + ".key", "not a string");
    if (!op.is_string()) return Refuse(field + ".operator", "not a string");
    const std::string k = key.get<std::string>();
    if (k.empty())
      return Refuse(field, op.get<std::string>() == "Exists"
                               ? "an empty key with operator Exists tolerates every taint, the control plane's "
                                 "included; name the taint's key"
                               : "key: required");
    if (!Allowed(policy.toleration_keys, k))
      return Refuse(field + ".key",
                    Quoted(k) + (ControlPlaneKey(k) ? " would let the pods onto control-plane nodes; " : " ") +
                        "is not among the toleration keys the platform allows " + ListText(policy.toleration_keys) +
                        " (moe-operator --allowed-toleration-keys)");
  }
  return Ok();
}

Status CheckNodeSelector(const nlohmann::json& node_selector, const SchedulingPolicy& policy) {
  if (node_selector.is_null()) return Ok();
  if (!node_selector.is_object()) return Refuse("spec.nodeSelector", "not an object");
  for (const auto& [key, value] : node_selector.items()) {
    const std::string field = "spec.nodeSelector[" + Quoted(key) + "]";
    if (!value.is_string()) return Refuse(field, "not a string");
    if (!Allowed(policy.node_selector_keys, key))
      return Refuse(field, std::string(ControlPlaneKey(key) ? "selects control-plane nodes; " : "") +
                               "the platform allows nodeSelector keys " + ListText(policy.node_selector_keys) +
                               " only (moe-operator --allowed-node-selector-keys)");
  }
  return Ok();
}

}  // namespace

Status CheckScheduling(const nlohmann::json& node_selector, const nlohmann::json& tolerations,
                       const nlohmann::json& affinity, const SchedulingPolicy& policy) {
  MOE_TRY(CheckTolerations(tolerations, policy));
  MOE_TRY(CheckNodeSelector(node_selector, policy));
  if (!affinity.is_null() && !(affinity.is_object() && affinity.empty()) && !policy.allow_affinity)
    return Refuse("spec.affinity",
                  "not allowed; the platform does not let MoEDeployments set affinity (moe-operator --allow-affinity)");
  return Ok();
}

std::vector<std::string> ParseKeyList(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    const auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    start = comma + 1;
  }
  return out;
}

}  // namespace moeserve::op
