// Long-context decode at the flagship's attention shapes (128 MLA heads,
// kv_lora 512, rope 64; indexer 64 heads of 128; DeltaNet heads of 128x128):
// the context-dependent part of one decode step of a dense MLA layer, a DSA
// layer (indexer scores over every cached key, top-2048, attention over the
// 2048) and a DeltaNet layer, at 4K ... 1M cached tokens. The cache is filled
// synthetically (random rows in a paged pool visited out of order), not by a
// prefill. Dense MLA is measured up to --dense-max (one step at 1M reads
// 2.4 GB of latents per head tile) and modelled beyond as linear in the
// context from the longest measured length (its step is one pass over the
// cached rows). Printed, with the targets they are stated against:
//   DSA / dense MLA at 64K  <= 0.2;  at 1M <= 0.02
//   DeltaNet at the longest / at 4K within 10% (its state does not grow)
//   DSA and DeltaNet at 1M / at 4K <= 3
// and the DSA step split into indexer scores, top-k and attention.
// The same DSA step with the indexer's int8 scores (indexer_int8.hpp,
// ModelOptions::indexer_scores kInt8: the query quantised per head, the keys
// quantised once, as the cache write does) is timed beside it: its indexer
// and step, and its DSA / dense ratio, against the same targets. Its keys
// are held as the engine's pool holds them: 16 tokens' keys together,
// transposed (indexer_int8.hpp's blocks), the blocks in shuffled order; the
// fp32 keys as the pool holds those, each block's 16 after its latents. Its rate in multiply-adds per
// second is printed beside a ceiling measured in the same run: a tight
// vpdpbusd loop on one thread, times the threads.
//
//   bench_long_context [--reps N] [--max-context 1048576] [--dense-max 262144] [--exact-only]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/delta_rule.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/kernels/weight_memory.hpp"

using namespace moeserve::kernels;

namespace {

constexpr int kHeads = 128, kKvLora = 512, kRope = 64;
constexpr int kIndexHeads = 64, kIndexDim = 128, kTopK = 2048;
constexpr int kDeltaHeads = 64, kDk = 128, kDv = 128;
// A token's floats in the paged cache: c | k_pe, and the fp32 indexer key.
constexpr int kRowFloats = kKvLora + kRope + kIndexDim;
constexpr int kBlockTokens = 16;  // the engine's block
// The int8 keys' blocks (the engine pool's 16 tokens).
constexpr int kKeyBlockTokens = 16;

// The compute ceiling the int8 indexer is held against: one thread's tight
// loop of 16 independent vpdpbusd (64 multiply-adds each, the query's four
// codes as the broadcast memory operand, as the kernel issues them), in
// multiply-adds per second. Called only where the CPU has AVX-512 VNNI.
// GCC 12's AVX-512 headers warn of an uninitialised temporary in the set1
// intrinsics (spurious; the kernels' files turn it off the same way).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512vnni"), noinline)) double VnniLoopMacsPerSecond() {
  alignas(64) static const int32_t q[16] = {0x01020304};
  __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
          a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const __m512i k = _mm512_set1_epi32(0x01010101);
  constexpr long kIters = 4000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i) {
#define MOESERVE_DP(a) asm volatile("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a) : "v"(k), "m"(q[0]));
    MOESERVE_DP(a0) MOESERVE_DP(a1) MOESERVE_DP(a2) MOESERVE_DP(a3) MOESERVE_DP(a4) MOESERVE_DP(a5) MOESERVE_DP(a6)
    MOESERVE_DP(a7) MOESERVE_DP(a8) MOESERVE_DP(a9) MOESERVE_DP(a10) MOESERVE_DP(a11) MOESERVE_DP(a12) MOESERVE_DP(a13)
    MOESERVE_DP(a14) MOESERVE_DP(a15)
#undef MOESERVE_DP
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile int sink = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a15), a7));
  (void)sink;
  return kIters * 16 * 64.0 / s;
}
#pragma GCC diagnostic pop

template <class F>
double BestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, max_context = 1 << 20, dense_max = 1 << 18;
  bool int8 = true;
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--exact-only")) {
      int8 = false;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: bench_long_context [--reps N] [--max-context N] [--dense-max N] [--exact-only]\n");
      return 2;
    }
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--max-context")) max_context = std::max(4096, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--dense-max")) dense_max = std::max(4096, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: bench_long_context [--reps N] [--max-context N] [--dense-max N] [--exact-only]\n");
      return 2;
    }
  }
  const KernelSet& k = Kernels(BestIsa());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // A paged pool of max_context rows in blocks visited out of order.
  const int nblocks = (max_context + kBlockTokens - 1) / kBlockTokens;
  // A cheap generator for the pool (2.9 GB at 1M rows: normal draws took
  // most of a minute): uniform in [-0.17, 0.17], about the 0.1 deviation
  // of the draws it replaced.
  // Mapped as the engine's KvPool maps its pool (AllocateZeroedPages: huge
  // pages advised), so that the keys' reads see the engine's TLB reach.
  const size_t pool_floats = static_cast<size_t>(nblocks) * kBlockTokens * kRowFloats;
  float* pool_data = static_cast<float*>(AllocateZeroedPages(pool_floats * sizeof(float)));
  if (pool_data == nullptr) {
    std::fprintf(stderr, "bench_long_context: could not map %zu bytes for the cache\n", pool_floats * sizeof(float));
    return 1;
  }
  std::span<float> pool(pool_data, pool_floats);
  uint64_t x64 = 0x9e3779b97f4a7c15ull;
  for (auto& x : pool) {
    x64 ^= x64 << 13, x64 ^= x64 >> 7, x64 ^= x64 << 17;
    x = (static_cast<float>(x64 >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.35f;
  }
  std::vector<int> order(static_cast<size_t>(nblocks));
  for (int b = 0; b < nblocks; ++b) order[b] = b;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<const float*> rows(static_cast<size_t>(max_context));
  // Each block keeps its tokens' latents together, then their fp32 indexer
  // keys (as the engine's pool keeps a DSA layer's parts: KvPool::PartRow).
  std::vector<const float*> key_rows(static_cast<size_t>(max_context));
  for (int s = 0; s < max_context; ++s) {
    const float* block = &pool[static_cast<size_t>(order[s / kBlockTokens]) * kBlockTokens * kRowFloats];
    rows[s] = block + static_cast<size_t>(s % kBlockTokens) * (kKvLora + kRope);
    key_rows[s] = block + static_cast<size_t>(kBlockTokens) * (kKvLora + kRope) + static_cast<size_t>(s % kBlockTokens) * kIndexDim;
  }
  // The int8 keys: each row's fp32 key quantised once, as a cache write
  // does, into 16-key blocks visited out of order.
  const int key_blocks = (max_context + kKeyBlockTokens - 1) / kKeyBlockTokens;
  const size_t key_block_floats = IndexerInt8KeyFloats(kIndexDim) * kKeyBlockTokens;
  const size_t key_pool_bytes = int8 ? static_cast<size_t>(key_blocks) * key_block_floats * sizeof(float) : 0;
  float* key_pool = int8 ? static_cast<float*>(AllocateZeroedPages(key_pool_bytes)) : nullptr;
  if (int8 && key_pool == nullptr) {
    std::fprintf(stderr, "bench_long_context: could not map %zu bytes for the int8 keys\n", key_pool_bytes);
    return 1;
  }
  std::vector<const float*> int8_blocks(int8 ? static_cast<size_t>(key_blocks) : 0);
  if (int8) {
    std::vector<int> key_order(static_cast<size_t>(key_blocks));
    for (int b = 0; b < key_blocks; ++b) key_order[b] = b;
    std::shuffle(key_order.begin(), key_order.end(), rng);
    for (int b = 0; b < key_blocks; ++b) int8_blocks[b] = key_pool + static_cast<size_t>(key_order[b]) * key_block_floats;
    for (int s = 0; s < max_context; ++s)
      StoreIndexerKeyInt8Blocked(key_rows[s], kIndexDim, const_cast<float*>(int8_blocks[s / kKeyBlockTokens]),
                                 kKeyBlockTokens, s % kKeyBlockTokens);
  }

  std::vector<float> q_abs(static_cast<size_t>(kHeads) * kKvLora), q_pe(static_cast<size_t>(kHeads) * kRope),
      lat(q_abs.size()), iq(static_cast<size_t>(kIndexHeads) * kIndexDim), iw(kIndexHeads), scores(static_cast<size_t>(max_context));
  for (auto* v : {&q_abs, &q_pe, &iq, &iw})
    for (auto& x : *v) x = nd(rng) * 0.05f;
  std::vector<int> keys(kTopK);
  // The query's int8 form (per step: quantised with the scores).
  std::vector<int8_t> iq8(iq.size());
  std::vector<float> iwt(kIndexHeads);
  std::vector<int32_t> ioff(kIndexHeads);
  const auto int8_scores = [&](int n) {
    QuantizeIndexerQueryInt8(iq.data(), iw.data(), kIndexHeads, kIndexDim, iq8.data(), iwt.data(), ioff.data());
    k.indexer_scores_int8_blocked(IndexerInt8Query{iq8.data(), iwt.data(), ioff.data()}, 1, kIndexHeads, kIndexDim,
                                  int8_blocks.data(), kKeyBlockTokens, &n, scores.data(), static_cast<size_t>(n));
  };
  const MlaDecodeShape shape{kHeads, kKvLora, kRope, 0.1f};

  // DeltaNet: one token through every head (state [dk, dv] per head).
  std::vector<float> S(static_cast<size_t>(kDeltaHeads) * kDk * kDv, 0.01f), dq(static_cast<size_t>(kDeltaHeads) * kDk),
      dkv(dq.size()), dvv(static_cast<size_t>(kDeltaHeads) * kDv), dout(dvv.size()), beta(kDeltaHeads, 0.5f), g(kDeltaHeads, -0.1f);
  for (auto* v : {&dq, &dkv, &dvv})
    for (auto& x : *v) x = nd(rng) * 0.1f;
  auto delta_step = [&] {
    DefaultThreadPool().ParallelFor(kDeltaHeads, [&](size_t h) {
      k.delta_rule_recurrent(&dq[h * kDk], &dkv[h * kDk], &dvv[h * kDv], &beta[h], &g[h], 1, kDk, kDv, 0, 0,
                             &S[h * kDk * kDv], &dout[h * kDv], 0);
    });
  };

  std::printf("threads %d; flagship attention shapes: MLA %d heads, kv_lora %d, rope %d; indexer %dx%d, top-%d; DeltaNet %d heads %dx%d\n",
              DefaultThreadPool().size(), kHeads, kKvLora, kRope, kIndexHeads, kIndexDim, kTopK, kDeltaHeads, kDk, kDv);
  std::printf("%8s %14s %12s %12s %10s %10s %12s %10s\n", "context", "dense MLA ms", "DSA ms", "(indexer", "top-k",
              "attend)", "DeltaNet ms", "DSA/dense");
  std::vector<int> contexts;
  for (int n : {4096, 16384, 65536, 131072, 262144, 524288, 1048576})
    if (n <= max_context) contexts.push_back(n);
  const size_t nc = contexts.size();
  std::vector<double> dense(nc), dsa(nc), index_s(nc), topk_s(nc), attend_s(nc), delta(nc, 1e30), dsa8(nc), index8(nc);
  std::vector<bool> modelled(nc, false);
  for (size_t c = 0; c < nc; ++c) {
    const int n = contexts[c];
    // Past 64K a step is tens of ms to seconds: fewer repetitions.
    const int r = n > 65536 ? std::max(1, std::min(reps, 2)) : reps;
    if (n <= dense_max) {
      dense[c] = BestSeconds(r, [&] { k.mla_decode(shape, q_abs.data(), q_pe.data(), rows.data(), 0, nullptr, n, lat.data()); });
    } else {
      modelled[c] = true;  // linear in the context from the longest measured length
      size_t m = c;
      while (modelled[m]) --m;
      dense[c] = dense[m] * static_cast<double>(n) / contexts[m];
    }
    const int top = std::min(kTopK, n);
    index_s[c] = BestSeconds(r, [&] {
      k.indexer_scores(iq.data(), iw.data(), kIndexHeads, kIndexDim, key_rows.data(), 0, n, scores.data());
    });
    topk_s[c] = BestSeconds(r, [&] { TopKIndices(scores.data(), n, top, keys.data()); });
    attend_s[c] = BestSeconds(r, [&] {
      k.mla_decode(shape, q_abs.data(), q_pe.data(), rows.data(), 0, keys.data(), top, lat.data());
    });
    dsa[c] = BestSeconds(r, [&] {
      k.indexer_scores(iq.data(), iw.data(), kIndexHeads, kIndexDim, key_rows.data(), 0, n, scores.data());
      TopKIndices(scores.data(), n, top, keys.data());
      k.mla_decode(shape, q_abs.data(), q_pe.data(), rows.data(), 0, keys.data(), top, lat.data());
    });
    if (int8) {
      index8[c] = BestSeconds(r, [&] { int8_scores(n); });
      dsa8[c] = BestSeconds(r, [&] {
        int8_scores(n);
        TopKIndices(scores.data(), n, top, keys.data());
        k.mla_decode(shape, q_abs.data(), q_pe.data(), rows.data(), 0, keys.data(), top, lat.data());
      });
    }
  }
  // The DeltaNet step (~0.3 ms) is timed round-robin across the context
  // lengths, many rounds, best of each: on a shared machine a slow spell then
  // hits every length alike instead of whichever ran during it.
  for (int round = 0; round < reps * 200; ++round)
    for (size_t c = 0; c < nc; ++c) delta[c] = std::min(delta[c], BestSeconds(1, delta_step));
  for (size_t c = 0; c < nc; ++c)
    std::printf("%8d %13.3f%s %12.3f %12.3f %10.3f %10.3f %12.4f %10.4f\n", contexts[c], dense[c] * 1e3,
                modelled[c] ? "m" : " ", dsa[c] * 1e3, index_s[c] * 1e3, topk_s[c] * 1e3, attend_s[c] * 1e3,
                delta[c] * 1e3, dsa[c] / dense[c]);
  if (int8) {
    std::printf("\nint8 indexer scores (%s, keys by 16-token blocks):\n%8s %12s %14s %12s %14s %12s %12s\n", k.indexer_scores_int8_blocked.name,
                "context", "DSA ms", "(indexer ms", "fp32 ms)", "DSA/dense", "x fp32 DSA", "G MAC/s");
    for (size_t c = 0; c < nc; ++c)
      std::printf("%8d %12.3f %14.3f %12.3f %14.4f %12.2f %12.1f\n", contexts[c], dsa8[c] * 1e3, index8[c] * 1e3,
                  index_s[c] * 1e3, dsa8[c] / dense[c], dsa[c] / dsa8[c],
                  static_cast<double>(contexts[c]) * kIndexHeads * kIndexDim / index8[c] / 1e9);
    // The ceiling, best of a few runs of the loop, one thread, times the
    // pool's threads (run on every thread at once it measures the load
    // beside the bench more than the core).
    if (__builtin_cpu_supports("avx512vnni")) {
      double one = 0;
      for (int r = 0; r < 5; ++r) one = std::max(one, VnniLoopMacsPerSecond());
      std::printf("vpdpbusd ceiling: %.1f G MAC/s one thread x %d threads = %.1f G MAC/s\n", one / 1e9,
                  DefaultThreadPool().size(), one * DefaultThreadPool().size() / 1e9);
    }
  }
  if (std::find(modelled.begin(), modelled.end(), true) != modelled.end())
    std::printf("m: dense MLA modelled (linear in the context from the longest measured length)\n");
  const auto at = [&](int n) {
    for (size_t c = 0; c < nc; ++c)
      if (contexts[c] == n) return static_cast<int>(c);
    return -1;
  };
  const int c64 = at(65536), c1m = at(1048576);
  if (c64 >= 0)
    std::printf("DSA / dense MLA at 64K: %.4f (limit 0.2) %s\n", dsa[c64] / dense[c64],
                dsa[c64] / dense[c64] <= 0.2 ? "ok" : "OVER");
  if (c1m >= 0) {
    std::printf("DSA / dense MLA at 1M: %.4f%s (limit 0.02) %s\n", dsa[c1m] / dense[c1m],
                modelled[c1m] ? " (dense modelled)" : "", dsa[c1m] / dense[c1m] <= 0.02 ? "ok" : "OVER");
    std::printf("DSA at 1M / at 4K: %.2f (limit 3) %s; indexer + top-k are %.0f%% of the step at 1M\n",
                dsa[c1m] / dsa[0], dsa[c1m] / dsa[0] <= 3 ? "ok" : "OVER",
                100.0 * (index_s[c1m] + topk_s[c1m]) / dsa[c1m]);
    std::printf("DeltaNet at 1M / at 4K: %.3f (limit 3) %s\n", delta[c1m] / delta[0], delta[c1m] / delta[0] <= 3 ? "ok" : "OVER");
    if (int8) {
      std::printf("int8 indexer: DSA / dense MLA at 1M: %.4f%s (limit 0.02) %s\n", dsa8[c1m] / dense[c1m],
                  modelled[c1m] ? " (dense modelled)" : "", dsa8[c1m] / dense[c1m] <= 0.02 ? "ok" : "OVER");
      std::printf("int8 indexer: DSA at 1M / at 4K: %.2f (limit 3) %s; indexer %.1fx the fp32 one's speed at 1M\n",
                  dsa8[c1m] / dsa8[0], dsa8[c1m] / dsa8[0] <= 3 ? "ok" : "OVER", index_s[c1m] / index8[c1m]);
    }
  }
  const double delta_last = delta.back(), delta_4k = delta.front();
  std::printf("DeltaNet at the longest context / at 4K: %.3f (limit 1.10) %s\n", delta_last / delta_4k,
              delta_last / delta_4k <= 1.1 ? "ok" : "OVER");
  FreeZeroedPages(pool_data, pool_floats * sizeof(float));
  if (key_pool) FreeZeroedPages(key_pool, key_pool_bytes);
  return 0;
}
