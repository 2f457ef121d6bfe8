#include "moeserve/kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moeserve::kernels {

namespace {

float DotScalar(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void AxpyScalar(float alpha, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  float s = _mm_cvtss_f32(lo);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) void AxpyAvx2(float alpha, const float* x, float* y, int n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}
#endif

using DotFn = float (*)(const float*, const float*, int);
using AxpyFn = void (*)(float, const float*, float*, int);

struct Vec {
  DotFn dot;
  AxpyFn axpy;
};

const Vec& FastVec() {
  static const Vec v = [] {
#if defined(__x86_64__)
    if (ActiveCpuIsa() != CpuIsa::kScalar) return Vec{DotAvx2, AxpyAvx2};
#endif
    return Vec{DotScalar, AxpyScalar};
  }();
  return v;
}

inline int KeyAt(const int* keys, int i) { return keys ? keys[i] : i; }

}  // namespace

void MlaDecodeRef(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                  size_t offset, const int* keys, int n_keys, float* lat) {
  std::vector<float> p(static_cast<size_t>(n_keys));
  for (int h = 0; h < sh.heads; ++h) {
    const float* qa = q_abs + static_cast<size_t>(h) * sh.kv_lora;
    const float* qp = q_pe + static_cast<size_t>(h) * sh.rope;
    float mx = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n_keys; ++i) {
      const float* row = rows[KeyAt(keys, i)] + offset;
      p[i] = sh.scale * (DotScalar(qa, row, sh.kv_lora) + DotScalar(qp, row + sh.kv_lora, sh.rope));
      mx = std::max(mx, p[i]);
    }
    float sum = 0.0f;
    for (int i = 0; i < n_keys; ++i) sum += p[i] = std::exp(p[i] - mx);
    float* out = lat + static_cast<size_t>(h) * sh.kv_lora;
    std::fill(out, out + sh.kv_lora, 0.0f);
    for (int i = 0; i < n_keys; ++i) AxpyScalar(p[i] / sum, rows[KeyAt(keys, i)] + offset, out, sh.kv_lora);
  }
}

void MlaDecode(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows, size_t offset,
               const int* keys, int n_keys, float* lat) {
  const Vec& v = FastVec();
  const int H = sh.heads, L = sh.kv_lora;
  ThreadPool& pool = DefaultThreadPool();
  // Keys split in chunks; every chunk reads each of its rows once for all heads.
  const int chunk = std::max(64, (n_keys + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n_keys + chunk - 1) / chunk;
  std::vector<float> scores(static_cast<size_t>(n_keys) * H);  // [key, head]
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n_keys, b + chunk);
    for (int i = b; i < e; ++i) {
      const float* row = rows[KeyAt(keys, i)] + offset;
      float* s = &scores[static_cast<size_t>(i) * H];
      for (int h = 0; h < H; ++h)
        s[h] = sh.scale * (v.dot(q_abs + static_cast<size_t>(h) * L, row, L) + v.dot(q_pe + static_cast<size_t>(h) * sh.rope, row + L, sh.rope));
    }
  });
  // Softmax per head (over keys).
  std::vector<float> mx(static_cast<size_t>(H), -std::numeric_limits<float>::infinity()), sum(static_cast<size_t>(H), 0.0f);
  for (int i = 0; i < n_keys; ++i)
    for (int h = 0; h < H; ++h) mx[h] = std::max(mx[h], scores[static_cast<size_t>(i) * H + h]);
  for (int i = 0; i < n_keys; ++i)
    for (int h = 0; h < H; ++h) {
      float& s = scores[static_cast<size_t>(i) * H + h];
      s = std::exp(s - mx[h]);
      sum[h] += s;
    }
  // Weighted sums of c, one partial [H, L] per chunk, then reduced.
  std::vector<float> partial(static_cast<size_t>(chunks) * H * L, 0.0f);
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n_keys, b + chunk);
    float* acc = &partial[c * static_cast<size_t>(H) * L];
    for (int i = b; i < e; ++i) {
      const float* row = rows[KeyAt(keys, i)] + offset;
      const float* s = &scores[static_cast<size_t>(i) * H];
      for (int h = 0; h < H; ++h) v.axpy(s[h] / sum[h], row, acc + static_cast<size_t>(h) * L, L);
    }
  });
  std::fill(lat, lat + static_cast<size_t>(H) * L, 0.0f);
  for (int c = 0; c < chunks; ++c) v.axpy(1.0f, &partial[static_cast<size_t>(c) * H * L], lat, H * L);
}

void IndexerScoresRef(const float* iq, const float* w, int heads, int dim, const float* const* rows, size_t offset, int n,
                      float* scores) {
  for (int s = 0; s < n; ++s) {
    const float* ik = rows[s] + offset;
    float I = 0.0f;
    for (int j = 0; j < heads; ++j) I += w[j] * std::max(0.0f, DotScalar(iq + static_cast<size_t>(j) * dim, ik, dim));
    scores[s] = I;
  }
}

void IndexerScores(const float* iq, const float* w, int heads, int dim, const float* const* rows, size_t offset, int n,
                   float* scores) {
  const Vec& v = FastVec();
  ThreadPool& pool = DefaultThreadPool();
  const int chunk = std::max(256, (n + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n + chunk - 1) / chunk;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n, b + chunk);
    for (int s = b; s < e; ++s) {
      const float* ik = rows[s] + offset;
      float I = 0.0f;
      for (int j = 0; j < heads; ++j) I += w[j] * std::max(0.0f, v.dot(iq + static_cast<size_t>(j) * dim, ik, dim));
      scores[s] = I;
    }
  });
}

void TopKIndices(const float* scores, int n, int k, int* out) {
  std::vector<int> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int a, int b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a < b; };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace moeserve::kernels
