// Prefill of the `long` preset (six Gated DeltaNet and two DSA layers at
// tiny's widths, model_config.cpp) to long contexts: each length's prompt
// runs through the model in chunks of --chunk tokens (2048, the engine's
// prefill_chunk_tokens_idle: a prompt alone), one Forward per chunk with the
// cache in a KvPool of the engine's 16-token blocks, as the engine's step
// does. Printed per length:
//   tokens/s, and the chunks' times, first and last;
//   peak resident memory (VmHWM, reset before each length through
//   /proc/self/clear_refs) above what the process held before it, against
//   what ContextCost (engine/context_bytes.hpp, docs/model-format.md 5.4)
//   predicts for the context (pool blocks + recurrent state): target +10%;
//   the cache bytes per token by layer kind;
//   the time by layer kind and part (ForwardProfile), the indexer's share.
// Then, from a straight-line fit of chunk time against the chunk's starting
// position over the longest length (the indexer, its top-k and the rows'
// pointer table are linear in the context per chunk, the rest constant), the
// modelled prefill time of --extrapolate tokens.
//
// --indexer-scores int8 runs the DSA indexer on int8 keys and queries
// (ModelOptions::indexer_scores; the pool rows then hold the keys int8).
//
//   bench_long_prefill [--lengths 32K,128K] [--chunk 2048] [--extrapolate 1M] [--model DIR] [--indexer-scores exact|int8]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "moeserve/engine/context_bytes.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "long_preset.hpp"

namespace me = moeserve::engine;
using moeserve::bench::ParseLength;

namespace {

const auto& kRowNames = me::kProfileRowNames;
const auto& kPartNames = me::kProfilePartNames;

int64_t StatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0) return std::atoll(line.c_str() + n);
  return -1;
}

// Resets VmHWM to the current resident size (Linux 4.0+); false when refused.
bool ResetPeak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {32768, 131072};
  int chunk = 2048;
  int64_t extrapolate = 1 << 20;
  std::string model_path;
  me::ModelOptions mo;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--lengths" && v) {
      if (!moeserve::bench::ParseLengths(v, lengths)) return 2;
      ++i;
    } else if (a == "--chunk" && v) {
      chunk = std::atoi(v), ++i;
    } else if (a == "--extrapolate" && v) {
      extrapolate = ParseLength(v), ++i;
    } else if (a == "--model" && v) {
      model_path = v, ++i;
    } else if (a == "--indexer-scores" && v && (std::string(v) == "exact" || std::string(v) == "int8")) {
      mo.indexer_scores = std::string(v) == "int8" ? me::IndexerScores::kInt8 : me::IndexerScores::kExact, ++i;
    } else {
      std::fprintf(stderr, "usage: bench_long_prefill [--lengths 32K,128K] [--chunk 2048] [--extrapolate 1M] [--model DIR] "
                           "[--indexer-scores exact|int8]\n");
      return 2;
    }
  }
  if (chunk <= 0 || extrapolate <= 0) {
    std::fprintf(stderr, "--chunk and --extrapolate must be positive\n");
    return 2;
  }
  std::sort(lengths.begin(), lengths.end());
  const moeserve::bench::LongModel long_model("bench_long_prefill", model_path, mo);
  me::Model* const model = long_model.get();
  if (model == nullptr) return 1;
  model_path = long_model.path();
  const me::ModelConfig& cfg = model->config();
  if (static_cast<int64_t>(lengths.back()) > cfg.max_position_embeddings) {
    std::fprintf(stderr, "--lengths: %lld exceeds max_position_embeddings %lld\n", static_cast<long long>(lengths.back()),
                 static_cast<long long>(cfg.max_position_embeddings));
    return 2;
  }
  constexpr int kBlockTokens = 16;  // EngineOptions::block_tokens
  const size_t fpt = model->cache_floats_per_token();
  const int64_t state_bytes = me::RecurrentStateBytes(model->NewSequence());
  const bool int8 = mo.indexer_scores == me::IndexerScores::kInt8;
  std::printf("bench_long_prefill: %s, %d threads, chunks of %d tokens, %d-token blocks, %s indexer scores\n",
              model_path.c_str(), moeserve::kernels::DefaultThreadPool().size(), chunk, kBlockTokens,
              int8 ? "int8" : "exact (fp32)");
  // Cache bytes per token by layer kind (docs/model-format.md 5.4).
  int n_mla = 0, n_dsa = 0, n_delta = 0;
  for (me::LayerKind k : cfg.layer_types) {
    n_mla += k == me::LayerKind::kMla, n_dsa += k == me::LayerKind::kDsa, n_delta += k == me::LayerKind::kDelta;
  }
  const int mla_row = 4 * (cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim);
  const int dsa_row = mla_row + 4 * static_cast<int>(int8 ? moeserve::kernels::IndexerInt8KeyFloats(cfg.dsa.index_head_dim)
                                                            : static_cast<size_t>(cfg.dsa.index_head_dim));
  std::printf("cache per token: %d mla x %d B + %d dsa x %d B = %d B (pool row %zu B); %d delta layers: 0 B per token, "
              "%lld B of state per sequence\n",
              n_mla, mla_row, n_dsa, dsa_row, n_mla * mla_row + n_dsa * dsa_row, fpt * 4, n_delta,
              static_cast<long long>(state_bytes));

  const int V = cfg.vocab_size;
  std::vector<float> logits;
  {  // one untimed chunk: page faults on the weights and the kernels' scratch
    me::KvPool wp((chunk + kBlockTokens - 1) / kBlockTokens + 1, kBlockTokens, fpt, model->cache_stripes());
    me::SequenceCache wc = model->NewSequence();
    std::vector<int> warm(static_cast<size_t>(chunk), 7);
    if (!me::EnsureBlocks(wp, wc, chunk)) return 1;
    me::ForwardSegment seg{&wc, warm, false};
    if (!model->Forward(wp, std::span(&seg, 1), &logits)) return 1;
    me::ReleaseBlocks(wp, wc);
  }
  std::printf("%9s %10s %9s %11s %11s %12s %12s %8s %9s\n", "tokens", "seconds", "tok/s", "first ms", "last ms",
              "peak MiB", "predicted", "ratio", "indexer");
  std::vector<double> fit_x, fit_y;  // the longest length's chunks: start position, seconds
  for (int64_t L : lengths) {
    std::mt19937 rng(7);
    std::vector<int> prompt(static_cast<size_t>(L));
    for (int& t : prompt) t = static_cast<int>(rng() % static_cast<unsigned>(V));
    const bool peak_reset = ResetPeak();
    const int64_t before_kb = StatusKb("VmRSS:");
    me::ForwardProfile profile;
    me::ForwardTrace trace;
    trace.record_dsa = false;
    trace.profile = &profile;
    std::vector<double> chunk_s;
    std::vector<double> chunk_pos;
    double total = 0;
    {
      me::KvPool pool((L + kBlockTokens - 1) / kBlockTokens, kBlockTokens, fpt, model->cache_stripes());
      me::SequenceCache cache = model->NewSequence();
      for (int64_t p = 0; p < L; p += chunk) {
        const int n = static_cast<int>(std::min<int64_t>(chunk, L - p));
        if (!me::EnsureBlocks(pool, cache, p + n)) {
          std::fprintf(stderr, "pool full at %lld\n", static_cast<long long>(p));
          return 1;
        }
        me::ForwardSegment seg{&cache, std::span<const int>(prompt.data() + p, static_cast<size_t>(n)), false};
        const auto t0 = std::chrono::steady_clock::now();
        if (auto st = model->Forward(pool, std::span(&seg, 1), &logits, &trace); !st) {
          std::fprintf(stderr, "forward: %s\n", st.error().ToString().c_str());
          return 1;
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        total += s;
        chunk_s.push_back(s);
        chunk_pos.push_back(static_cast<double>(p));
      }
      me::ReleaseBlocks(pool, cache);
    }
    const int64_t peak_kb = StatusKb("VmHWM:");
    const int64_t grew = (peak_kb - before_kb) * 1024;
    const me::ContextBytes predicted = me::ContextCost(fpt, kBlockTokens, state_bytes, L);
    double all = 0, indexer = 0;
    for (int r = 0; r < me::kProfileRows; ++r)
      for (int i = 0; i < me::kProfileParts; ++i) all += profile.seconds[r][i];
    for (int r = 0; r < me::kProfileRows; ++r) indexer += profile.seconds[r][static_cast<int>(me::ProfilePart::kIndexer)];
    std::printf("%9lld %10.1f %9.0f %11.1f %11.1f %12.1f %12.1f %8.3f %8.1f%%%s\n", static_cast<long long>(L), total,
                static_cast<double>(L) / total, chunk_s.front() * 1e3, chunk_s.back() * 1e3, MiB(grew),
                MiB(predicted.total()), static_cast<double>(grew) / static_cast<double>(predicted.total()),
                100.0 * indexer / std::max(all, 1e-12), peak_reset ? "" : " (VmHWM not reset: peak since start)");
    std::printf("  peak RSS above the process before it: %.1f MiB, ContextCost %.1f MiB (pool %.1f + state %.3f): %s "
                "(target +10%%)\n",
                MiB(grew), MiB(predicted.total()), MiB(predicted.pool_bytes), MiB(predicted.state_bytes),
                grew <= predicted.total() * 11 / 10 ? "within" : "OVER");
    std::printf("  time by layer kind and part (s; %.1f s timed of %.1f s):\n", all, total);
    std::printf("  %-6s", "");
    for (const char* n : kPartNames) std::printf(" %11s", n);
    std::printf(" %9s\n", "total");
    for (int r = 0; r < me::kProfileRows; ++r) {
      double row = 0;
      for (int i = 0; i < me::kProfileParts; ++i) row += profile.seconds[r][i];
      if (row == 0) continue;
      std::printf("  %-6s", kRowNames[r]);
      for (int i = 0; i < me::kProfileParts; ++i) std::printf(" %11.2f", profile.seconds[r][i]);
      std::printf(" %9.2f\n", row);
    }
    std::fflush(stdout);
    fit_x = chunk_pos, fit_y = chunk_s;
  }
  // Chunk time = a + b * position, least squares over the longest length's
  // full chunks; the prefill of N tokens is the sum over its chunks.
  if (fit_x.size() >= 4) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const size_t m = fit_x.size() - 1;  // the last chunk may be short
    for (size_t i = 0; i < m; ++i) sx += fit_x[i], sy += fit_y[i], sxx += fit_x[i] * fit_x[i], sxy += fit_x[i] * fit_y[i];
    const double b = (m * sxy - sx * sy) / (m * sxx - sx * sx), a = (sy - b * sx) / m;
    double modelled = 0;
    for (int64_t p = 0; p < extrapolate; p += chunk) modelled += a + b * static_cast<double>(p);
    std::printf("chunk time ~ %.1f ms + %.3f ms per 1K tokens of context before it (fit over %zu chunks); modelled "
                "prefill of %lld tokens: %.0f s (%.1f min, %.0f tok/s); last chunk %.0f ms\n",
                a * 1e3, b * 1e3 * 1024, m, static_cast<long long>(extrapolate), modelled, modelled / 60,
                static_cast<double>(extrapolate) / modelled, (a + b * static_cast<double>(extrapolate - chunk)) * 1e3);
  }
  return 0;
}
