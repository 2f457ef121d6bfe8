// bench_prefill for gpt-oss (gpt_oss_prefill.hpp).
#include "gpt_oss_prefill.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>

#include "../roofline/peaks.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::bench {

namespace {

namespace me = moeserve::engine;

// Logical FLOPs of prefilling `tokens` in chunks of `chunk`: 2 M N K per
// product; attention 4 * heads * head_dim per (query, key read), a banded
// layer reading at most sliding_window keys; the head on each chunk's last row.
double PrefillFlops(const me::GptOssConfig& c, int tokens, int chunk) {
  const double hd = c.hidden, d = c.head_dim, H = c.heads, KV = c.kv_heads, I = c.intermediate;
  const double per_token_layer = 2 * hd * (H + 2 * KV) * d + 2 * H * d * hd + 2 * hd * c.experts +
                                 c.experts_per_token * (2 * hd * 2 * I + 2 * I * hd);
  double f = per_token_layer * c.layers * tokens;
  for (int layer = 0; layer < c.layers; ++layer) {
    const bool banded = c.sliding[static_cast<size_t>(layer)] && c.sliding_window > 0;
    for (int p = 0; p < tokens; ++p) f += 4 * H * d * (banded ? std::min(p + 1, c.sliding_window) : p + 1);
  }
  const int chunks = (tokens + chunk - 1) / chunk;
  return f + 2.0 * hd * c.vocab * chunks;
}

}  // namespace

int RunGptOssPrefill(const GptOssPrefillArgs& args) {
  GptOssPrefillArgs a = args;
  // The model alone, as moe-run's id-level runs load it: no tokenizer needed.
  auto loaded = me::GptOssModel::Load(a.model, a.reference ? kernels::Isa::kReference : kernels::BestIsa(),
                                      a.bf16_activations && !a.reference);
  if (!loaded) return std::fprintf(stderr, "bench_prefill: load: %s\n", loaded.error().ToString().c_str()), 1;
  const me::GptOssModel* model = loaded->get();
  const me::GptOssConfig& c = model->config();
  if (a.chunk <= 0) a.chunk = model->idle_prefill_rows();
  const int threads = kernels::DefaultThreadPool().size();
  const kernels::KernelSet& ks = model->kernels();
  double fma = 0, dot = 0;
  if (a.ceilings) {
    fma = FmaPeak(threads, kernels::IsaSupported(kernels::Isa::kAvx512));
    dot = Bf16DotPeak(threads);
  }
  // BF16 dot products run only where the CPU has them and the option asked.
  const bool dot_bound = a.bf16_activations && !a.reference && dot > 0;
  std::printf("bench_prefill: %s (gpt-oss, %d layers), %d threads, kernels %s (%s, %s); chunks of %d tokens\n",
              a.model.c_str(), c.layers, threads, kernels::IsaName(ks.isa), ks.matmul_mxfp4.name, ks.matmul_bf16.name,
              a.chunk);
  std::printf("ceilings: fp32 FMA peak %.1f GFLOP/s, BF16 dot peak %.1f GFLOP/s\n", fma / 1e9, dot / 1e9);
  constexpr int kBlockTokens = 16;
  std::vector<float> logits;
  bool warm = false;
  for (int L : a.lengths) {
    if (L < 1 || L > c.max_position)
      return std::fprintf(stderr, "bench_prefill: --tokens %d is outside [1, %d]\n", L, c.max_position), 1;
    me::KvPool pool((L + kBlockTokens - 1) / kBlockTokens + 1, kBlockTokens, model->cache_floats_per_token());
    std::mt19937 rng(7);
    std::vector<int> prompt(static_cast<size_t>(L));
    for (int& t : prompt) t = static_cast<int>(rng() % static_cast<unsigned>(c.vocab));
    me::ForwardProfile profile;
    me::ForwardTrace trace;
    trace.record_dsa = false;
    trace.profile = &profile;
    auto prefill = [&](int upto) -> bool {
      me::SequenceCache cache = model->NewSequence();
      for (int p = 0; p < upto; p += a.chunk) {
        const int n = std::min(a.chunk, upto - p);
        if (auto st = me::EnsureBlocks(pool, cache, p + n); !st)
          return std::fprintf(stderr, "bench_prefill: blocks: %s\n", st.error().ToString().c_str()), false;
        me::ForwardSegment seg{&cache, std::span<const int>(prompt.data() + p, static_cast<size_t>(n)), false};
        if (auto st = model->Forward(pool, std::span(&seg, 1), &logits, &trace); !st)
          return std::fprintf(stderr, "bench_prefill: forward: %s\n", st.error().ToString().c_str()), false;
      }
      me::ReleaseBlocks(pool, cache);
      return true;
    };
    // One untimed chunk first: page faults on the weights and the scratch.
    if (!warm && !prefill(std::min(a.chunk, L))) return 1;
    warm = true;
    profile = me::ForwardProfile{};
    std::vector<double> seconds;
    for (int r = 0; r < a.repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!prefill(L)) return 1;
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double flops = PrefillFlops(c, L, a.chunk);
    std::printf("\nprefill of %d tokens, %.1f GFLOP (%.1f MFLOP/token); runs, tokens/s:", L, flops / 1e9, flops / L / 1e6);
    for (double s : seconds) std::printf(" %.1f", L / s);
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::printf("\nmedian %.1f tokens/s, %.1f GFLOP/s", L / median, flops / median / 1e9);
    if (fma > 0) {
      const double bound = dot_bound ? dot : fma;
      std::printf("; fp32 bound %.1f tokens/s", fma / (flops / L));
      if (dot > 0) std::printf(", BF16 bound %.1f tokens/s", dot / (flops / L));
      std::printf("; reached %.1f%% of the %s bound", 100.0 * flops / median / bound, dot_bound ? "BF16" : "fp32");
    }
    std::printf("\n");
    // The forward's own part timers, summed over the runs (layers in row 0,
    // the head in row 3).
    const double total = std::accumulate(seconds.begin(), seconds.end(), 0.0);
    const auto part = [&](int row, me::ProfilePart p) { return profile.seconds[row][static_cast<int>(p)]; };
    const struct {
      const char* name;
      double s, flops;
    } parts[] = {
        {"projections", part(0, me::ProfilePart::kProjections), profile.flops[0][0]},
        {"attention", part(0, me::ProfilePart::kAttention), profile.flops[0][2]},
        {"experts", part(0, me::ProfilePart::kExperts), profile.flops[0][1]},
        {"glue", part(0, me::ProfilePart::kGlue), 0},
        {"head", part(me::kProfileModelRow, me::ProfilePart::kProjections), profile.flops[me::kProfileModelRow][0]},
    };
    std::printf("by part, ms per token (share; GFLOP/s):");
    for (const auto& pt : parts) {
      std::printf(" %s %.2f (%.0f%%", pt.name, 1e3 * pt.s / (static_cast<double>(L) * a.repeat), 100.0 * pt.s / total);
      if (pt.flops > 0 && pt.s > 0) std::printf("; %.1f", pt.flops / pt.s / 1e9);
      std::printf(")");
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace moeserve::bench
