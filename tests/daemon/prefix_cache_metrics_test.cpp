// The prefix cache's bytes, bound, entries and evictions as /metrics shows
// them: taken from a real engine that evicted under its byte bound, equal to
// the engine's own figures, counters advanced by difference only, and the
// exposition clean for `promtool check metrics`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "moeserve/daemon/metrics.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "daemon_harness.hpp"
#include "metric_sample.hpp"

namespace moeserve::daemon {
namespace {

using moeserve::testing::MetricSample;

TEST(PrefixCacheMetrics, ScrapeShowsTheBoundAndEvictions) {
  auto dir = engine::OpenModelDir(testing::TinyModelDir());
  ASSERT_TRUE(dir) << dir.error().ToString();
  engine::EngineOptions o;
  o.cache_tokens = 2048;
  o.prefix_cache_bytes = 300000;  // two 32-token entries of the tiny model (~128 KB each), not three
  auto e = engine::Engine::Create(*dir, o);
  ASSERT_TRUE(e) << e.error().ToString();
  DaemonMetrics metrics;
  auto run = [&](int prompts, uint64_t seed) {
    for (int i = 0; i < prompts; ++i) {
      engine::GenerationRequest r;
      r.prompt = {256, 258};
      for (int t = 0; t < 38; ++t) r.prompt.push_back(32 + static_cast<int>((seed + i * 7 + t * 13) % 90));
      r.max_tokens = 1;
      ASSERT_TRUE((*e)->Submit(std::move(r)));
      while ((*e)->HasWork()) (*e)->Step();
    }
  };
  run(5, 1);
  metrics.UpdateFromEngine((*e)->Metrics());
  run(3, 1000);
  const engine::PrefixCacheStats s = (*e)->Metrics().prefix_cache;
  metrics.UpdateFromEngine((*e)->Metrics());
  metrics.UpdateFromEngine((*e)->Metrics());  // no change: counters must not move
  const std::string text = metrics.Scrape();

  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.evicted_for_bytes, 6u);
  EXPECT_LE(s.bytes, o.prefix_cache_bytes);
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_bytes"), static_cast<double>(s.bytes));
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_limit_bytes"), 300000.0);
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_entries"), 2.0);
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_evictions_total{reason=\"bytes\"}"), 6.0);
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_evictions_total{reason=\"pool\"}"), 0.0);
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_evictions_total{reason=\"entries\"}"), 0.0);
  EXPECT_EQ(MetricSample(text, "moe_prefix_cache_too_large_total"), 0.0);

  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool not installed (scripts/setup installs it)";
  std::string file = ::testing::TempDir() + "/moe_prefix_metrics_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(file) << text;
  std::string cmd = "promtool check metrics < " + file + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  EXPECT_EQ(::pclose(p), 0) << out;
}

}  // namespace
}  // namespace moeserve::daemon
