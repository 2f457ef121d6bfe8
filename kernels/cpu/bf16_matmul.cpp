#include "moeserve/kernels/bf16_matmul.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moeserve::kernels {

namespace {

inline float Bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float DotBf16Scalar(const uint16_t* w, const float* x, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += Bf16(w[i]) * x[i];
  return s;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 Widen(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Four independent accumulators keep enough loads in flight for a
// memory-bound row; BF16 widens with a zero-extend and a 16-bit shift.
__attribute__((target("avx2,fma"))) float DotBf16Avx2(const uint16_t* w, const float* x, size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));
    __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16));
    acc0 = _mm256_fmadd_ps(Widen(_mm256_castsi256_si128(r0)), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(Widen(_mm256_extracti128_si256(r0, 1)), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(Widen(_mm256_castsi256_si128(r1)), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(Widen(_mm256_extracti128_si256(r1, 1)), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i))), _mm256_loadu_ps(x + i), acc0);
  acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_shuffle_ps(r, r, 1));
  float s = _mm_cvtss_f32(r);
  for (; i < n; ++i) s += Bf16(w[i]) * x[i];
  return s;
}
#endif

using DotFn = float (*)(const uint16_t*, const float*, size_t);

DotFn BestDot() {
#if defined(__x86_64__)
  if (ActiveCpuIsa() != CpuIsa::kScalar) return DotBf16Avx2;
#endif
  return DotBf16Scalar;
}

}  // namespace

void MatMulBf16Ref(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  std::vector<float> row(in);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) row[i] = Bf16(W[o * in + i]);
    for (size_t t = 0; t < n; ++t) {
      float acc = 0.0f;
      for (size_t i = 0; i < in; ++i) acc += row[i] * X[t * in + i];
      Y[t * out + o] = acc;
    }
  }
}

void MatMulBf16(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  if (n >= 8) {
    // Arithmetic-bound: widen once (cost of one read of W) and use the fp32 GEMM.
    thread_local std::vector<float> wide;
    wide.resize(out * in);
    float* dst = wide.data();  // workers must not name the thread_local: theirs is another vector
    DefaultThreadPool().ParallelFor((out + 255) / 256, [&](size_t c) {
      const size_t b = c * 256, e = std::min(out, b + 256);
      for (size_t i = b * in; i < e * in; ++i) dst[i] = Bf16(W[i]);
    });
    MatMulF32(wide.data(), out, in, X, n, Y);
    return;
  }
  // Memory-bound: read each BF16 row once for all n activations.
  static const DotFn dot = BestDot();
  const size_t chunk = 64;
  DefaultThreadPool().ParallelFor((out + chunk - 1) / chunk, [&](size_t c) {
    const size_t b = c * chunk, e = std::min(out, b + chunk);
    for (size_t o = b; o < e; ++o)
      for (size_t t = 0; t < n; ++t) Y[t * out + o] = dot(W + o * in, X + t * in, in);
  });
}

}  // namespace moeserve::kernels
