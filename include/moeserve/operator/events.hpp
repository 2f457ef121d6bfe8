// Events: core/v1 Events about an object, as `kubectl describe` shows them.
// Recording is best effort: a failure is logged, never returned, because an
// Event that cannot be written must not fail the reconcile that caused it.
//
// Thread safety: Record may be called from any thread.
#pragma once

#include <string>

#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {

class EventRecorder {
 public:
  EventRecorder(KubeClient& client, std::string component) : client_(client), component_(std::move(component)) {}
  // type is "Normal" or "Warning"; reason is UpperCamelCase.
  void Record(const json& object, const std::string& type, const std::string& reason, const std::string& message);

 private:
  KubeClient& client_;
  std::string component_;
};

}  // namespace moeserve::op
