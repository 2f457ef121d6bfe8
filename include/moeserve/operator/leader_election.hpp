// Leader election with a coordination.k8s.io/v1 Lease, as client-go does it:
// acquire when the Lease is free or its holder has not renewed within the
// lease duration (measured on our own clock from when we last saw the record
// change, so clocks need not agree); renew every retry period; give up
// leadership when no renewal succeeded within the renew deadline. Optimistic
// concurrency on the Lease (409 on a stale resourceVersion) makes two
// candidates racing for it agree on one winner.
//
// Leading ends the moment the renew deadline passes without a renewal, not
// when a slow renewal call finally returns: each call of an attempt gets only
// the time left before the deadline, and the WriteFence (when given) closes
// at the deadline, so a deposed leader's client sends no further write.
// The deadline counts from when a successful renewal was sent, so it always
// falls before another candidate (which waits a whole lease duration from
// when it saw that renewal) can take over.
//
// Thread safety: Run on one thread; IsLeader from any.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {

struct LeaderElectionOptions {
  std::string lease_namespace = "default";
  std::string lease_name = "moe-operator-leader";
  std::string identity;
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  bool release_on_cancel = true;
  // Moved forward on each renewal, closed when leading stops. Optional.
  std::shared_ptr<WriteFence> fence;
};

class LeaderElector {
 public:
  LeaderElector(KubeClient& client, LeaderElectionOptions options);
  // Blocks: waits to acquire, calls on_started_leading, renews until leadership
  // is lost or stop is set, then calls on_stopped_leading (if it ever led).
  void Run(const std::atomic<bool>& stop, const std::function<void()>& on_started_leading,
           const std::function<void()>& on_stopped_leading);
  bool IsLeader() const { return leader_; }
  const LeaderElectionOptions& options() const { return options_; }

 private:
  // One attempt; every call in it ends within `budget`.
  bool TryAcquireOrRenew(std::chrono::milliseconds budget);
  void Release();

  KubeClient& client_;
  LeaderElectionOptions options_;
  std::atomic<bool> leader_{false};
  std::string observed_holder_, observed_renew_;
  std::chrono::steady_clock::time_point observed_at_;
};

}  // namespace moeserve::op
