#include "moeserve/kernels/read_bandwidth.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <new>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

#include "moeserve/kernels/x86_intrinsics.hpp"

namespace moeserve::kernels {
namespace {

// Four streams per thread, as a 4-row matrix-vector product reads; with
// `prefetch`, each also prefetches 4 KiB ahead, as the MXFP4 kernels do
// (which reads faster on some machines: the ceiling is the better of the two).
float SumScalar(const float* p, size_t n, bool) {
  float a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a + b + c + d;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float SumAvx512(const float* p, size_t n, bool prefetch) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const size_t q = n / 4 / 16 * 16;
  const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
  for (size_t i = 0; i < q; i += 16) {
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p0 + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p1 + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p2 + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p3 + i + 1024), _MM_HINT_T0);
    }
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p0 + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p1 + i));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p2 + i));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p3 + i));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t n, bool prefetch) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const size_t q = n / 4 / 8 * 8;
  const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
  for (size_t i = 0; i < q; i += 8) {
    if (prefetch && i % 16 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p0 + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p1 + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p2 + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p3 + i + 1024), _MM_HINT_T0);
    }
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p0 + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p1 + i));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p2 + i));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p3 + i));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

volatile float g_sink;

}  // namespace

ReadBandwidth MeasureReadBandwidth(size_t mib, double seconds, int min_passes) {
  using Clock = std::chrono::steady_clock;
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  const size_t n = std::max<size_t>(mib, 1) * (size_t{1} << 20) / sizeof(float);
  const size_t part = n / threads / 64 * 64;
  float* a = static_cast<float*>(::operator new(n * sizeof(float), std::align_val_t(64)));
  // First touch by the pool, so each part's pages are faulted in (and, on a
  // NUMA machine, placed) by a thread that will read it.
  pool.ParallelFor(threads, [&](size_t t) { std::fill(a + t * part, a + (t + 1) * part, 1.0f); });
  const CpuIsa isa = ActiveCpuIsa();
  float (*sum)(const float*, size_t, bool) = SumScalar;
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512) sum = SumAvx512;
  else if (isa == CpuIsa::kAvx2) sum = SumAvx2;
#endif
  ReadBandwidth r;
  r.array_bytes = part * threads * sizeof(float);
  double total_s = 0;
  const auto start = Clock::now();
  while (r.passes < min_passes || std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const bool prefetch = r.passes % 2 == 1;
    const auto t0 = Clock::now();
    pool.ParallelFor(threads, [&](size_t t) { g_sink = sum(a + t * part, part, prefetch); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    total_s += s;
    r.best_bytes_per_s = std::max(r.best_bytes_per_s, static_cast<double>(r.array_bytes) / s);
    ++r.passes;
  }
  r.mean_bytes_per_s = static_cast<double>(r.array_bytes) * r.passes / total_s;
  ::operator delete(a, std::align_val_t(64));
  return r;
}

}  // namespace moeserve::kernels
