#include "moeserve/storage/pull_metrics.hpp"

#include <limits>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

namespace moeserve::storage {

void PullMetrics::ObserveDuration(double seconds) {
  for (int i = 0; i < kNumBuckets; ++i)
    if (seconds <= kBuckets[i]) duration_bucket_counts[i].fetch_add(1, std::memory_order_relaxed);
  duration_count.fetch_add(1, std::memory_order_relaxed);
  duration_sum_ms.fetch_add(static_cast<uint64_t>(seconds * 1000.0), std::memory_order_relaxed);
}

PullMetrics& GlobalPullMetrics() {
  static PullMetrics metrics;
  return metrics;
}

namespace {

class PullMetricsCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    const PullMetrics& m = GlobalPullMetrics();
    std::vector<prometheus::MetricFamily> out;

    prometheus::MetricFamily bytes{"moe_weights_bytes_pulled_total",
                                   "Bytes of model weights downloaded from object storage", prometheus::MetricType::Counter, {}};
    prometheus::ClientMetric b;
    b.counter.value = static_cast<double>(m.bytes_pulled_total.load());
    bytes.metric.push_back(b);
    out.push_back(std::move(bytes));

    prometheus::MetricFamily pulls{"moe_weights_pulls_total", "Weight pulls by result (downloaded, reused, failed)",
                                   prometheus::MetricType::Counter, {}};
    for (auto [label, value] : {std::pair{"downloaded", m.pulls_succeeded.load()}, std::pair{"reused", m.pulls_reused.load()},
                                std::pair{"failed", m.pulls_failed.load()}}) {
      prometheus::ClientMetric c;
      c.label.push_back({"result", label});
      c.counter.value = static_cast<double>(value);
      pulls.metric.push_back(c);
    }
    out.push_back(std::move(pulls));

    prometheus::MetricFamily duration{"moe_weights_pull_duration_seconds",
                                      "Wall time of weight pulls that downloaded, verification included",
                                      prometheus::MetricType::Histogram, {}};
    prometheus::ClientMetric h;
    h.histogram.sample_count = m.duration_count.load();
    h.histogram.sample_sum = static_cast<double>(m.duration_sum_ms.load()) / 1000.0;
    for (int i = 0; i < PullMetrics::kNumBuckets; ++i)
      h.histogram.bucket.push_back({m.duration_bucket_counts[i].load(), PullMetrics::kBuckets[i]});
    h.histogram.bucket.push_back({h.histogram.sample_count, std::numeric_limits<double>::infinity()});
    duration.metric.push_back(h);
    out.push_back(std::move(duration));
    return out;
  }
};

}  // namespace

std::shared_ptr<prometheus::Collectable> PullMetricsCollectable() {
  static std::shared_ptr<prometheus::Collectable> collector = std::make_shared<PullMetricsCollector>();
  return collector;
}

std::string PullMetricsText() {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(PullMetricsCollectable()->Collect());
}

}  // namespace moeserve::storage
