// The autoscaler: every interval (15 s; --autoscale-interval), while this
// operator leads, for each MoEDeployment with spec.autoscaling enabled:
//  1. read GET /metrics with the deployment's metrics token from the
//     node-rank-0 pod of every replica group (pods trusted as the usage sync
//     trusts them: <group>-0, controlled by the group's StatefulSet, itself
//     the deployment's), in parallel; a pod that does not answer adds
//     nothing this time;
//  2. fold the readings into a LoadSample (autoscaling.hpp: waiting per
//     group, p90 TTFT over the window, KV-cache use) and decide;
//  3. when the decision differs from spec.replicas, write spec.replicas
//     through the scale subresource (merge patch with the resourceVersion the
//     decision was made on), so that the quota webhook judges every step. A
//     refusal sets Autoscaling=False, reason QuotaRefused, with the webhook's
//     message and is tried again next interval, never in a loop; the
//     reconciler then adds or removes whole groups (a removed group's
//     daemons drain on SIGTERM before they exit);
//  4. record status.autoscaling and the Autoscaling condition (status
//     subresource, only when the decision's reason or counts change) and an
//     Event for each step and each refusal.
// What is remembered between intervals is only the recent readings and
// recommendations (the windows), as the HPA keeps them: a new leader starts
// its windows afresh and so holds until they are covered.
//
// Thread safety: Start/Stop from one thread; RunOnce from one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "moeserve/operator/autoscaling.hpp"
#include "moeserve/operator/daemon_admin_client.hpp"
#include "moeserve/operator/events.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {

struct AutoscalerOptions {
  std::chrono::milliseconds interval{std::chrono::seconds(15)};  // 0: off
  std::chrono::milliseconds request_timeout{std::chrono::seconds(5)};  // per /metrics read
  int parallel = 16;
  // The TTFT window and the tolerance band (autoscaling.hpp), platform settings.
  double ttft_window_seconds = 60;
  double tolerance = 0.1;
};

struct AutoscalerStats {
  uint64_t decisions = 0;          // deployments decided on
  uint64_t scale_ups = 0, scale_downs = 0;
  uint64_t refusals = 0;           // scale writes refused (quota webhook or other 4xx)
  uint64_t errors = 0;             // scale or status writes that failed otherwise
  uint64_t pods_read = 0, pods_failed = 0;
  // Per deployment (namespace/name): spec.replicas seen and the replicas wanted, last interval.
  std::map<std::string, std::pair<int, int>> replicas;
};

class Autoscaler {
 public:
  struct Caches {
    const ObjectCache* moedeployments = nullptr;
    const ObjectCache* statefulsets = nullptr;
    const ObjectCache* secrets = nullptr;
  };
  Autoscaler(KubeClient& client, Caches caches, EventRecorder* events, AutoscalerOptions options);
  ~Autoscaler();

  void Start();
  void Stop();
  // Every autoscaled deployment once; errors are logged, counted and shown in status.
  void RunOnce();
  AutoscalerStats stats() const;

 private:
  struct Memory {
    explicit Memory(double window) : load(window) {}
    LoadWindow load;
    AutoscaleHistory history;
  };
  void ScaleOne(const json& md, const AutoscalingSpec& spec, int replicas, double now);
  std::map<std::string, DaemonLoadReading> ReadGroups(const json& md, bool tls, int port);
  Status WriteStatus(const json& md, const AutoscaleDecision& d, int current, const std::string& condition_status,
                     const std::string& condition_reason, const std::string& condition_message, bool scaled);

  KubeClient& client_;
  Caches caches_;
  EventRecorder* events_;
  AutoscalerOptions options_;
  std::map<std::string, Memory> memory_;  // by deployment uid
  mutable std::mutex stats_mu_;
  AutoscalerStats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve::op
