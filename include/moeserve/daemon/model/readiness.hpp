// What /readyz reports. The daemon is ready (200) only in state "ready";
// every other state answers 503 with the state and a detail a person can read
// ("pulling", "12.5 GiB of 40 GiB"). The weight puller sets "pulling" while it
// downloads; serve_command sets "loading", "ready" and "draining".
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <mutex>
#include <string>

namespace moeserve::daemon {

class Readiness {
 public:
  struct Snapshot {
    std::string state;   // starting | pulling | loading | ready | draining | failed
    std::string detail;
    bool ready() const { return state == "ready"; }
  };

  void Set(std::string state, std::string detail = "") {
    std::lock_guard lock(mu_);
    snapshot_ = {std::move(state), std::move(detail)};
  }
  Snapshot Get() const {
    std::lock_guard lock(mu_);
    return snapshot_;
  }

 private:
  mutable std::mutex mu_;
  Snapshot snapshot_{"starting", ""};
};

}  // namespace moeserve::daemon
