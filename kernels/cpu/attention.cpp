#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/topk_binned.hpp"
#include "moeserve/kernels/topk_stream.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

#include "variants.hpp"
#include "vec_exp.hpp"

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

// Eight dot-product accumulators summed across their lanes at once: a
// transposing tree (23 shuffles and adds for all eight, where eight separate
// horizontal sums take ~56), the sums in head order in the low 8 lanes.
// (The accumulators come by value: an array passed by address would make the
// compiler store them on every iteration of the caller's loop.)
__attribute__((target("avx512f"))) inline __m256 SumLanes8(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4,
                                                          __m512 a5, __m512 a6, __m512 a7) {
  const __m512 a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  __m512 b[4], c[2];
  for (int i = 0; i < 4; ++i)  // 256-bit halves: b[i] = [a_i | a_{i+4}], 8 partials each
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 4], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 4], 0xEE));
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: c[i] = [a_i, a_{i+4}, a_{i+2}, a_{i+6}], 4 partials each
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 2], 0x88), _mm512_shuffle_f32x4(b[i], b[i + 2], 0xDD));
  // Within each 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] for x of c[0], y of c[1]; then the pairs.
  __m512 d = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  d = _mm512_add_ps(d, _mm512_permute_ps(d, _MM_SHUFFLE(1, 0, 3, 2)));
  // Lane l of 128 bits holds heads (l-th of c[0], l-th of c[1]) in its first two floats:
  // c's lane order is 0, 4, 2, 6 (c[0]) and 1, 5, 3, 7 (c[1]).
  const __m512i order = _mm512_setr_epi32(0, 1, 8, 9, 4, 5, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, d));
}

// Dot products of one row x[0..n) with HN query rows q + h * n: each 16-float
// piece of x is loaded once for all of them, the accumulators kept in registers.
template <int HN>
__attribute__((target("avx512f"))) void DotsAvx512(const float* q, const float* x, int n, float* out) {
  __m512 acc[HN];
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h) acc[h] = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + static_cast<size_t>(h) * n + i), xv, acc[h]);
  }
  if constexpr (HN == 8) {
    _mm256_storeu_ps(out, SumLanes8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
  } else {
    for (int h = 0; h < HN; ++h) out[h] = _mm512_reduce_add_ps(acc[h]);
  }
}

// HN (4 or 8) heads' dot products with two rows at once: each query piece
// loaded once for both (when many heads' queries do not fit the L1 cache,
// their loads are the bound). The sums go through one transposing tree per
// eight (four heads: both rows' in one), whose order per sum is
// _mm512_reduce_add_ps's: the same bits as DotsAvx512<HN> per row.
template <int HN>
__attribute__((target("avx512f"))) void DotsX2Avx512(const float* q, const float* x0, const float* x1, int n, float* out0,
                                                    float* out1) {
  static_assert(HN == 4 || HN == 8);
  __m512 a[HN], b[HN];
#pragma GCC unroll 8
  for (int h = 0; h < HN; ++h) a[h] = b[h] = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    const __m512 xv0 = _mm512_maskz_loadu_ps(m, x0 + i), xv1 = _mm512_maskz_loadu_ps(m, x1 + i);
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) {
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + static_cast<size_t>(h) * n + i);
      a[h] = _mm512_fmadd_ps(qv, xv0, a[h]);
      b[h] = _mm512_fmadd_ps(qv, xv1, b[h]);
    }
  }
  if constexpr (HN == 8) {
    _mm256_storeu_ps(out0, SumLanes8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
    _mm256_storeu_ps(out1, SumLanes8(b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]));
  } else {
    const __m256 sums = SumLanes8(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
    _mm_storeu_ps(out0, _mm256_castps256_ps128(sums));
    _mm_storeu_ps(out1, _mm256_extractf128_ps(sums, 1));
  }
}

__attribute__((target("avx512f"))) void DotsUpTo8Avx512(const float* q, int heads, const float* x, int n, float* out) {
  switch (heads) {
    case 8: return DotsAvx512<8>(q, x, n, out);
    case 7: return DotsAvx512<7>(q, x, n, out);
    case 6: return DotsAvx512<6>(q, x, n, out);
    case 5: return DotsAvx512<5>(q, x, n, out);
    case 4: return DotsAvx512<4>(q, x, n, out);
    case 3: return DotsAvx512<3>(q, x, n, out);
    case 2: return DotsAvx512<2>(q, x, n, out);
    default: return DotsAvx512<1>(q, x, n, out);
  }
}

// acc[h * n + j] += p[r][h] * x[r][j] for h < HN, r < NR: each piece of the
// NR rows is loaded once for all heads, and each accumulator piece is loaded
// and stored once per NR rows.
template <int HN, int NR>
__attribute__((target("avx512f"))) void AxpysAvx512(const float* const* p, const float* const* x, int n, float* acc) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    __m512 xv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) xv[r] = _mm512_maskz_loadu_ps(m, x[r] + i);
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) {
      float* a = acc + static_cast<size_t>(h) * n + i;
      __m512 av = _mm512_maskz_loadu_ps(m, a);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) av = _mm512_fmadd_ps(_mm512_set1_ps(p[r][h]), xv[r], av);
      _mm512_mask_storeu_ps(a, m, av);
    }
  }
}

// acc[h * L + j] += sum_r p[r * H + h] x[r][j] for h < HN, over all nrows
// rows: a register tile of HN heads x 32 columns runs over the rows (two
// loads and HN broadcasts per 2 HN FMAs), then moves to the next 32 columns.
// (The 4-row form above loads and stores its accumulators for every 4 rows:
// about 1.6 memory operations per FMA against 0.6 here.)
template <int HN>
__attribute__((target("avx512f"))) void AccumulateTiledAvx512(const float* p, int H, const float* const* x, int nrows,
                                                             int L, float* acc) {
  for (int j = 0; j < L; j += 32) {
    const __mmask16 m0 = TailMask16(L - j), m1 = L - j > 16 ? TailMask16(L - j - 16) : __mmask16(0);
    __m512 a0[HN], a1[HN];
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) a0[h] = a1[h] = _mm512_setzero_ps();
    for (int r = 0; r < nrows; ++r) {
      if (r + 8 < nrows) __builtin_prefetch(x[r + 8] + j, 0, 3);
      const __m512 x0 = _mm512_maskz_loadu_ps(m0, x[r] + j), x1 = _mm512_maskz_loadu_ps(m1, x[r] + j + 16);
      const float* pr = p + static_cast<size_t>(r) * H;
#pragma GCC unroll 8
      for (int h = 0; h < HN; ++h) {
        const __m512 ph = _mm512_set1_ps(pr[h]);
        a0[h] = _mm512_fmadd_ps(ph, x0, a0[h]);
        a1[h] = _mm512_fmadd_ps(ph, x1, a1[h]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) {
      float* a = acc + static_cast<size_t>(h) * L + j;
      _mm512_mask_storeu_ps(a, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, a), a0[h]));
      _mm512_mask_storeu_ps(a + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, a + 16), a1[h]));
    }
  }
}

__attribute__((target("avx512f"))) void AccumulateTiledUpTo8Avx512(const float* p, int hn, int H, const float* const* x,
                                                                  int nrows, int L, float* acc) {
  switch (hn) {
    case 8: return AccumulateTiledAvx512<8>(p, H, x, nrows, L, acc);
    case 7: return AccumulateTiledAvx512<7>(p, H, x, nrows, L, acc);
    case 6: return AccumulateTiledAvx512<6>(p, H, x, nrows, L, acc);
    case 5: return AccumulateTiledAvx512<5>(p, H, x, nrows, L, acc);
    case 4: return AccumulateTiledAvx512<4>(p, H, x, nrows, L, acc);
    case 3: return AccumulateTiledAvx512<3>(p, H, x, nrows, L, acc);
    case 2: return AccumulateTiledAvx512<2>(p, H, x, nrows, L, acc);
    default: return AccumulateTiledAvx512<1>(p, H, x, nrows, L, acc);
  }
}

template <int NR>
__attribute__((target("avx512f"))) void AxpysUpTo8Avx512(const float* const* p, int heads, const float* const* x, int n,
                                                         float* acc) {
  switch (heads) {
    case 8: return AxpysAvx512<8, NR>(p, x, n, acc);
    case 7: return AxpysAvx512<7, NR>(p, x, n, acc);
    case 6: return AxpysAvx512<6, NR>(p, x, n, acc);
    case 5: return AxpysAvx512<5, NR>(p, x, n, acc);
    case 4: return AxpysAvx512<4, NR>(p, x, n, acc);
    case 3: return AxpysAvx512<3, NR>(p, x, n, acc);
    case 2: return AxpysAvx512<2, NR>(p, x, n, acc);
    default: return AxpysAvx512<1, NR>(p, x, n, acc);
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

// The single-row dot and axpy of an Isa's variants (AVX-512 has its own
// multi-head forms above and uses AVX2's for the rest).
Vec VecFor(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) return Vec{DotAvx2, AxpyAvx2};
#endif
  (void)isa;
  return Vec{DotScalar, AxpyScalar};
}

inline int KeyAt(const int* keys, int i) { return keys ? keys[i] : i; }

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void ExpShiftedAccumulateAvx512(float* s, const float* mx, float* sum, int n) {
  for (int h = 0; h < n; h += 16) {
    const __mmask16 m = TailMask16(n - h);
    const __m512 e = simd::Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + h), _mm512_maskz_loadu_ps(m, mx + h)));
    _mm512_mask_storeu_ps(s + h, m, e);
    _mm512_mask_storeu_ps(sum + h, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, sum + h), e));
  }
}

// The same for `keys` consecutive keys' scores s[key * H + head] when whole
// keys fill a vector (16 % H == 0, few heads): the exponentials 16 lanes at a
// time over the run, then each head's sum added key by key in key order, so
// the bits are those of one ExpShiftedAccumulate per key. With 4 heads that
// is a quarter of the exponentials' vector passes, and no call per key.
__attribute__((target("avx512f"))) void ExpShiftedAccumulateKeysAvx512(float* s, int keys, int H, const float* mx,
                                                                      float* sum) {
  alignas(64) float tiled[16];
  for (int l = 0; l < 16; ++l) tiled[l] = mx[l % H];
  const __m512 mxv = _mm512_load_ps(tiled);
  const int n = keys * H;
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    _mm512_mask_storeu_ps(s + i, m, simd::Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), mxv)));
  }
  const __mmask16 hm = TailMask16(H);
  __m512 acc = _mm512_maskz_loadu_ps(hm, sum);
  for (int k = 0; k < keys; ++k) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(hm, s + static_cast<size_t>(k) * H));
  _mm512_mask_storeu_ps(sum, hm, acc);
}

// mx[h] = max(mx[h], s[key * H + h]) over `keys` consecutive keys, 16 % H ==
// 0: one vector pass over the run instead of a chain through mx per key.
// A NaN score leaves the maximum as std::max(mx, NaN) does (max_ps gives
// its second operand when either is NaN).
__attribute__((target("avx512f"))) void MaxOverKeysAvx512(const float* s, int keys, int H, float* mx) {
  __m512 acc = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const int n = keys * H;
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask16(n - i);
    acc = _mm512_mask_max_ps(acc, m, _mm512_maskz_loadu_ps(m, s + i), acc);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  for (int l = 0; l < 16; ++l) mx[l % H] = std::max(mx[l % H], lanes[l]);
}
#endif

// s[h] = e^(s[h] - mx[h]); sum[h] += s[h], for h < n (a key's softmax weights
// for every head, and the heads' running sums).
void ExpShiftedAccumulate(float* s, const float* mx, float* sum, int n, bool avx512) {
#if defined(__x86_64__)
  if (avx512) return ExpShiftedAccumulateAvx512(s, mx, sum, n);
#endif
  for (int h = 0; h < n; ++h) sum[h] += s[h] = std::exp(s[h] - mx[h]);
}

// Cached rows of one layer sit together only within a pool block of 16
// tokens (KvPool::PartRow), the blocks anywhere in the pool and a sparse
// query's keys anywhere in its context: too scattered for the hardware
// prefetchers. Without this, each row's lines arrive one demand miss at a
// time and the attention passes wait on memory latency, not bandwidth.
constexpr int kRowsAhead = 8;
inline void PrefetchFloats(const float* p, int n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int b = 0; b < n * static_cast<int>(sizeof(float)); b += 64) __builtin_prefetch(c + b, 0, 3);
}

}  // namespace

void MlaDecodeRef(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                  size_t offset, const int* keys, int n_keys, float* lat) {
  std::vector<float> p(static_cast<size_t>(n_keys));
  for (int h = 0; h < sh.heads; ++h) {
    const float* qa = q_abs + static_cast<size_t>(h) * sh.kv_lora;
    const float* qp = q_pe + static_cast<size_t>(h) * sh.rope;
    float mx = -std::numeric_limits<float>::infinity();
    const int n_visible = sh.visible ? std::min(n_keys, sh.visible[h]) : n_keys;
    for (int i = 0; i < n_visible; ++i) {
      const float* row = rows[KeyAt(keys, i)] + offset;
      p[i] = sh.scale * (DotScalar(qa, row, sh.kv_lora) + DotScalar(qp, row + sh.kv_lora, sh.rope));
      mx = std::max(mx, p[i]);
    }
    for (int i = n_visible; i < n_keys; ++i) p[i] = -std::numeric_limits<float>::infinity();
    float sum = 0.0f;
    for (int i = 0; i < n_keys; ++i) sum += p[i] = std::exp(p[i] - mx);
    float* out = lat + static_cast<size_t>(h) * sh.kv_lora;
    std::fill(out, out + sh.kv_lora, 0.0f);
    for (int i = 0; i < n_keys; ++i) AxpyScalar(p[i] / sum, rows[KeyAt(keys, i)] + offset, out, sh.kv_lora);
  }
}

void MlaRowsRef(const MlaDecodeShape& sh, int queries, const float* q_abs, const float* q_pe, const float* const* rows,
                size_t offset, const int* const* keys, const int* n_keys, float* lat) {
  const MlaDecodeShape one{sh.heads, sh.kv_lora, sh.rope, sh.scale, nullptr};
  const size_t H = static_cast<size_t>(sh.heads);
  for (int j = 0; j < queries; ++j) {
    const size_t at = static_cast<size_t>(j) * H;
    MlaDecodeRef(one, q_abs + at * sh.kv_lora, q_pe + at * sh.rope, rows, offset, keys[j], n_keys[j],
                 lat + at * sh.kv_lora);
  }
}

namespace {

// Many head-queries (a block of prefill queries, or a query of many heads)
// go to the kernels with head-queries as lanes, in tiles of 32, at least
// two tiles per thread; fewer keep mla_decode's split over keys.
bool FlashTiles(const MlaDecodeShape& sh, int n_keys, const ThreadPool& pool) {
  return n_keys >= 1 && sh.heads >= 64 * pool.size();
}

// mla_decode for one Isa (not kReference).
void MlaDecode(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows, size_t offset,
               const int* keys, int n_keys, float* lat, Isa isa) {
  const int H = sh.heads, L = sh.kv_lora, R = sh.rope, W = L + R;
  const bool avx512 = isa == Isa::kAvx512;
  ThreadPool& pool = DefaultThreadPool();
#if defined(__x86_64__)
  if (avx512 && FlashTiles(sh, n_keys, pool)) return cpu::mla_flash_avx512(sh, q_abs, q_pe, rows, offset, keys, n_keys, lat);
#endif
  const Vec v = VecFor(isa);
  // Each cached row is [latent | rope key]: with the query likewise joined per
  // head, a score is one dot product over the whole row.
  std::vector<float> q(static_cast<size_t>(H) * W);
  for (int h = 0; h < H; ++h) {
    std::copy_n(q_abs + static_cast<size_t>(h) * L, L, &q[static_cast<size_t>(h) * W]);
    std::copy_n(q_pe + static_cast<size_t>(h) * R, R, &q[static_cast<size_t>(h) * W + L]);
  }
  // Scores of one key row for every head, 8 heads per pass over the row.
  auto head_scores = [&](const float* row, float* s) {
    for (int h0 = 0; h0 < H; h0 += 8) {
      const int hn = std::min(8, H - h0);
#if defined(__x86_64__)
      if (avx512) DotsUpTo8Avx512(&q[static_cast<size_t>(h0) * W], hn, row, W, s + h0);
      else
#endif
        Dots8Generic(v.dot, &q[static_cast<size_t>(h0) * W], hn, row, W, s + h0);
      for (int h = h0; h < h0 + hn; ++h) s[h] *= sh.scale;
    }
  };
  // The same for two rows (AVX-512: both rows per pass over the queries).
  auto head_scores2 = [&](const float* row0, const float* row1, float* s0, float* s1) {
#if defined(__x86_64__)
    if (avx512) {
      for (int h0 = 0; h0 < H; h0 += 8) {
        const int hn = std::min(8, H - h0);
        if (hn == 8) {
          DotsX2Avx512<8>(&q[static_cast<size_t>(h0) * W], row0, row1, W, s0 + h0, s1 + h0);
        } else if (hn == 4) {
          DotsX2Avx512<4>(&q[static_cast<size_t>(h0) * W], row0, row1, W, s0 + h0, s1 + h0);
        } else {
          DotsUpTo8Avx512(&q[static_cast<size_t>(h0) * W], hn, row0, W, s0 + h0);
          DotsUpTo8Avx512(&q[static_cast<size_t>(h0) * W], hn, row1, W, s1 + h0);
        }
      }
      for (int h = 0; h < H; ++h) {
        s0[h] *= sh.scale;
        s1[h] *= sh.scale;
      }
      return;
    }
#endif
    head_scores(row0, s0);
    head_scores(row1, s1);
  };
  // acc[h] += p[r][h] * row r's latent, for NR rows (NR = 4, or 1 for the rest).
  auto accumulate = [&](const float* const* p, const float* const* row, int nr, float* acc) {
    for (int h0 = 0; h0 < H; h0 += 8) {
      const int hn = std::min(8, H - h0);
      float* acc_h = acc + static_cast<size_t>(h0) * L;
#if defined(__x86_64__)
      if (avx512) {
        const float* ph[4];
        for (int r = 0; r < nr; ++r) ph[r] = p[r] + h0;
        if (nr == 4) AxpysUpTo8Avx512<4>(ph, hn, row, L, acc_h);
        else for (int r = 0; r < nr; ++r) AxpysUpTo8Avx512<1>(ph + r, hn, row + r, L, acc_h);
        continue;
      }
#endif
      for (int r = 0; r < nr; ++r)
        for (int h = h0; h < h0 + hn; ++h) v.axpy(p[r][h], row[r], acc + static_cast<size_t>(h) * L, L);
    }
  };
  // Keys in chunks; every chunk reads each of its rows once for all heads,
  // twice in all: scores and each chunk's maxima first, then (after the
  // global maxima) exponentials, their sums and the weighted latent sums.
  const int chunk = std::max(64, (n_keys + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n_keys + chunk - 1) / chunk;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(static_cast<size_t>(n_keys) * H);  // [key, head]
  std::vector<float> chunk_max(static_cast<size_t>(chunks) * H, neg_inf), chunk_sum(chunk_max.size(), 0.0f);
  // Few heads (16 % H == 0: 1, 2, 4, 8 or 16): a vector holds whole keys'
  // scores, and the maxima and exponentials run over a chunk's scores as one
  // array; per key, a 4-head model would use a quarter of each vector and
  // chain every key's maxima through memory.
  const bool whole_keys_per_vector = avx512 && 16 % H == 0;
  const bool chunk_maxima_at_once = whole_keys_per_vector && !sh.visible;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n_keys, b + chunk);
    float* mx = &chunk_max[c * static_cast<size_t>(H)];
    for (int i = b; i < e; i += 2) {
      const int nr = std::min(2, e - i);
      for (int r = 0; r < nr; ++r)
        if (i + r + kRowsAhead < e) PrefetchFloats(rows[KeyAt(keys, i + r + kRowsAhead)] + offset, W);
      float* s = &scores[static_cast<size_t>(i) * H];
      if (nr == 2) head_scores2(rows[KeyAt(keys, i)] + offset, rows[KeyAt(keys, i + 1)] + offset, s, s + H);
      else head_scores(rows[KeyAt(keys, i)] + offset, s);
      if (chunk_maxima_at_once) continue;
      for (int r = 0; r < nr; ++r, s += H) {
        if (sh.visible)
          for (int h = 0; h < H; ++h)
            if (i + r >= sh.visible[h]) s[h] = neg_inf;  // exp gives 0: no weight, no sum
        for (int h = 0; h < H; ++h) mx[h] = std::max(mx[h], s[h]);
      }
    }
#if defined(__x86_64__)
    if (chunk_maxima_at_once) MaxOverKeysAvx512(&scores[static_cast<size_t>(b) * H], e - b, H, mx);
#endif
  });
  std::vector<float> mx(static_cast<size_t>(H), neg_inf);
  for (int c = 0; c < chunks; ++c)
    for (int h = 0; h < H; ++h) mx[h] = std::max(mx[h], chunk_max[static_cast<size_t>(c) * H + h]);
  std::vector<float> partial(static_cast<size_t>(chunks) * H * L, 0.0f);
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n_keys, b + chunk);
    float* acc = &partial[c * static_cast<size_t>(H) * L];
    float* sum = &chunk_sum[c * static_cast<size_t>(H)];
#if defined(__x86_64__)
    if (avx512) {
      // The chunk's weights first, then the tiled weighted sums over its
      // rows (in L2 from the scores pass), 8 heads at a time.
      std::vector<const float*> row(static_cast<size_t>(e - b));
      if (whole_keys_per_vector) ExpShiftedAccumulateKeysAvx512(&scores[static_cast<size_t>(b) * H], e - b, H, mx.data(), sum);
      for (int i = b; i < e; ++i) {
        if (!whole_keys_per_vector) ExpShiftedAccumulate(&scores[static_cast<size_t>(i) * H], mx.data(), sum, H, true);
        row[static_cast<size_t>(i - b)] = rows[KeyAt(keys, i)] + offset;
      }
      for (int h0 = 0; h0 < H; h0 += 8)
        AccumulateTiledUpTo8Avx512(&scores[static_cast<size_t>(b) * H + h0], std::min(8, H - h0), H, row.data(), e - b,
                                   L, acc + static_cast<size_t>(h0) * L);
      return;
    }
#endif
    for (int i = b; i < e; i += 4) {
      const int nr = std::min(4, e - i);
      const float* p[4];
      const float* row[4];
      for (int r = 0; r < nr; ++r) {
        if (i + r + kRowsAhead < e) PrefetchFloats(rows[KeyAt(keys, i + r + kRowsAhead)] + offset, L);
        float* s = &scores[static_cast<size_t>(i + r) * H];
        ExpShiftedAccumulate(s, mx.data(), sum, H, avx512);
        p[r] = s;
        row[r] = rows[KeyAt(keys, i + r)] + offset;
      }
      accumulate(p, row, nr, acc);
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

// mla_rows for one Isa: the queries side by side on the pool, each query's
// call running inline on its thread (a nested parallel-for runs serially);
// AVX-512 takes a query's heads as the vector lanes.
void MlaRows(const MlaDecodeShape& sh, int queries, const float* q_abs, const float* q_pe, const float* const* rows,
             size_t offset, const int* const* keys, const int* n_keys, float* lat, Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx512) return cpu::mla_rows_flash_avx512(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
#endif
  const MlaDecodeShape one{sh.heads, sh.kv_lora, sh.rope, sh.scale, nullptr};
  const size_t H = static_cast<size_t>(sh.heads);
  DefaultThreadPool().ParallelFor(static_cast<size_t>(queries), [&](size_t j) {
    const size_t at = j * H;
    MlaDecode(one, q_abs + at * sh.kv_lora, q_pe + at * sh.rope, rows, offset, keys[j], n_keys[j],
              lat + at * sh.kv_lora, isa);
  });
}

}  // namespace

void IndexerScoresRef(const float* iq, const float* w, int heads, int dim, const float* const* rows, size_t offset, int n,
                      float* scores) {
  for (int s = 0; s < n; ++s) {
    const float* ik = rows[s] + offset;
    float I = 0.0f;
    for (int j = 0; j < heads; ++j) I += w[j] * std::max(0.0f, DotScalar(iq + static_cast<size_t>(j) * dim, ik, dim));
    scores[s] = I;
  }
}

namespace {

// indexer_scores for one Isa (not kReference).
void IndexerScores(const float* iq, const float* w, int heads, int dim, const float* const* rows, size_t offset, int n,
                   float* scores, Isa isa) {
  const Vec v = VecFor(isa);
  const bool avx512 = isa == Isa::kAvx512;  // 8 heads per pass over a key
  ThreadPool& pool = DefaultThreadPool();
  const int chunk = std::max(256, (n + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n + chunk - 1) / chunk;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int b = static_cast<int>(c) * chunk, e = std::min(n, b + chunk);
    float d[2][8];
    // Two keys per pass over the queries with AVX-512 (DotsX2Avx512).
    for (int s = b; s < e; s += 2) {
      const int nk = std::min(2, e - s);
      for (int k = 0; k < nk; ++k)
        if (s + k + kRowsAhead < e) PrefetchFloats(rows[s + k + kRowsAhead] + offset, dim);
      float I[2] = {0.0f, 0.0f};
      for (int h0 = 0; h0 < heads; h0 += 8) {
        const int hn = std::min(8, heads - h0);
        const float* qh = iq + static_cast<size_t>(h0) * dim;
#if defined(__x86_64__)
        if (avx512 && hn == 8 && nk == 2) DotsX2Avx512<8>(qh, rows[s] + offset, rows[s + 1] + offset, dim, d[0], d[1]);
        else if (avx512 && hn == 4 && nk == 2) DotsX2Avx512<4>(qh, rows[s] + offset, rows[s + 1] + offset, dim, d[0], d[1]);
        else if (avx512)
          for (int k = 0; k < nk; ++k) DotsUpTo8Avx512(qh, hn, rows[s + k] + offset, dim, d[k]);
        else
#endif
          for (int k = 0; k < nk; ++k) Dots8Generic(v.dot, qh, hn, rows[s + k] + offset, dim, d[k]);
        for (int k = 0; k < nk; ++k)
          for (int j = 0; j < hn; ++j) I[k] += w[h0 + j] * std::max(0.0f, d[k][j]);
      }
      for (int k = 0; k < nk; ++k) scores[s + k] = I[k];
    }
  });
}

#if defined(__x86_64__)
// Query q's scores over keys [kb, kb + 32): the keys' rows transposed in Kt
// (Kt[d * 32 + j] = key kb + j, element d), each head's dot products for 32
// keys in two vectors (one lane per key), HN heads at a time so that each
// piece of Kt is loaded once for them.
template <int HN>
__attribute__((target("avx512f"))) inline void IndexerHeadsAvx512(const float* Kt, const float* iq, const float* w,
                                                                  int dim, __m512& I0, __m512& I1) {
  __m512 a0[HN], a1[HN];
#pragma GCC unroll 8
  for (int i = 0; i < HN; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  for (int d = 0; d < dim; ++d) {
    const __m512 k0 = _mm512_load_ps(Kt + d * 32), k1 = _mm512_load_ps(Kt + d * 32 + 16);
#pragma GCC unroll 8
    for (int i = 0; i < HN; ++i) {
      const __m512 x = _mm512_set1_ps(iq[static_cast<size_t>(i) * dim + d]);
      a0[i] = _mm512_fmadd_ps(x, k0, a0[i]);
      a1[i] = _mm512_fmadd_ps(x, k1, a1[i]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < HN; ++i) {
    const __m512 wi = _mm512_set1_ps(w[i]);
    I0 = _mm512_fmadd_ps(wi, _mm512_max_ps(a0[i], zero), I0);
    I1 = _mm512_fmadd_ps(wi, _mm512_max_ps(a1[i], zero), I1);
  }
}

__attribute__((target("avx512f"))) void IndexerBatchAvx512(const float* iq, const float* w, int queries, int heads,
                                                          int dim, const float* const* rows, size_t offset,
                                                          const int* n, float* scores, size_t ld, int b, int e,
                                                          float* Kt) {
  for (int kb = b; kb < e; kb += 32) {
    const int nk = std::min(32, e - kb);
    for (int j = 0; j < 32; ++j) {
      if (j < nk) {
        const float* row = rows[kb + j] + offset;
        for (int d = 0; d < dim; ++d) Kt[d * 32 + j] = row[d];
      } else {
        for (int d = 0; d < dim; ++d) Kt[d * 32 + j] = 0.0f;
      }
    }
    for (int q = 0; q < queries; ++q) {
      if (kb >= n[q]) continue;
      const float* qi = iq + static_cast<size_t>(q) * heads * dim;
      const float* wq = w + static_cast<size_t>(q) * heads;
      __m512 I0 = _mm512_setzero_ps(), I1 = _mm512_setzero_ps();
      int h = 0;
      // 8 heads a pass where there are: 16 independent sums hide the FMA's
      // latency with room to spare, and each piece of Kt serves 8 heads.
      for (; h + 8 <= heads; h += 8) IndexerHeadsAvx512<8>(Kt, qi + static_cast<size_t>(h) * dim, wq + h, dim, I0, I1);
      for (; h + 4 <= heads; h += 4) IndexerHeadsAvx512<4>(Kt, qi + static_cast<size_t>(h) * dim, wq + h, dim, I0, I1);
      for (; h < heads; ++h) IndexerHeadsAvx512<1>(Kt, qi + static_cast<size_t>(h) * dim, wq + h, dim, I0, I1);
      const int valid = std::min(nk, n[q] - kb);
      float* out = scores + static_cast<size_t>(q) * ld + kb;
      _mm512_mask_storeu_ps(out, TailMask16(valid), I0);
      if (valid > 16) _mm512_mask_storeu_ps(out + 16, TailMask16(valid - 16), I1);
    }
  }
}
#endif

// indexer_scores_batch for one Isa (not kReference): AVX-512 blocked over
// the queries (4 or more); otherwise the one-query form per query.
void IndexerScoresBatch(const float* iq, const float* w, int queries, int heads, int dim, const float* const* rows,
                        size_t offset, const int* n, float* scores, size_t ld, Isa isa) {
#if defined(__x86_64__)
  // Under 4 queries (decode) the transposition costs more than the reuse
  // saves: the one-query form.
  if (isa == Isa::kAvx512 && queries >= 4) {
    int n_max = 0;
    for (int q = 0; q < queries; ++q) n_max = std::max(n_max, n[q]);
    ThreadPool& pool = DefaultThreadPool();
    // Key chunks of whole 32-key blocks, a few per thread.
    int chunk = std::max(256, (n_max + pool.size() * 4 - 1) / (pool.size() * 4));
    chunk = (chunk + 31) / 32 * 32;
    const int chunks = (n_max + chunk - 1) / chunk;
    pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
      const int b = static_cast<int>(c) * chunk, e = std::min(n_max, b + chunk);
      std::vector<float> kt_buf(static_cast<size_t>(dim) * 32 + 16);
      // 64-byte aligned for the aligned loads.
      float* Kt = kt_buf.data() + ((64 - reinterpret_cast<uintptr_t>(kt_buf.data()) % 64) % 64) / sizeof(float);
      IndexerBatchAvx512(iq, w, queries, heads, dim, rows, offset, n, scores, ld, b, e, Kt);
    });
    return;
  }
#endif
  for (int q = 0; q < queries; ++q)
    IndexerScores(iq + static_cast<size_t>(q) * heads * dim, w + static_cast<size_t>(q) * heads, heads, dim, rows,
                  offset, n[q], scores + static_cast<size_t>(q) * ld, isa);
}

}  // namespace

void IndexerScoresBatchRef(const float* iq, const float* w, int queries, int heads, int dim, const float* const* rows,
                           size_t offset, const int* n, float* scores, size_t ld) {
  for (int q = 0; q < queries; ++q)
    IndexerScoresRef(iq + static_cast<size_t>(q) * heads * dim, w + static_cast<size_t>(q) * heads, heads, dim, rows,
                     offset, n[q], scores + static_cast<size_t>(q) * ld);
}

// A radix select: each score as a 32-bit key that orders as the floats do
// (-0 and +0 as one key), the k-th largest key found from the top 11, 11 and
// 10 bits in three counting passes, then one pass in index order takes the
// keys above it and, lowest index first, as many equal to it as are still
// needed. About 4 passes of plain loads where nth_element with a comparator
// cost several times more: at a DSA layer's 14K cached keys per query this
// selection was most of the indexer's time.
void TopKIndicesRef(const float* scores, int n, int k, int* out) {
  if (k <= 0) return;
  if (k >= n) {
    for (int i = 0; i < n; ++i) out[i] = i;
    return;
  }
  thread_local std::vector<uint32_t> keys;
  keys.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const float f = scores[i];
    const uint32_t b = f == 0.0f ? 0u : std::bit_cast<uint32_t>(f);
    keys[static_cast<size_t>(i)] = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
  uint32_t prefix = 0, mask = 0;
  int needed = k;  // of the top k, how many lie at or below the prefix's bucket
  constexpr int kShifts[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
  std::array<int, 2048> hist;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShifts[pass];
    const uint32_t digits = (1u << kBits[pass]) - 1;
    std::fill_n(hist.begin(), digits + 1, 0);
    for (int i = 0; i < n; ++i) {
      const uint32_t key = keys[static_cast<size_t>(i)];
      if ((key & mask) == prefix) ++hist[(key >> shift) & digits];
    }
    for (int d = static_cast<int>(digits); d >= 0; --d) {
      if (hist[static_cast<size_t>(d)] >= needed) {
        prefix |= static_cast<uint32_t>(d) << shift;
        mask |= digits << shift;
        break;
      }
      needed -= hist[static_cast<size_t>(d)];
    }
  }
  // prefix is now the k-th largest key; `needed` of the keys equal to it are in.
  int w = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t key = keys[static_cast<size_t>(i)];
    if (key > prefix || (key == prefix && needed-- > 0)) out[w++] = i;
  }
}

// Up to 16k scores the binned selection (topk_binned.hpp: a histogram of the
// scores' values, an exact order only in the bin of the k-th best); beyond,
// the streamed one (topk_stream.hpp: a lower bound on the k-th score from
// group maxima, then one compare a score), whose cost barely grows with n
// while the binned count does. k 2048, indexer-like scores (sums of ReLUs),
// one core, streamed / binned / radix: 0.075 / 0.013 / 0.068 ms at 9K,
// 0.14 / 0.09 / 0.32 ms at 32K, 0.30 / 0.74 / 1.6 ms at 128K; on a DSA
// layer's real scores at 9K and 12K keys the binned one took 0.011-0.052
// ms against 0.066-0.097 streamed. The radix select (TopKIndicesRef) is the
// fallback when the scores' range gives no finite bins (an infinite score).
void TopKIndices(const float* scores, int n, int k, int* out) {
  if (k > 0 && k < n && n <= 16 * k && TopKIndicesBinned(scores, n, k, out)) return;
  if (k > 0 && n >= 4 * k)
    TopKIndicesStreamed(scores, n, k, out);
  else
    TopKIndicesRef(scores, n, k, out);
}

namespace cpu {
#define MOESERVE_ATTENTION_VARIANTS(sfx, isa)                                                                      \
  void mla_decode_##sfx(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe,                        \
                        const float* const* rows, size_t offset, const int* keys, int n_keys, float* lat) {        \
    MlaDecode(shape, q_abs, q_pe, rows, offset, keys, n_keys, lat, isa);                                           \
  }                                                                                                                \
  void mla_rows_##sfx(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,             \
                      const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,         \
                      float* lat) {                                                                               \
    MlaRows(shape, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat, isa);                                    \
  }                                                                                                                \
  void indexer_scores_##sfx(const float* iq, const float* w, int heads, int dim, const float* const* rows,          \
                            size_t offset, int n, float* scores) {                                                 \
    IndexerScores(iq, w, heads, dim, rows, offset, n, scores, isa);                                                \
  }                                                                                                                \
  void indexer_scores_batch_##sfx(const float* iq, const float* w, int queries, int heads, int dim,                 \
                                  const float* const* rows, size_t offset, const int* n, float* scores, size_t ld) { \
    IndexerScoresBatch(iq, w, queries, heads, dim, rows, offset, n, scores, ld, isa);                               \
  }
}  // namespace cpu

size_t AttentionScratchHeldBytes() {
#if defined(__x86_64__)
  if (CpuHasAvx512Bf16()) return cpu::mla_bf16dot_held_bytes();
#endif
  return 0;
}

namespace cpu {

// The BF16-activation set's attention (KernelsWithBf16Activations): BF16
// dot products where the CPU has them.
void mla_decode_avx512_bf16act(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe,
                               const float* const* rows, size_t offset, const int* keys, int n_keys, float* lat) {
#if defined(__x86_64__)
  if (CpuHasAvx512Bf16() && FlashTiles(shape, n_keys, DefaultThreadPool()))
    return mla_flash_bf16dot(shape, q_abs, q_pe, rows, offset, keys, n_keys, lat);
#endif
  MlaDecode(shape, q_abs, q_pe, rows, offset, keys, n_keys, lat, Isa::kAvx512);
}
void mla_rows_avx512_bf16act(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,
                             const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                             float* lat) {
#if defined(__x86_64__)
  if (CpuHasAvx512Bf16()) return mla_rows_flash_bf16dot(shape, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
#endif
  MlaRows(shape, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat, Isa::kAvx512);
}

MOESERVE_ATTENTION_VARIANTS(scalar, Isa::kScalar)
MOESERVE_ATTENTION_VARIANTS(avx2, Isa::kAvx2)
MOESERVE_ATTENTION_VARIANTS(avx512, Isa::kAvx512)
#undef MOESERVE_ATTENTION_VARIANTS
}  // namespace cpu

}  // namespace moeserve::kernels

// ---- Grouped-query attention with sinks (gpt-oss) ----

namespace moeserve::kernels {

void GqaSinkAttentionRef(const GqaSinkShape& sh, int queries, const float* q, const float* const* rows,
                         const int* first, const int* last, float* out) {
  const size_t H = static_cast<size_t>(sh.heads), d = static_cast<size_t>(sh.head_dim);
  const size_t rep = H / static_cast<size_t>(sh.kv_heads), qd = H * d;
  std::vector<float> scores;
  for (int i = 0; i < queries; ++i)
    for (size_t h = 0; h < H; ++h) {
      const float* qh = q + static_cast<size_t>(i) * qd + h * d;
      const size_t kh = h / rep;
      const int lo = first[i], hi = last[i];
      scores.assign(static_cast<size_t>(hi + 1 - lo), 0.0f);
      float mx = sh.sinks[h];
      for (int j = lo; j <= hi; ++j) {
        const float* kj = rows[j] + sh.key_offset + kh * d;
        float s = 0;
        for (size_t e = 0; e < d; ++e) s += qh[e] * kj[e];
        scores[static_cast<size_t>(j - lo)] = s * sh.scale;
        mx = std::max(mx, scores[static_cast<size_t>(j - lo)]);
      }
      // The sink is one more logit in the denominator, with no value.
      double denom = std::exp(static_cast<double>(sh.sinks[h]) - mx);
      for (float& s : scores) denom += (s = static_cast<float>(std::exp(static_cast<double>(s) - mx)));
      float* oh = out + static_cast<size_t>(i) * qd + h * d;
      std::fill_n(oh, d, 0.0f);
      for (int j = lo; j <= hi; ++j) {
        const float p = static_cast<float>(scores[static_cast<size_t>(j - lo)] / denom);
        const float* vj = rows[j] + sh.value_offset + kh * d;
        for (size_t e = 0; e < d; ++e) oh[e] += p * vj[e];
      }
    }
}

namespace {

// The tiled form. A task: key/value head g and queries [i0, i0 + nrows).
// Its query vectors (row r, head g * rep + u) are the lanes m = r * rep + u,
// padded to a multiple of 16 (padding lanes see no key). Per tile of up to
// 64 keys: scores st[key][lane], masked to each lane's key range, the
// running maxima, the weights and the running sums per lane, then the
// accumulators acc[e][lane] rescaled and the weighted values added.
constexpr int kGqaTileKeys = 64;
constexpr int kGqaLanes = 16;
constexpr int kGqaTaskVectors = 128;  // query vectors per task (rows x heads of a group)

struct GqaScratch {
  std::vector<float> qt, acc, st, mrun, l, corr;
  std::vector<int> lo, hi;
  std::vector<float> zeros;
  const float* kp[kGqaTileKeys + 4];
  const float* vp[kGqaTileKeys + 4];
};

void GqaScoresGeneric(const float* qt, int M, int d, const float* const* kp, int nk, float* st) {
  for (int jj = 0; jj < nk; ++jj) {
    float* s = st + static_cast<size_t>(jj) * M;
    std::fill_n(s, M, 0.0f);
    for (int e = 0; e < d; ++e) {
      const float kv = kp[jj][e];
      const float* qe = qt + static_cast<size_t>(e) * M;
      for (int m = 0; m < M; ++m) s[m] += qe[m] * kv;
    }
  }
}

// Masks, running maxima, weights and sums of one tile (keys j0 + jj).
void GqaSoftmaxGeneric(GqaScratch& w, int M, int j0, int nk) {
  for (int m = 0; m < M; ++m) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int jj = 0; jj < nk; ++jj) {
      float& s = w.st[static_cast<size_t>(jj) * M + m];
      const int j = j0 + jj;
      if (j < w.lo[m] || j > w.hi[m]) s = -std::numeric_limits<float>::infinity();
      mx = std::max(mx, s);
    }
    const float mnew = std::max(w.mrun[m], mx);
    w.corr[m] = std::exp(w.mrun[m] - mnew);
    float sum = 0;
    for (int jj = 0; jj < nk; ++jj) {
      float& s = w.st[static_cast<size_t>(jj) * M + m];
      sum += (s = std::exp(s - mnew));
    }
    w.l[m] = w.l[m] * w.corr[m] + sum;
    w.mrun[m] = mnew;
  }
}

void GqaValuesGeneric(GqaScratch& w, int M, int d, size_t voff, int nk) {
  for (int e = 0; e < d; ++e) {
    float* a = w.acc.data() + static_cast<size_t>(e) * M;
    for (int m = 0; m < M; ++m) a[m] *= w.corr[m];
    for (int jj = 0; jj < nk; ++jj) {
      const float vv = w.vp[jj][voff + static_cast<size_t>(e)];
      const float* p = w.st.data() + static_cast<size_t>(jj) * M;
      for (int m = 0; m < M; ++m) a[m] += p[m] * vv;
    }
  }
}

#if defined(__x86_64__)
// Scores of 4 keys against NB blocks of 16 lanes (4 x NB accumulators).
template <int NB>
__attribute__((target("avx512f"))) void GqaScores4Avx512(const float* qt, int M, int d, const float* const* kp,
                                                          float* st) {
  __m512 acc[4][NB];
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < NB; ++b) acc[k][b] = _mm512_setzero_ps();
  for (int e = 0; e < d; ++e) {
    __m512 qv[NB];
    for (int b = 0; b < NB; ++b) qv[b] = _mm512_loadu_ps(qt + static_cast<size_t>(e) * M + b * kGqaLanes);
    for (int k = 0; k < 4; ++k) {
      const __m512 kb = _mm512_set1_ps(kp[k][e]);
      for (int b = 0; b < NB; ++b) acc[k][b] = _mm512_fmadd_ps(qv[b], kb, acc[k][b]);
    }
  }
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(st + static_cast<size_t>(k) * M + b * kGqaLanes, acc[k][b]);
}

// Keys padded to a multiple of 4 (kp's padding points at zeros).
__attribute__((target("avx512f"))) void GqaScoresAvx512(const float* qt, int M, int d, const float* const* kp, int nk,
                                                         float* st) {
  for (int jj = 0; jj < nk; jj += 4)
    for (int m0 = 0; m0 < M; m0 += 4 * kGqaLanes) {
      const int nb = std::min(4, (M - m0) / kGqaLanes);
      const float* q0 = qt + m0;
      float* s0 = st + static_cast<size_t>(jj) * M + m0;
      switch (nb) {
        case 4: GqaScores4Avx512<4>(q0, M, d, kp + jj, s0); break;
        case 3: GqaScores4Avx512<3>(q0, M, d, kp + jj, s0); break;
        case 2: GqaScores4Avx512<2>(q0, M, d, kp + jj, s0); break;
        default: GqaScores4Avx512<1>(q0, M, d, kp + jj, s0); break;
      }
    }
}

__attribute__((target("avx512f"))) void GqaSoftmaxAvx512(GqaScratch& w, int M, int j0, int nk) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int m = 0; m < M; m += kGqaLanes) {
    const __m512i lo = _mm512_loadu_si512(w.lo.data() + m), hi = _mm512_loadu_si512(w.hi.data() + m);
    __m512 mx = ninf;
    for (int jj = 0; jj < nk; ++jj) {
      float* s = w.st.data() + static_cast<size_t>(jj) * M + m;
      const __m512i j = _mm512_set1_epi32(j0 + jj);
      const __mmask16 in = _mm512_cmpge_epi32_mask(j, lo) & _mm512_cmple_epi32_mask(j, hi);
      const __m512 v = _mm512_mask_mov_ps(ninf, in, _mm512_loadu_ps(s));
      _mm512_storeu_ps(s, v);
      mx = _mm512_max_ps(mx, v);
    }
    const __m512 mold = _mm512_loadu_ps(w.mrun.data() + m);
    const __m512 mnew = _mm512_max_ps(mold, mx);
    const __m512 corr = simd::Exp512(_mm512_sub_ps(mold, mnew));
    __m512 sum = _mm512_setzero_ps();
    for (int jj = 0; jj < nk; ++jj) {
      float* s = w.st.data() + static_cast<size_t>(jj) * M + m;
      const __m512 p = simd::Exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mnew));
      _mm512_storeu_ps(s, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(w.corr.data() + m, corr);
    _mm512_storeu_ps(w.l.data() + m, _mm512_fmadd_ps(_mm512_loadu_ps(w.l.data() + m), corr, sum));
    _mm512_storeu_ps(w.mrun.data() + m, mnew);
  }
}

// acc[e .. e + 4) x NB lane blocks, rescaled, plus the tile's weighted values.
template <int NB>
__attribute__((target("avx512f"))) void GqaValues4Avx512(GqaScratch& w, int M, int e, int m0, size_t voff, int nk) {
  __m512 acc[4][NB], corr[NB];
  for (int b = 0; b < NB; ++b) corr[b] = _mm512_loadu_ps(w.corr.data() + m0 + b * kGqaLanes);
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < NB; ++b)
      acc[k][b] = _mm512_mul_ps(_mm512_loadu_ps(w.acc.data() + static_cast<size_t>(e + k) * M + m0 + b * kGqaLanes),
                                corr[b]);
  for (int jj = 0; jj < nk; ++jj) {
    __m512 p[NB];
    for (int b = 0; b < NB; ++b) p[b] = _mm512_loadu_ps(w.st.data() + static_cast<size_t>(jj) * M + m0 + b * kGqaLanes);
    const float* v = w.vp[jj] + voff + e;
    for (int k = 0; k < 4; ++k) {
      const __m512 vb = _mm512_set1_ps(v[k]);
      for (int b = 0; b < NB; ++b) acc[k][b] = _mm512_fmadd_ps(p[b], vb, acc[k][b]);
    }
  }
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < NB; ++b)
      _mm512_storeu_ps(w.acc.data() + static_cast<size_t>(e + k) * M + m0 + b * kGqaLanes, acc[k][b]);
}

// d a multiple of 4.
__attribute__((target("avx512f"))) void GqaValuesAvx512(GqaScratch& w, int M, int d, size_t voff, int nk) {
  for (int m0 = 0; m0 < M; m0 += 4 * kGqaLanes) {
    const int nb = std::min(4, (M - m0) / kGqaLanes);
    for (int e = 0; e < d; e += 4) switch (nb) {
        case 4: GqaValues4Avx512<4>(w, M, e, m0, voff, nk); break;
        case 3: GqaValues4Avx512<3>(w, M, e, m0, voff, nk); break;
        case 2: GqaValues4Avx512<2>(w, M, e, m0, voff, nk); break;
        default: GqaValues4Avx512<1>(w, M, e, m0, voff, nk); break;
      }
  }
}
#endif

void GqaSinkTask(const GqaSinkShape& sh, const float* q, const float* const* rows, const int* first, const int* last,
                 float* out, int g, int i0, int nrows, bool avx512) {
  thread_local GqaScratch w;
  const int d = sh.head_dim, rep = sh.heads / sh.kv_heads;
  const size_t qd = static_cast<size_t>(sh.heads) * static_cast<size_t>(d);
  const int used = nrows * rep;
  const int M = (used + kGqaLanes - 1) / kGqaLanes * kGqaLanes;
  w.qt.assign(static_cast<size_t>(d) * M, 0.0f);
  w.acc.assign(static_cast<size_t>(d) * M, 0.0f);
  w.st.resize(static_cast<size_t>(kGqaTileKeys + 4) * M);
  w.mrun.assign(static_cast<size_t>(M), 0.0f);
  w.l.assign(static_cast<size_t>(M), 1.0f);
  w.corr.assign(static_cast<size_t>(M), 1.0f);
  w.lo.assign(static_cast<size_t>(M), 1);
  w.hi.assign(static_cast<size_t>(M), 0);  // padding lanes: an empty range
  if (w.zeros.size() < static_cast<size_t>(d)) w.zeros.assign(static_cast<size_t>(d), 0.0f);
  int lo = std::numeric_limits<int>::max(), hi = -1;
  for (int m = 0; m < used; ++m) {
    const int r = m / rep, h = g * rep + m % rep;
    const float* qv = q + static_cast<size_t>(i0 + r) * qd + static_cast<size_t>(h) * d;
    for (int e = 0; e < d; ++e) w.qt[static_cast<size_t>(e) * M + m] = qv[e] * sh.scale;
    // The sink starts each lane's softmax: running maximum, sum e^0 = 1.
    w.mrun[static_cast<size_t>(m)] = sh.sinks[h];
    w.lo[static_cast<size_t>(m)] = first[i0 + r];
    w.hi[static_cast<size_t>(m)] = last[i0 + r];
    lo = std::min(lo, first[i0 + r]);
    hi = std::max(hi, last[i0 + r]);
  }
  const size_t koff = sh.key_offset + static_cast<size_t>(g) * d;
  const size_t voff = sh.value_offset + static_cast<size_t>(g) * d;
#if defined(__x86_64__)
  const bool wide = avx512 && d % 4 == 0;
#else
  const bool wide = false;
  (void)avx512;
#endif
  for (int j = lo, end = std::min(hi + 1, lo + kGqaTileKeys); j < end; ++j) {
    PrefetchFloats(rows[j] + koff, d);
    PrefetchFloats(rows[j] + voff, d);
  }
  for (int j0 = lo; j0 <= hi; j0 += kGqaTileKeys) {
    const int nk = std::min(kGqaTileKeys, hi + 1 - j0);
    for (int jj = 0; jj < nk; ++jj) {
      w.kp[jj] = rows[j0 + jj] + koff;
      w.vp[jj] = rows[j0 + jj];
    }
    // The next tile's keys and values, while this one computes: rows lie in
    // pool blocks scattered through the pool, beyond the hardware
    // prefetchers' reach, and a long context's rows are out of the caches.
    for (int j = j0 + kGqaTileKeys, end = std::min(hi + 1, j0 + 2 * kGqaTileKeys); j < end; ++j) {
      PrefetchFloats(rows[j] + koff, d);
      PrefetchFloats(rows[j] + voff, d);
    }
    const int nk4 = (nk + 3) / 4 * 4;
    for (int jj = nk; jj < nk4; ++jj) w.kp[jj] = w.zeros.data();
#if defined(__x86_64__)
    if (wide) {
      GqaScoresAvx512(w.qt.data(), M, d, w.kp, nk4, w.st.data());
      GqaSoftmaxAvx512(w, M, j0, nk);
      GqaValuesAvx512(w, M, d, voff, nk);
      continue;
    }
#endif
    GqaScoresGeneric(w.qt.data(), M, d, w.kp, nk, w.st.data());
    GqaSoftmaxGeneric(w, M, j0, nk);
    GqaValuesGeneric(w, M, d, voff, nk);
  }
  for (int m = 0; m < used; ++m) {
    const int r = m / rep, h = g * rep + m % rep;
    float* o = out + static_cast<size_t>(i0 + r) * qd + static_cast<size_t>(h) * d;
    const float inv = 1.0f / w.l[static_cast<size_t>(m)];
    for (int e = 0; e < d; ++e) o[e] = w.acc[static_cast<size_t>(e) * M + m] * inv;
  }
}

}  // namespace

void GqaSinkAttention(const GqaSinkShape& sh, int queries, const float* q, const float* const* rows, const int* first,
                      const int* last, float* out, Isa isa) {
  if (queries <= 0) return;
  const size_t qd = static_cast<size_t>(sh.heads) * static_cast<size_t>(sh.head_dim);
  if (isa == Isa::kReference) {
    DefaultThreadPool().ParallelFor(static_cast<size_t>(queries), [&](size_t i) {
      GqaSinkAttentionRef(sh, 1, q + i * qd, rows, first + i, last + i, out + i * qd);
    });
    return;
  }
  const int rep = sh.heads / sh.kv_heads;
  const int block = std::max(1, kGqaTaskVectors / rep);
  const int blocks = (queries + block - 1) / block;
  // AVX-512 for its row and for any row that falls back to it (amx).
  bool avx512 = false;
  for (Isa row = isa; row != Isa::kReference && !avx512; row = IsaFallback(row)) avx512 = row == Isa::kAvx512;
  // The last blocks first: under a causal mask they read the most keys.
  DefaultThreadPool().ParallelFor(static_cast<size_t>(blocks) * sh.kv_heads, [&](size_t t) {
    const int b = blocks - 1 - static_cast<int>(t / static_cast<size_t>(sh.kv_heads));
    const int g = static_cast<int>(t % static_cast<size_t>(sh.kv_heads));
    const int i0 = b * block;
    GqaSinkTask(sh, q, rows, first, last, out, g, i0, std::min(block, queries - i0), avx512);
  });
}

}  // namespace moeserve::kernels
