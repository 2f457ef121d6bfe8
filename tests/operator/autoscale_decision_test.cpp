// The autoscaler's arithmetic on recorded metric series: spec.autoscaling
// parsing, the daemon's /metrics text, p90 TTFT from histogram deltas over a
// window, and DecideReplicas replayed over series sampled every 5 s (noise
// around a target, a ramp and its end, a single spike, bounds).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moeserve/operator/autoscaling.hpp"
#include "moeserve/operator/moedeployment.hpp"

namespace moeserve::op {
namespace {

using nlohmann::json;

AutoscalingSpec WaitingTarget(double target, int min, int max, double up_s, double down_s) {
  AutoscalingSpec s;
  s.enabled = true;
  s.min_replicas = min;
  s.max_replicas = max;
  s.waiting_requests_per_replica = target;
  s.scale_up_stabilization_seconds = up_s;
  s.scale_down_delay_seconds = down_s;
  return s;
}

// Replays `waiting_total` (requests waiting summed over the groups, one
// value per 5 s) against a deployment that follows every decision at once;
// returns the replica count after each sample.
std::vector<int> Replay(const AutoscalingSpec& spec, int start, const std::vector<double>& waiting_total,
                        std::vector<std::string>* reasons = nullptr) {
  AutoscaleHistory history;
  int replicas = start;
  std::vector<int> out;
  double t = 1000;
  for (double w : waiting_total) {
    LoadSample s;
    s.time_seconds = t;
    s.groups_read = replicas;
    s.waiting_per_replica = w / replicas;
    AutoscaleDecision d = DecideReplicas(spec, replicas, s, history);
    if (reasons) reasons->push_back(d.reason);
    replicas = d.desired;
    out.push_back(replicas);
    t += 5;
  }
  return out;
}

TEST(AutoscaleSpec, DefaultsAndFieldNamedErrors) {
  auto off = ParseAutoscalingSpec(json());
  ASSERT_TRUE(off);
  EXPECT_FALSE(off->enabled);
  auto on = ParseAutoscalingSpec(json::parse(R"({"minReplicas":2,"maxReplicas":6,
      "targets":{"waitingRequestsPerReplica":4,"ttftP90Seconds":1.5,"kvCacheUsage":0.8},
      "scaleUpStabilizationSeconds":30,"scaleDownDelaySeconds":120})"));
  ASSERT_TRUE(on) << on.error().message();
  EXPECT_TRUE(on->enabled);
  EXPECT_EQ(on->min_replicas, 2);
  EXPECT_EQ(on->max_replicas, 6);
  EXPECT_DOUBLE_EQ(on->ttft_p90_seconds, 1.5);
  EXPECT_DOUBLE_EQ(on->scale_down_delay_seconds, 120);

  struct Bad {
    const char* spec;
    const char* field;
  };
  for (const Bad& b : std::vector<Bad>{
           {R"("yes")", "spec.autoscaling: must be an object"},
           {R"({"enabled":"true","targets":{"kvCacheUsage":0.5}})", "spec.autoscaling.enabled"},
           {R"({"minReplicas":0,"targets":{"kvCacheUsage":0.5}})", "spec.autoscaling.minReplicas"},
           {R"({"minReplicas":3,"maxReplicas":2,"targets":{"kvCacheUsage":0.5}})", "spec.autoscaling.maxReplicas"},
           {R"({"maxReplicas":1.5,"targets":{"kvCacheUsage":0.5}})", "spec.autoscaling.maxReplicas"},
           {R"({"maxReplicas":2,"targets":{"kvCacheUsage":1.5}})", "spec.autoscaling.targets.kvCacheUsage"},
           {R"({"maxReplicas":2,"targets":{"ttftP90Seconds":"fast"}})", "spec.autoscaling.targets.ttftP90Seconds"},
           {R"({"maxReplicas":2,"targets":{"waitingRequestsPerReplica":-1}})",
            "spec.autoscaling.targets.waitingRequestsPerReplica"},
           {R"({"maxReplicas":2,"targets":[]})", "spec.autoscaling.targets"},
           {R"({"maxReplicas":2})", "spec.autoscaling.targets: set at least one"},
           {R"({"maxReplicas":2,"targets":{"kvCacheUsage":0.5},"scaleDownDelaySeconds":-5})",
            "spec.autoscaling.scaleDownDelaySeconds"},
       }) {
    auto r = ParseAutoscalingSpec(json::parse(b.spec));
    ASSERT_FALSE(r) << b.spec;
    EXPECT_NE(r.error().message().find(b.field), std::string::npos) << b.spec << " -> " << r.error().message();
  }
  // Disabled needs no target; the whole spec carries the same error.
  EXPECT_TRUE(ParseAutoscalingSpec(json::parse(R"({"enabled":false})")));
  json md_spec = {{"image", "i"}, {"model", {{"uri", "s3://b/m/"}}}, {"autoscaling", {{"maxReplicas", 2}}}};
  auto parsed = ParseMoEDeploymentSpec(md_spec);
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.error().message().find("spec.autoscaling.targets"), std::string::npos);
}

// A daemon's /metrics as prometheus-cpp writes it (trimmed to the families read, plus a neighbour).
const char* kMetrics = R"(# HELP moe_requests_waiting Sequences queued for admission
# TYPE moe_requests_waiting gauge
moe_requests_waiting 3
# TYPE moe_requests_running gauge
moe_requests_running 8
# TYPE moe_kv_cache_usage_ratio gauge
moe_kv_cache_usage_ratio 0.625
# TYPE moe_time_to_first_token_seconds histogram
moe_time_to_first_token_seconds_count 10
moe_time_to_first_token_seconds_sum 4.2
moe_time_to_first_token_seconds_bucket{le="0.1"} 2
moe_time_to_first_token_seconds_bucket{le="0.5"} 6
moe_time_to_first_token_seconds_bucket{le="1"} 9
moe_time_to_first_token_seconds_bucket{le="+Inf"} 10
moe_requests_waiting_other 99
)";

TEST(AutoscaleLoad, ParsesDaemonMetricsAndRefusesOtherServers) {
  auto r = ParseDaemonLoad(kMetrics);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->waiting, 3);
  EXPECT_EQ(r->running, 8);
  EXPECT_DOUBLE_EQ(r->kv_cache_usage, 0.625);
  ASSERT_EQ(r->ttft_buckets.size(), 4u);
  EXPECT_TRUE(std::isinf(r->ttft_buckets.rbegin()->first));
  // rank 9 of 10 lies at the top of the (0.5, 1] bucket.
  EXPECT_DOUBLE_EQ(HistogramQuantile(r->ttft_buckets, 0.9), 1.0);
  // rank 5 of 10: 3/4 of the way through (0.1, 0.5].
  EXPECT_DOUBLE_EQ(HistogramQuantile(r->ttft_buckets, 0.5), 0.4);

  auto other = ParseDaemonLoad("# a different server\nhttp_requests_total 5\n");
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message().find("moe_requests_waiting"), std::string::npos);
  auto garbled = ParseDaemonLoad(std::string(kMetrics).replace(std::string(kMetrics).find(" 0.625"), 6, " high"));
  ASSERT_FALSE(garbled);
  EXPECT_NE(garbled.error().message().find("moe_kv_cache_usage_ratio"), std::string::npos);
}

DaemonLoadReading Reading(double waiting, double kv, std::map<double, double> buckets) {
  DaemonLoadReading r;
  r.waiting = waiting;
  r.kv_cache_usage = kv;
  r.ttft_buckets = std::move(buckets);
  return r;
}

TEST(AutoscaleLoad, TtftIsJudgedOnTheWindowNotSinceStart) {
  const double inf = INFINITY;
  LoadWindow window(60);
  // A first reading says nothing about when its (slow) counts happened.
  auto s0 = window.Add(0, {{"r0", Reading(0, 0.1, {{0.1, 0}, {1, 0}, {10, 100}, {inf, 100}})}});
  EXPECT_LT(s0.ttft_p90_seconds, 0);
  // 40 fast first tokens since: the p90 of the window is fast.
  auto s1 = window.Add(30, {{"r0", Reading(0, 0.1, {{0.1, 40}, {1, 40}, {10, 140}, {inf, 140}})},
                            {"r1", Reading(4, 0.5, {{0.1, 0}, {1, 0}, {10, 0}, {inf, 0}})}});
  EXPECT_EQ(s1.ttft_observations, 40u);
  EXPECT_LE(s1.ttft_p90_seconds, 0.1);
  EXPECT_EQ(s1.groups_read, 2);
  EXPECT_DOUBLE_EQ(s1.waiting_per_replica, 2);
  EXPECT_DOUBLE_EQ(s1.kv_cache_usage, 0.3);
  // r0 restarts (counts fall): its slow past is not read as negative or old load.
  auto s2 = window.Add(60, {{"r0", Reading(0, 0.1, {{0.1, 0}, {1, 0}, {10, 5}, {inf, 5}})},
                            {"r1", Reading(0, 0.5, {{0.1, 0}, {1, 10}, {10, 10}, {inf, 10}})}});
  EXPECT_EQ(s2.ttft_observations, 10u);
  EXPECT_GT(s2.ttft_p90_seconds, 0.1);
  EXPECT_LE(s2.ttft_p90_seconds, 1.0);
  // Past the window the old observations drop out (r1's baseline moves to t=60).
  auto s3 = window.Add(125, {{"r0", Reading(0, 0.1, {{0.1, 0}, {1, 0}, {10, 5}, {inf, 5}})},
                             {"r1", Reading(0, 0.5, {{0.1, 0}, {1, 10}, {10, 10}, {inf, 10}})}});
  EXPECT_EQ(s3.ttft_observations, 0u);
  EXPECT_LT(s3.ttft_p90_seconds, 0);
}

TEST(AutoscaleDecision, NoiseAroundTheTargetNeverMovesAnything) {
  // Target 4 waiting per replica, 3 replicas; the total wanders 11..13 (ratio 0.92..1.08).
  std::vector<double> noise;
  for (int i = 0; i < 120; ++i) noise.push_back(12 + ((i * 7) % 5 - 2) * 0.5);
  std::vector<std::string> reasons;
  auto replicas = Replay(WaitingTarget(4, 1, 10, 0, 30), 3, noise, &reasons);
  for (size_t i = 0; i < replicas.size(); ++i) {
    EXPECT_EQ(replicas[i], 3) << "sample " << i;
    EXPECT_EQ(reasons[i], "WithinTolerance") << "sample " << i;
  }
}

TEST(AutoscaleDecision, RampScalesUpAtOnceAndDownOneGroupPerDelay) {
  // 1 replica, target 2: idle, a ramp to 16 waiting, held, then idle again.
  std::vector<double> series;
  for (int i = 0; i < 4; ++i) series.push_back(0);
  for (double w : {2.0, 4.0, 8.0, 16.0}) series.push_back(w);
  for (int i = 0; i < 6; ++i) series.push_back(16);
  for (int i = 0; i < 40; ++i) series.push_back(0);
  std::vector<std::string> reasons;
  auto replicas = Replay(WaitingTarget(2, 1, 6, 0, 20), 1, series, &reasons);
  // Up: 2 waiting on 1 replica is the target; 4 -> 2, 8 on 2 -> 4, 16 on 4 -> 8, capped at 6.
  EXPECT_EQ(replicas[4], 1);
  EXPECT_EQ(replicas[5], 2);
  EXPECT_EQ(replicas[6], 4);
  EXPECT_EQ(replicas[7], 6);
  EXPECT_EQ(reasons[7], "ScaleUp");
  EXPECT_EQ(replicas[13], 6);
  EXPECT_EQ(reasons[13], "AtLimit");  // 16 on 6 is past the target, but 6 is the maximum
  // Down: nothing for the first 20 s of idleness (the delay), then one group per step down to the minimum.
  for (int i = 14; i < 18; ++i) EXPECT_EQ(replicas[i], 6) << "sample " << i;
  EXPECT_EQ(reasons[14], "ScaleDownDelayed");
  EXPECT_EQ(replicas[18], 5);
  EXPECT_EQ(reasons[18], "ScaleDown");
  for (size_t i = 19; i < replicas.size(); ++i) EXPECT_GE(replicas[i], replicas[i - 1] - 1) << "sample " << i;
  EXPECT_EQ(replicas.back(), 1);
  // Never below the minimum, never flapping back up once the load is gone.
  for (size_t i = 14; i < replicas.size(); ++i) EXPECT_LE(replicas[i], replicas[i - 1]) << "sample " << i;
}

TEST(AutoscaleDecision, UpStabilisationIgnoresASingleSpike) {
  // 2 replicas at target; one 5 s spike to 30 waiting, then back.
  std::vector<double> series(10, 8.0);
  series[5] = 30;
  std::vector<std::string> reasons;
  auto replicas = Replay(WaitingTarget(4, 1, 8, 15, 60), 2, series, &reasons);
  for (size_t i = 0; i < replicas.size(); ++i) EXPECT_EQ(replicas[i], 2) << "sample " << i;
  EXPECT_EQ(reasons[5], "ScaleUpStabilizing");
  // The same load held for the whole window does scale up, by the window's smallest ask.
  std::vector<double> held(10, 8.0);
  for (int i = 5; i < 10; ++i) held[i] = 30;
  auto up = Replay(WaitingTarget(4, 1, 8, 15, 60), 2, held, &reasons);
  EXPECT_EQ(up[7], 2);  // 5, 10 s into the load: still stabilising
  EXPECT_EQ(up[8], 8);  // 15 s: ceil(2 * 30/8) = 8
}

TEST(AutoscaleDecision, DipsShorterThanTheDelayRemoveNothing) {
  // 4 replicas busy at target, with 10 s lulls every 30 s: the down delay of 20 s never sees only "fewer".
  std::vector<double> series;
  for (int i = 0; i < 60; ++i) series.push_back(i % 6 < 2 ? 0.0 : 16.0);
  auto replicas = Replay(WaitingTarget(4, 1, 8, 0, 20), 4, series);
  for (size_t i = 0; i < replicas.size(); ++i) EXPECT_EQ(replicas[i], 4) << "sample " << i;
}

TEST(AutoscaleDecision, BoundsNoMetricsAndWholeGroups) {
  AutoscaleHistory history;
  auto spec = WaitingTarget(4, 2, 5, 0, 0);
  LoadSample idle;
  idle.time_seconds = 1;
  idle.groups_read = 1;
  // Below the minimum: raised at once, whatever the load says.
  auto d = DecideReplicas(spec, 1, idle, history);
  EXPECT_EQ(d.desired, 2);
  EXPECT_EQ(d.reason, "BelowMinReplicas");
  // Above the maximum: lowered one drained group at a time.
  d = DecideReplicas(spec, 8, idle, history);
  EXPECT_EQ(d.desired, 7);
  EXPECT_EQ(d.reason, "AboveMaxReplicas");
  // Nothing read: hold, whatever the history says.
  LoadSample none;
  none.time_seconds = 2;
  d = DecideReplicas(spec, 3, none, history);
  EXPECT_EQ(d.desired, 3);
  EXPECT_EQ(d.reason, "NoMetrics");
  // A group still starting (2 of 3 read, both busy) is not counted as idle capacity to remove.
  LoadSample busy;
  busy.time_seconds = 3;
  busy.groups_read = 2;
  busy.waiting_per_replica = 5;  // ratio 1.25: ceil(2 * 1.25) = 3, no more than exist
  d = DecideReplicas(spec, 3, busy, history);
  EXPECT_EQ(d.desired, 3);
  // KV-cache pressure alone scales up, the largest ratio decides.
  AutoscalingSpec kv = spec;
  kv.kv_cache_usage = 0.5;
  LoadSample full;
  full.time_seconds = 4;
  full.groups_read = 2;
  full.kv_cache_usage = 0.95;
  AutoscaleHistory h2;
  d = DecideReplicas(kv, 2, full, h2);
  EXPECT_EQ(d.desired, 4);
  EXPECT_EQ(d.reason, "ScaleUp");
  EXPECT_NE(d.message.find("KV cache use"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::op
