// The daemon's side of an expert-parallel group (engine/expert_group.hpp):
// node rank 0 serves the API and leads; the other ranks load their slice of
// the experts, follow rank 0's forward passes, and serve only /healthz,
// /readyz and /metrics.
//
// Readiness: rank 0 is ready (and admits chat requests) only while every
// rank is connected; when a rank dies it reports "degraded" on /readyz (503)
// and in moe_ep_group_degraded, requests in flight fail with 503 (the engine
// marks them unavailable), and it serves again once the rank is back.
// Followers are ready while they follow.
//
// Metrics (registered on the daemon's registry): moe_ep_world_size,
// moe_ep_rank, moe_ep_group_connected, moe_ep_group_degraded,
// moe_ep_group_formations_total, moe_ep_group_failures_total,
// moe_ep_routed_expert_bytes (the routed experts this rank holds), and on rank 0,
// from the routing of every token, moe_expert_rank_tokens_total{rank} and
// moe_expert_rank_load_imbalance (the busiest rank's routed tokens over the
// mean, since start; 1 is perfect balance).
//
// Thread safety: RefreshMetrics from any thread; Stop from the owner.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/model/readiness.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/expert_group.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::daemon {

class ExpertParallel {
 public:
  // Rank 0: `serving` is set while the group is connected.
  static Result<std::unique_ptr<ExpertParallel>> Lead(const engine::ExpertGroupSettings& settings, const engine::Engine& engine,
                                                     Readiness& readiness, std::atomic<bool>& serving, DaemonMetrics& metrics);
  // Ranks > 0: loads this rank's experts from model_dir through its family
  // (engine::LoadLayerGraph: moe-dsa-v1 and deepseek_v32 directories, the
  // latter converted as rank 0 converts it) and a cache pool of the engine
  // options' geometry (the same as rank 0's).
  static Result<std::unique_ptr<ExpertParallel>> Follow(const engine::ExpertGroupSettings& settings, const std::string& model_dir,
                                                       const engine::EngineOptions& options, Readiness& readiness,
                                                       DaemonMetrics& metrics);
  ~ExpertParallel();
  void Stop();
  // At scrape time; engine metrics only on rank 0 (null elsewhere).
  void RefreshMetrics(const engine::EngineMetrics* engine_metrics);

  struct Impl;

 private:
  explicit ExpertParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::daemon
