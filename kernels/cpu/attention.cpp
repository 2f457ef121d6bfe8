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

using DotFnPtr = float (*)(const float*, const float*, int);

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

__attribute__((target("avx512f"))) inline __mmask16 TailMask16(int left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// Dot products of one row x[0..n) with up to 8 query rows q + h * n at once:
// each 16-float piece of x is loaded once for all of them.
__attribute__((target("avx512f"))) void Dots8Avx512(const float* q, int heads, const float* x, int n, float* out) {
  __m512 acc[8];
#pragma GCC unroll 8
  for (int h = 0; h < 8; ++h) acc[h] = _mm512_setzero_ps();
  int i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h)
      if (h < heads) acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + static_cast<size_t>(h) * n + i), xv, acc[h]);
  }
  for (int h = 0; h < heads; ++h) out[h] = _mm512_reduce_add_ps(acc[h]);
}

// acc[h * n + j] += p[h] * x[j] for h < heads: x read once per 16 floats.
__attribute__((target("avx512f"))) void Axpys8Avx512(const float* p, int heads, const float* x, int n, float* acc) {
  int i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h)
      if (h < heads) {
        float* a = acc + static_cast<size_t>(h) * n + i;
        _mm512_mask_storeu_ps(a, m, _mm512_fmadd_ps(_mm512_set1_ps(p[h]), xv, _mm512_maskz_loadu_ps(m, a)));
      }
  }
}
#endif

// Up to 8 heads at a time, for ISAs without a fused version.
void Dots8Generic(DotFnPtr dot, const float* q, int heads, const float* x, int n, float* out) {
  for (int h = 0; h < heads; ++h) out[h] = dot(q + static_cast<size_t>(h) * n, x, n);
}

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
               const int* keys, int n_keys, float* lat, CpuIsa isa) {
  if (!CpuSupports(isa)) isa = CpuIsa::kScalar;
  const int H = sh.heads, L = sh.kv_lora, R = sh.rope;
  const Vec v = [&] {
#if defined(__x86_64__)
    if (isa != CpuIsa::kScalar) return Vec{DotAvx2, AxpyAvx2};
#endif
    return Vec{DotScalar, AxpyScalar};
  }();
  // Scores of one key row for every head, 8 heads per pass over the row.
  auto head_scores = [&](const float* row, float* s) {
    float pe[8];
    for (int h0 = 0; h0 < H; h0 += 8) {
      const int hn = std::min(8, H - h0);
#if defined(__x86_64__)
      if (isa == CpuIsa::kAvx512) {
        Dots8Avx512(q_abs + static_cast<size_t>(h0) * L, hn, row, L, s + h0);
        Dots8Avx512(q_pe + static_cast<size_t>(h0) * R, hn, row + L, R, pe);
      } else
#endif
      {
        Dots8Generic(v.dot, q_abs + static_cast<size_t>(h0) * L, hn, row, L, s + h0);
        Dots8Generic(v.dot, q_pe + static_cast<size_t>(h0) * R, hn, row + L, R, pe);
      }
      for (int h = 0; h < hn; ++h) s[h0 + h] = sh.scale * (s[h0 + h] + pe[h]);
    }
  };
  auto accumulate = [&](const float* p, const float* row, float* acc) {
    for (int h0 = 0; h0 < H; h0 += 8) {
      const int hn = std::min(8, H - h0);
#if defined(__x86_64__)
      if (isa == CpuIsa::kAvx512) {
        Axpys8Avx512(p + h0, hn, row, L, acc + static_cast<size_t>(h0) * L);
        continue;
      }
#endif
      for (int h = h0; h < h0 + hn; ++h) v.axpy(p[h], row, acc + static_cast<size_t>(h) * L, L);
    }
  };
  ThreadPool& pool = DefaultThreadPool();
  // Keys in chunks; every chunk reads each of its rows once for all heads,
  // twice in all: scores and each chunk's maxima first, then (after the
  // global maxima) exponentials, their sums and the weighted latent sums.
  const int chunk = std::max(64, (n_keys + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n_keys + chunk - 1) / chunk;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(static_cast<size_t>(n_keys) * H);  // [key, head]
  std::vector<float> chunk_max(static_cast<size_t>(chunks) * H, neg_inf), chunk_sum(chunk_max.size(), 0.0f);
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n_keys, b + chunk);
    float* mx = &chunk_max[c * static_cast<size_t>(H)];
    for (int i = b; i < e; ++i) {
      float* s = &scores[static_cast<size_t>(i) * H];
      head_scores(rows[KeyAt(keys, i)] + offset, s);
      for (int h = 0; h < H; ++h) mx[h] = std::max(mx[h], s[h]);
    }
  });
  std::vector<float> mx(static_cast<size_t>(H), neg_inf);
  for (int c = 0; c < chunks; ++c)
    for (int h = 0; h < H; ++h) mx[h] = std::max(mx[h], chunk_max[static_cast<size_t>(c) * H + h]);
  std::vector<float> partial(static_cast<size_t>(chunks) * H * L, 0.0f);
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n_keys, b + chunk);
    float* acc = &partial[c * static_cast<size_t>(H) * L];
    float* sum = &chunk_sum[c * static_cast<size_t>(H)];
    for (int i = b; i < e; ++i) {
      float* s = &scores[static_cast<size_t>(i) * H];
      for (int h = 0; h < H; ++h) sum[h] += s[h] = std::exp(s[h] - mx[h]);
      accumulate(s, rows[KeyAt(keys, i)] + offset, acc);
    }
  });
  std::vector<float> inv(static_cast<size_t>(H), 0.0f);
  for (int h = 0; h < H; ++h) {
    float total = 0.0f;
    for (int c = 0; c < chunks; ++c) total += chunk_sum[static_cast<size_t>(c) * H + h];
    inv[h] = 1.0f / total;
  }
  std::fill(lat, lat + static_cast<size_t>(H) * L, 0.0f);
  for (int c = 0; c < chunks; ++c) v.axpy(1.0f, &partial[static_cast<size_t>(c) * H * L], lat, H * L);
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < L; ++j) lat[static_cast<size_t>(h) * L + j] *= inv[h];
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
  const bool avx512 = ActiveCpuIsa() == CpuIsa::kAvx512;  // 8 heads per pass over a key
  ThreadPool& pool = DefaultThreadPool();
  const int chunk = std::max(256, (n + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n + chunk - 1) / chunk;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n, b + chunk);
    float d[8];
    for (int s = b; s < e; ++s) {
      const float* ik = rows[s] + offset;
      float I = 0.0f;
      for (int h0 = 0; h0 < heads; h0 += 8) {
        const int hn = std::min(8, heads - h0);
#if defined(__x86_64__)
        if (avx512) Dots8Avx512(iq + static_cast<size_t>(h0) * dim, hn, ik, dim, d);
        else
#endif
          Dots8Generic(v.dot, iq + static_cast<size_t>(h0) * dim, hn, ik, dim, d);
        for (int j = 0; j < hn; ++j) I += w[h0 + j] * std::max(0.0f, d[j]);
      }
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
