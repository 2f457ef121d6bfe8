// Where a tenant may ask its pods to run: the platform's allow-list for a
// MoEDeployment's nodeSelector, tolerations and affinity (moe-operator
// --allowed-toleration-keys, --allowed-node-selector-keys, --allow-affinity;
// the chart's `scheduling` values). The quota webhook refuses a spec past it
// and the reconciler holds one (Ready=False, InvalidSpec), each with a
// message naming the field.
//
// By default a tenant cannot reach the control plane: a toleration of
// node-role.kubernetes.io/control-plane or node-role.kubernetes.io/master,
// and one with an empty key and operator Exists (which tolerates every
// taint), are refused; so is a nodeSelector on those two labels. The two
// keys are allowed only where the platform names them exactly ("*" never
// covers them); the match-everything toleration never is.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

struct SchedulingPolicy {
  // Keys a toleration may name; "*" allows any key but the control-plane ones.
  std::vector<std::string> toleration_keys = {"nvidia.com/gpu", "amd.com/gpu"};
  // Label keys a nodeSelector may name; "*" as above.
  std::vector<std::string> node_selector_keys = {"*"};
  // spec.affinity (node, pod and anti-affinity) only when the platform says so.
  bool allow_affinity = false;
};

// Ok, or InvalidArgument naming the first field past the policy
// ("spec.tolerations[0].key: ..."). Null fields are allowed.
Status CheckScheduling(const nlohmann::json& node_selector, const nlohmann::json& tolerations,
                       const nlohmann::json& affinity, const SchedulingPolicy& policy);

// A flag's comma-separated key list ("" = none); blanks around keys ignored.
std::vector<std::string> ParseKeyList(const std::string& text);

}  // namespace moeserve::op
