// Autoscaling a MoEDeployment on what an inference server is loaded by:
// requests waiting for admission, time to first token, KV-cache use. Three
// parts, each testable alone:
//  - AutoscalingSpec: spec.autoscaling as the operator reads it (the CRD
//    defaults applied); an error names the field.
//  - ParseDaemonLoad / LoadWindow: one node-rank-0 daemon's /metrics text
//    into a reading, and the readings of a deployment's groups over a
//    window into one LoadSample (p90 TTFT from histogram deltas).
//  - DecideReplicas: a pure function from the spec, the current replica
//    count, a sample and the recommendations of the recent past to the
//    replica count wanted, with the reason, as the HPA's algorithm does it:
//    a tolerance band around each target (no action on noise), scale-up
//    only when every recommendation of the up window wanted more, scale-down
//    only after the down delay saw nothing but less, one group at a time.
//
// Replicas are whole replica groups (nodesPerReplica pods each): a decision
// never splits a group, and quota counts what a group costs.
//
// Thread safety: the functions are pure; a LoadWindow or AutoscaleHistory
// belongs to one caller.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

struct AutoscalingSpec {
  bool enabled = false;
  int min_replicas = 1;
  int max_replicas = 1;
  // Targets; 0 = not used. At least one is set when enabled.
  double waiting_requests_per_replica = 0;  // mean moe_requests_waiting per group
  double ttft_p90_seconds = 0;              // p90 of moe_time_to_first_token_seconds over the window
  double kv_cache_usage = 0;                // mean moe_kv_cache_usage_ratio per group, (0, 1]
  double scale_up_stabilization_seconds = 0;
  double scale_down_delay_seconds = 300;
  // Operator-side knobs, not tenant fields: how far from a target a ratio
  // must be before it counts (the HPA's 10 %), and the TTFT window.
  double tolerance = 0.1;
  double ttft_window_seconds = 60;
  bool operator==(const AutoscalingSpec&) const = default;
};

// spec.autoscaling (null or absent: disabled). `replicas_field` is
// spec.replicas, checked against the bounds only when enabled.
Result<AutoscalingSpec> ParseAutoscalingSpec(const nlohmann::json& autoscaling);

// What one daemon's /metrics says now. Counters are cumulative.
struct DaemonLoadReading {
  double waiting = 0;
  double running = 0;
  double kv_cache_usage = 0;
  // moe_time_to_first_token_seconds buckets: upper bound -> cumulative count (+Inf included).
  std::map<double, double> ttft_buckets;
};

// Reads the Prometheus text format; a family that is missing is an error
// naming it, so that a daemon of another kind is never read as idle.
Result<DaemonLoadReading> ParseDaemonLoad(const std::string& metrics_text);

// The p-quantile of a cumulative histogram (Prometheus histogram_quantile:
// linear within the bucket; the +Inf bucket answers its lower bound).
// Negative when it holds no observation.
double HistogramQuantile(const std::map<double, double>& cumulative, double q);

// One deployment's load at one time, over the groups read.
struct LoadSample {
  double time_seconds = 0;
  int groups_read = 0;
  double waiting_per_replica = 0;
  double kv_cache_usage = 0;  // mean over groups
  double ttft_p90_seconds = -1;  // negative: no first token in the window
  uint64_t ttft_observations = 0;
};

// Keeps each group's recent readings so that TTFT is judged on what
// happened in the window, not since the daemon started. A reading whose
// counts went down (the daemon restarted) starts that group afresh.
class LoadWindow {
 public:
  explicit LoadWindow(double window_seconds) : window_seconds_(window_seconds) {}
  // `readings`: group name -> reading, taken at `now_seconds`; groups not
  // read this time are forgotten.
  LoadSample Add(double now_seconds, const std::map<std::string, DaemonLoadReading>& readings);

 private:
  double window_seconds_;
  std::map<std::string, std::deque<std::pair<double, std::map<double, double>>>> history_;
};

struct Recommendation {
  double time_seconds = 0;
  int replicas = 0;
};

// The recommendations of the recent past (kept by the caller, bounded by
// the longer window).
struct AutoscaleHistory {
  std::deque<Recommendation> recommendations;
  double first_seen_seconds = -1;  // when the history began: a window not yet covered holds
};

struct AutoscaleDecision {
  int desired = 0;       // what spec.replicas should be
  int recommended = 0;   // what this sample alone asks for (within bounds)
  std::string reason;    // UpperCamelCase: ScaleUp, ScaleDown, WithinTolerance, ...
  std::string message;   // the numbers behind it
};

AutoscaleDecision DecideReplicas(const AutoscalingSpec& spec, int current, const LoadSample& sample,
                                 AutoscaleHistory& history);

}  // namespace moeserve::op
