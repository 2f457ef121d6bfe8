// This machine's compute ceilings, measured: independent FMA (or BF16 dot
// product) chains in registers on every thread of the kernel pool at once.
// Shared by bench_roofline and bench_prefill, so every bench compares with
// the same measurement.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "moeserve/kernels/x86_intrinsics.hpp"

namespace moeserve::bench {

// FMA chains: 12 independent accumulators, 2 * width * 12 FLOP per iteration.
__attribute__((target("avx512f,fma"))) inline float FmaAvx512(size_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) inline float FmaAvx2(size_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float t[8];
  _mm256_storeu_ps(t, s);
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

// vdpbf16ps chains: each instruction is 16 lanes x 2 products = 64 FLOP.
__attribute__((target("avx512f,avx512bf16"))) inline float Bf16DotAvx512(size_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);  // 1, ~6e-8
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

inline bool CpuHasAvx512Bf16() { return __builtin_cpu_supports("avx512bf16"); }

// Runs fn(thread_index) on `threads` threads started together; returns seconds.
template <class Fn>
double OnAllCores(int threads, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      ready++;
      while (!go.load()) {
      }
      fn(t);
    });
  while (ready.load() < threads) {
  }
  const auto start = std::chrono::steady_clock::now();
  go = true;
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline volatile float g_peak_sink;

// FLOP/s, the best of 3 passes.
inline double FmaPeak(int threads, bool avx512) {
  const size_t iters = 50'000'000;
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const double s = OnAllCores(threads, [&](int) { g_peak_sink = avx512 ? FmaAvx512(iters) : FmaAvx2(iters); });
    best = std::max(best, 2.0 * (avx512 ? 16 : 8) * 12.0 * static_cast<double>(iters) * threads / s);
  }
  return best;
}

// FLOP/s of vdpbf16ps (0 without avx512_bf16), the best of 3 passes.
inline double Bf16DotPeak(int threads) {
  if (!CpuHasAvx512Bf16()) return 0.0;
  const size_t iters = 50'000'000;
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const double s = OnAllCores(threads, [&](int) { g_peak_sink = Bf16DotAvx512(iters); });
    best = std::max(best, 64.0 * 12.0 * static_cast<double>(iters) * threads / s);
  }
  return best;
}

}  // namespace moeserve::bench
