// Process-wide pull counters for /metrics (api.md): moe_weights_bytes_pulled_total,
// moe_weights_pulls_total{result}, moe_weights_pull_duration_seconds (histogram).
// The counters are plain atomics; PullMetricsCollectable() exposes them to a
// prometheus-cpp Exposer or Registry-based text exposition at scrape time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace prometheus {
class Collectable;
}

namespace moeserve::storage {

struct PullMetrics {
  std::atomic<uint64_t> bytes_pulled_total{0};
  std::atomic<uint64_t> pulls_succeeded{0};
  std::atomic<uint64_t> pulls_reused{0};  // served from the cache without downloading
  std::atomic<uint64_t> pulls_failed{0};
  void ObserveDuration(double seconds);
  // Histogram state (cumulative buckets), read by the collectable.
  static constexpr double kBuckets[] = {1, 5, 15, 60, 300, 900, 3600, 14400};
  static constexpr int kNumBuckets = sizeof(kBuckets) / sizeof(kBuckets[0]);
  std::atomic<uint64_t> duration_bucket_counts[kNumBuckets] = {};
  std::atomic<uint64_t> duration_count{0};
  std::atomic<uint64_t> duration_sum_ms{0};
};

PullMetrics& GlobalPullMetrics();
// Register with exposer.RegisterCollectable(...) (keeps a weak_ptr: hold this).
std::shared_ptr<prometheus::Collectable> PullMetricsCollectable();
// Prometheus text exposition of the pull metrics alone.
std::string PullMetricsText();

}  // namespace moeserve::storage
