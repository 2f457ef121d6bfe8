// DecideReplicas: the HPA's algorithm on LLM load signals. Why each rule:
//  - a tolerance band around 1.0 for the load ratio, so noise around a
//    target never moves anything (hysteresis: after a step the ratio lands
//    near 1 and stays inside the band);
//  - scale-up takes the smallest recommendation of the up window, so one
//    spike does not add a group, and scale-down the largest of the down
//    delay, so a lull does not remove one; a window the history does not
//    cover yet (a new deployment, a restarted operator) holds;
//  - scale-down removes one group per step: each removed group drains first.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "moeserve/operator/autoscaling.hpp"

namespace moeserve::op {

namespace {

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

AutoscaleDecision DecideReplicas(const AutoscalingSpec& spec, int current, const LoadSample& sample,
                                 AutoscaleHistory& history) {
  AutoscaleDecision d;
  const double now = sample.time_seconds;
  auto clamp = [&](int n) { return std::clamp(n, spec.min_replicas, spec.max_replicas); };
  // Bounds first: they are the spec's word and need no metrics.
  if (current < spec.min_replicas || current > spec.max_replicas) {
    d.desired = d.recommended = clamp(current);
    if (d.desired < current) d.desired = current - 1;  // still one drained group at a time
    d.reason = current < spec.min_replicas ? "BelowMinReplicas" : "AboveMaxReplicas";
    d.message = std::to_string(current) + " replicas, bounds [" + std::to_string(spec.min_replicas) + ", " +
                std::to_string(spec.max_replicas) + "]";
    return d;
  }
  if (sample.groups_read == 0) {
    d.desired = d.recommended = current;
    d.reason = "NoMetrics";
    d.message = "no replica group's metrics could be read; holding " + std::to_string(current);
    return d;
  }

  // The load ratio: observed / target, the largest over the targets set.
  double ratio = 0;
  std::string because;
  auto consider = [&](double observed, double target, const std::string& what) {
    if (target <= 0) return;
    const double r = observed / target;
    because += (because.empty() ? "" : ", ") + what + " " + Fixed(observed) + "/" + Fixed(target);
    ratio = std::max(ratio, r);
  };
  consider(sample.waiting_per_replica, spec.waiting_requests_per_replica, "waiting per replica");
  // No first token in the window means nothing waited for one: no TTFT load.
  consider(std::max(0.0, sample.ttft_p90_seconds), spec.ttft_p90_seconds, "p90 TTFT s");
  consider(sample.kv_cache_usage, spec.kv_cache_usage, "KV cache use");

  int recommended = current;
  if (std::fabs(ratio - 1.0) > spec.tolerance) {
    recommended = static_cast<int>(std::ceil(sample.groups_read * ratio - 1e-9));
    // Groups still starting have no reading yet: never recommend fewer than
    // exist because of them when the read ones are busy.
    if (ratio > 1.0) recommended = std::max(recommended, current);
  }
  recommended = clamp(recommended);
  d.recommended = recommended;
  d.desired = current;
  d.message = because + " (load ratio " + Fixed(ratio) + " over " + std::to_string(sample.groups_read) +
              " groups read); recommends " + std::to_string(recommended);

  // Remember this recommendation; forget what no window looks at any more.
  if (history.first_seen_seconds < 0) history.first_seen_seconds = now;
  history.recommendations.push_back({now, recommended});
  const double keep = std::max(spec.scale_up_stabilization_seconds, spec.scale_down_delay_seconds);
  while (!history.recommendations.empty() && history.recommendations.front().time_seconds < now - keep)
    history.recommendations.pop_front();
  const double seen = now - history.first_seen_seconds;

  auto over_window = [&](double window, bool smallest) {
    int v = recommended;
    for (const auto& r : history.recommendations)
      if (r.time_seconds >= now - window) v = smallest ? std::min(v, r.replicas) : std::max(v, r.replicas);
    return v;
  };
  if (recommended > current) {
    if (seen < spec.scale_up_stabilization_seconds) {
      d.reason = "ScaleUpStabilizing";
      return d;
    }
    const int up = over_window(spec.scale_up_stabilization_seconds, true);
    if (up > current) {
      d.desired = up;
      d.reason = "ScaleUp";
    } else {
      d.reason = "ScaleUpStabilizing";
    }
  } else if (recommended < current) {
    if (seen < spec.scale_down_delay_seconds) {
      d.reason = "ScaleDownDelayed";
      return d;
    }
    const int down = over_window(spec.scale_down_delay_seconds, false);
    if (down < current) {
      d.desired = current - 1;
      d.reason = "ScaleDown";
    } else {
      d.reason = "ScaleDownDelayed";
    }
  } else {
    d.reason = std::fabs(ratio - 1.0) > spec.tolerance ? "AtLimit" : "WithinTolerance";
  }
  return d;
}

}  // namespace moeserve::op
