#include "moeserve/daemon/sessions/session_settings.hpp"

namespace moeserve::daemon {

bool ValidReplicaName(const std::string& name) {
  if (name.empty() || name.size() > 32) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

}  // namespace moeserve::daemon
