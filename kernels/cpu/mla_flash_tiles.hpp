// The tile machinery of the latent-attention kernels with head-queries as
// the vector lanes (mla_flash_avx512.cpp: fp32 FMAs; mla_flash_bf16dot.cpp:
// BF16 dot products). Included only by those AVX-512 translation units.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "avx512_transpose.hpp"
#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"
#include "vec_exp.hpp"

namespace moeserve::kernels::cpu::flash {

// The two vector widths, as the tile code needs them.
struct Zmm {
  using R = __m512;
  static constexpr int kWidth = 16;
  static R Load(const float* p) { return _mm512_load_ps(p); }
  static void Store(float* p, R v) { _mm512_store_ps(p, v); }
  static R Set1(float x) { return _mm512_set1_ps(x); }
  static R Zero() { return _mm512_setzero_ps(); }
  static R Fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R Mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R Add(R a, R b) { return _mm512_add_ps(a, b); }
  static R Sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R Max(R a, R b) { return _mm512_max_ps(a, b); }
  static R Exp(R x) { return simd::Exp512(x); }
  // s, with -inf in the lanes whose limit seen[lane] <= at.
  static R MaskFrom(R s, const int* seen, int at) {
    return _mm512_mask_mov_ps(s, _mm512_cmple_epi32_mask(_mm512_load_si512(seen), _mm512_set1_epi32(at)),
                              _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
  }
};
struct Ymm {
  using R = __m256;
  static constexpr int kWidth = 8;
  static R Load(const float* p) { return _mm256_load_ps(p); }
  static void Store(float* p, R v) { _mm256_store_ps(p, v); }
  static R Set1(float x) { return _mm256_set1_ps(x); }
  static R Zero() { return _mm256_setzero_ps(); }
  static R Fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R Mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R Add(R a, R b) { return _mm256_add_ps(a, b); }
  static R Sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R Max(R a, R b) { return _mm256_max_ps(a, b); }
  // Through the 512-bit form: it gives exactly 0 for -inf (masked keys).
  static R Exp(R x) { return _mm512_castps512_ps256(simd::Exp512(_mm512_castps256_ps512(x))); }
  static R MaskFrom(R s, const int* seen, int at) {
    return _mm256_mask_mov_ps(s, _mm256_cmple_epi32_mask(_mm256_load_si256(reinterpret_cast<const __m256i*>(seen)),
                                                         _mm256_set1_epi32(at)),
                              _mm256_set1_ps(-std::numeric_limits<float>::infinity()));
  }
};

constexpr int kBlock = 96;  // keys per softmax block (48 and 64 measured 3-10 % slower, 144 slower still)
// Latent columns per weighted-sum micro-tile: 8 for two vectors of lanes
// (16 accumulators); 16 for one (the same count: enough independent sums to
// cover the FMA's or the BF16 dot's latency at two per cycle).
template <int NV>
constexpr int kLatTile = NV == 1 ? 16 : 8;

inline int KeyAt(const int* keys, int i) { return keys ? keys[i] : i; }

// Whether a list's rows are short and too scattered for the hardware's
// prefetch: the first and last rows (ascending) more than kSparseGap rows'
// bytes apart per row on average. Judged by address, since a decode step
// hands its selected rows over as a list of their own, numbered 0, 1, ... A
// top-2048 list of a 64K context and up is scattered; at 4K it reads half
// the rows, and the hardware keeps up. Long rows (the flagship's 576 floats,
// 36 lines) are each a stream the hardware follows after its first lines,
// and their products, 16 tiles of heads over the same rows, bound the step:
// prefetching them cost 0.5-1 ms at 1M (bench_long_context's attend).
constexpr int kSparseGap = 8;
constexpr int kShortRowFloats = 128;  // 8 lines
inline bool ScatteredShortRows(const float* const* rows, size_t offset, const int* keys, int n_keys, int W) {
  if (!keys || n_keys < 2 || W > kShortRowFloats) return false;
  const float* first = rows[keys[0]] + offset;
  const float* last = rows[keys[n_keys - 1]] + offset;
  const ptrdiff_t span = last > first ? last - first : first - last;
  return span > static_cast<ptrdiff_t>(kSparseGap) * n_keys * W;
}

// Every line of rows [i0, i1) of a list (W floats each) requested into L2;
// the block's scores and sums run while they come.
inline void PrefetchListRows(const float* const* rows, size_t offset, const int* keys, int i0, int i1, int W) {
  for (int i = i0; i < i1; ++i) {
    const char* r = reinterpret_cast<const char*>(rows[keys[i]] + offset);
    for (int b = 0; b < W * static_cast<int>(sizeof(float)); b += 64) _mm_prefetch(r + b, _MM_HINT_T1);
  }
}

// A block's n keys through a policy's score micro-tiles: whole tiles of
// kKeyTile keys, then the remainder through the tile of its size;
// tile(std::integral_constant<int, KN>, i) scores keys [i, i + KN).
template <int KN, class TileFn>
inline void RestTile(int rest, int i, TileFn& tile) {
  if constexpr (KN > 0) {
    if (rest == KN) return tile(std::integral_constant<int, KN>{}, i);
    RestTile<KN - 1>(rest, i, tile);
  }
}
template <int kKeyTile, class TileFn>
inline void KeyTiles(int n, TileFn tile) {
  int i = 0;
  for (; i + kKeyTile <= n; i += kKeyTile) tile(std::integral_constant<int, kKeyTile>{}, i);
  RestTile<kKeyTile - 1>(n - i, i, tile);
}

// Scores of KN keys for a tile of 8 lanes whose head h's partial sums sit
// in lanes M h .. M h + M - 1 of a[i] (M = 2 or 4): each head's M lanes
// summed, gathered into the low 16 / M lanes (the rest 0), two keys to a
// 512-bit store: the softmax reads them back 512 bits at a time, and a load
// spanning two stores cannot be forwarded from them.
template <int KN, int M>
inline void StoreGroupedScores(const __m512* a, float* St) {
  __m256i sc[KN];
#pragma GCC unroll 12
  for (int i = 0; i < KN; ++i) {
    __m512 t = _mm512_add_ps(a[i], _mm512_permute_ps(a[i], 0xB1));
    if constexpr (M == 2) {
      sc[i] = _mm512_cvtepi64_epi32(_mm512_castps_si512(t));
    } else {
      t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
      sc[i] = _mm256_castps_si256(_mm512_castps512_ps256(_mm512_maskz_compress_ps(0x1111, t)));
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i + 1 < KN; i += 2)
    _mm512_store_si512(St + i * 8, _mm512_inserti64x4(_mm512_castsi256_si512(sc[i]), sc[i + 1], 1));
  if constexpr (KN % 2 == 1) _mm256_store_si256(reinterpret_cast<__m256i*>(St + (KN - 1) * 8), sc[KN - 1]);
}

// The fp32 FMA products of a tile of NV vectors of lanes (head-queries):
// the queries transposed (Qt[w][lane]), scores and weighted sums read the
// cached rows in place.
template <class V, int NV>
struct Fp32Dot {
  using R = typename V::R;
  static constexpr int kLanes = V::kWidth * NV;
  static constexpr int kKeyTile = NV == 1 ? 12 : 8;  // keys per score micro-tile

  struct Work {
    float* Qt;
    Work(int W, int /*L*/) : Qt(AllocScratch(static_cast<size_t>(W) * kLanes)) {}
    ~Work() { FreeScratch(Qt); }
  };
  // Qt[w][j] = q(j, w), already scaled; pad lanes zero. 512-bit lanes: each
  // 16 lanes' rows copied out whole (Q::Row, contiguous), then transposed 16
  // x 16 in registers (the same values): element by element, a strided
  // load and store per element cost a 32-lane tile about as much as scoring
  // 40-50 keys (perf: Tile::Run's own time, most of it this and WriteOut,
  // was as large as its score and weighted-sum tiles together in a
  // 512-token prefill, whose tiles see 256 keys on average).
  template <class Q>
  static void PackQ(Work& ws, int W, Q q) {
    if constexpr (std::is_same_v<V, Zmm> && requires(float* row) { q.Row(0, row); }) {
      const size_t w_pad = static_cast<size_t>(W + 15) / 16 * 16;
      float* rows = AllocScratch(16 * w_pad);
      for (int g = 0; g < NV; ++g) {
        for (int i = 0; i < 16; ++i) {
          float* row = rows + static_cast<size_t>(i) * w_pad;
          if (g * 16 + i < q.lanes)
            q.Row(g * 16 + i, row);
          else
            std::fill(row, row + W, 0.0f);
        }
        for (int w0 = 0; w0 < W; w0 += 16) {
          const int valid = std::min(16, W - w0);
          const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1);
          __m512 r[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_ps(m, rows + static_cast<size_t>(i) * w_pad + w0);
          Transpose16(r);
          for (int t = 0; t < valid; ++t) _mm512_store_ps(ws.Qt + static_cast<size_t>(w0 + t) * kLanes + g * 16, r[t]);
        }
      }
      FreeScratch(rows);
    } else {
      for (int w = 0; w < W; ++w)
        for (int j = 0; j < kLanes; ++j) ws.Qt[w * kLanes + j] = q(j, w);
    }
  }

  // St[i][lane] = sum_w Qt[w][lane] k_i[w] for the KN keys k_i.
  // (Not inlined: inside the block loop the register allocator spilled
  // accumulators, putting a store-load chain on every step.)
  template <int KN>
  [[gnu::noinline]] static void ScoreTile(const float* __restrict Qt, const float* const* k, int W, float* __restrict St) {
    R a[NV][KN];
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i)
      for (int v = 0; v < NV; ++v) a[v][i] = V::Zero();
    for (int w = 0; w < W; ++w) {
      R q[NV];
      for (int v = 0; v < NV; ++v) q[v] = V::Load(Qt + w * kLanes + v * V::kWidth);
#pragma GCC unroll 12
      for (int i = 0; i < KN; ++i) {
        const R kv = V::Set1(k[i][w]);
        for (int v = 0; v < NV; ++v) a[v][i] = V::Fma(q[v], kv, a[v][i]);
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i)
      for (int v = 0; v < NV; ++v) V::Store(St + i * kLanes + v * V::kWidth, a[v][i]);
  }

  static void Score(Work& ws, const float* const* k, int n, int W, float* St) {
    KeyTiles<kKeyTile>(n, [&](auto kn, int i) { ScoreTile<decltype(kn)::value>(ws.Qt, k + i, W, St + i * kLanes); });
  }

  // Ot[l0 + r][lane] = alpha[lane] Ot[l0 + r][lane] + sum_i P[i][lane] v_i[l0 + r], r < LN, i < n.
  template <int LN>
  [[gnu::noinline]] static void WeightedSumTile(const float* __restrict P, const float* const* v, int n, int l0, const R* alpha,
                              float* __restrict Ot) {
    R a[NV][LN];
#pragma GCC unroll 16
    for (int r = 0; r < LN; ++r)
      for (int u = 0; u < NV; ++u) a[u][r] = V::Mul(alpha[u], V::Load(Ot + (l0 + r) * kLanes + u * V::kWidth));
    for (int i = 0; i < n; ++i) {
      R p[NV];
      for (int u = 0; u < NV; ++u) p[u] = V::Load(P + i * kLanes + u * V::kWidth);
      const float* vi = v[i] + l0;
#pragma GCC unroll 16
      for (int r = 0; r < LN; ++r) {
        const R x = V::Set1(vi[r]);
        for (int u = 0; u < NV; ++u) a[u][r] = V::Fma(p[u], x, a[u][r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < LN; ++r)
      for (int u = 0; u < NV; ++u) V::Store(Ot + (l0 + r) * kLanes + u * V::kWidth, a[u][r]);
  }

  // Ot (OtFloats of it): rows of latent columns, each a vector of lanes;
  // WriteOut: lane j's columns, times r.
  static size_t OtFloats(int L) { return static_cast<size_t>(L) * kLanes; }
  static void WriteOut(const float* Ot, int j, int L, float r, float* out) {
    for (int c = 0; c < L; ++c) out[c] = Ot[static_cast<size_t>(c) * kLanes + j] * r;
  }
  // WriteOut for lanes [0, lanes), lane j's columns into out + j L times
  // r[j]: 512-bit lanes transposed back 16 x 16 in registers (the same
  // products), for the reason PackQ does.
  static void WriteOutAll(const float* Ot, int lanes, int L, const float* r, float* out) {
    if constexpr (std::is_same_v<V, Zmm>) {
      for (int g = 0; g * 16 < lanes; ++g)
        for (int c0 = 0; c0 < L; c0 += 16) {
          const int valid = std::min(16, L - c0);
          const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1);
          __m512 t[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i)
            t[i] = i < valid ? _mm512_load_ps(Ot + static_cast<size_t>(c0 + i) * kLanes + g * 16) : _mm512_setzero_ps();
          Transpose16(t);
          for (int i = 0; i < 16 && g * 16 + i < lanes; ++i) {
            const int j = g * 16 + i;
            _mm512_mask_storeu_ps(out + static_cast<size_t>(j) * L + c0, m, _mm512_mul_ps(t[i], _mm512_set1_ps(r[j])));
          }
        }
    } else {
      for (int j = 0; j < lanes; ++j) WriteOut(Ot, j, L, r[j], out + static_cast<size_t>(j) * L);
    }
  }
  static void Weighted(Work&, const float* P, const float* const* v, int n, int L, const R* alpha, float* Ot) {
    int l0 = 0;
    for (; l0 + kLatTile<NV> <= L; l0 += kLatTile<NV>) WeightedSumTile<kLatTile<NV>>(P, v, n, l0, alpha, Ot);
    for (; l0 + 8 <= L; l0 += 8) WeightedSumTile<8>(P, v, n, l0, alpha, Ot);
    for (; l0 < L; ++l0) WeightedSumTile<1>(P, v, n, l0, alpha, Ot);
  }
};

// The softmax steps over a block of 8-lane score rows (8 head-queries),
// two keys to a 512-bit vector: the exp is most of the softmax's cost, and
// a 256-bit vector would leave half of each one unused.
inline __m256 MaxRows8(const float* St, int n) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx = neg_inf;
  int i = 0;
  for (; i + 2 <= n; i += 2) mx = _mm512_max_ps(mx, _mm512_loadu_ps(St + 8 * i));
  if (i < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, 0xFF, St + 8 * i));
  return _mm256_max_ps(_mm512_castps512_ps256(mx), _mm512_extractf32x8_ps(mx, 1));
}
// St[i][lane] = exp(St[i][lane] - m[lane]); returns the sums per lane.
inline __m256 ExpRows8(float* St, int n, __m256 m) {
  const __m512 m2 = _mm512_broadcast_f32x8(m);
  __m512 sum = _mm512_setzero_ps();
  int i = 0;
  for (; i + 2 <= n; i += 2) {
    const __m512 p = simd::Exp512(_mm512_sub_ps(_mm512_loadu_ps(St + 8 * i), m2));
    _mm512_storeu_ps(St + 8 * i, p);
    sum = _mm512_add_ps(sum, p);
  }
  if (i < n) {
    const __m512 p = simd::Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(0xFF, St + 8 * i), m2));
    _mm512_mask_storeu_ps(St + 8 * i, 0xFF, p);
    sum = _mm512_mask_add_ps(sum, 0xFF, sum, p);
  }
  return _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
}

// A tile's queries: q(j, w) = element w of head-query hq0 + j's row
// (q_abs then q_pe), scaled; 0 for the pad lanes j >= lanes.
struct QuerySlice {
  const float *q_abs, *q_pe;
  int L, R, hq0, lanes;
  float scale;
  float operator()(int j, int w) const {
    if (j >= lanes) return 0.0f;
    const size_t h = static_cast<size_t>(hq0 + j);
    return scale * (w < L ? q_abs[h * L + w] : q_pe[h * R + (w - L)]);
  }
  // Head-query j's row, scaled, into row[0, L + R).
  void Row(int j, float* row) const {
    const size_t h = static_cast<size_t>(hq0 + j);
    for (int w = 0; w < L; ++w) row[w] = scale * q_abs[h * L + w];
    for (int w = 0; w < R; ++w) row[L + w] = scale * q_pe[h * R + w];
  }
};

// One tile through the Dot policy's products: head-queries [hq0, hq0 +
// lanes) of the call over list entries [0, n_keys), lane j limited to the
// first visible[hq0 + j] (if given). Online softmax per block of kBlock keys.
template <class V, int NV, class Dot>
struct Tile {
  using R = typename V::R;
  static constexpr int kLanes = V::kWidth * NV;
  static void Run(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                  size_t offset, const int* keys, int n_keys, int hq0, int lanes, float* lat) {
    const int L = sh.kv_lora, R_ = sh.rope, W = L + R_;
    typename Dot::Work ws(W, L);
    float* St = AllocScratch(static_cast<size_t>(kBlock) * kLanes);
    float* Ot = AllocScratch(Dot::OtFloats(L));
    // Pad lanes (zero queries) copy the nearest real lane's limit, so they
    // change neither bound.
    alignas(64) int seen[kLanes];
    int nearest = n_keys, furthest = 1;
    for (int j = 0; j < lanes; ++j) {
      const int s = sh.visible ? std::min(n_keys, sh.visible[hq0 + j]) : n_keys;
      seen[j] = s;
      nearest = std::min(nearest, s);
      furthest = std::max(furthest, s);
    }
    for (int j = lanes; j < kLanes; ++j) seen[j] = nearest;
    Dot::PackQ(ws, W, QuerySlice{q_abs, q_pe, L, R_, hq0, lanes, sh.scale});
    std::fill(Ot, Ot + Dot::OtFloats(L), 0.0f);
    const R neg_inf = V::Set1(-std::numeric_limits<float>::infinity());
    R m[NV], l[NV];
    for (int u = 0; u < NV; ++u) {
      m[u] = neg_inf;
      l[u] = V::Zero();
    }
    const float* k[kBlock];
    const bool scattered = ScatteredShortRows(rows, offset, keys, furthest, W);
    if (scattered) PrefetchListRows(rows, offset, keys, 0, std::min(furthest, kBlock), W);
    for (int b0 = 0; b0 < furthest; b0 += kBlock) {
      const int n = std::min(kBlock, furthest - b0);
      // Lists are ascending (TopKIndices), so rows are read forwards. Where
      // they are dense the hardware's prefetch keeps up, and prefetching the
      // next block's rows measured 5-15 % slower (bench_kernels mla_rows).
      // Where they are scattered (a long context) each row was a demand miss:
      // the next block's rows are requested half before this block's scores
      // and half before its sums.
      for (int i = 0; i < n; ++i) k[i] = rows[KeyAt(keys, b0 + i)] + offset;
      const int next0 = b0 + n, next1 = std::min(furthest, next0 + kBlock), half = (next0 + next1) / 2;
      if (scattered) PrefetchListRows(rows, offset, keys, next0, half, W);
      Dot::Score(ws, k, n, W, St);
      // Mask (only where a lane stops inside this block), the block maxima.
      if (b0 + n > nearest)
        for (int i = 0; i < n; ++i)
          for (int u = 0; u < NV; ++u) {
            float* si = St + i * kLanes + u * V::kWidth;
            V::Store(si, V::MaskFrom(V::Load(si), seen + u * V::kWidth, b0 + i));
          }
      R bm[NV];
      if constexpr (kLanes == 8) {
        bm[0] = MaxRows8(St, n);
      } else {
        for (int u = 0; u < NV; ++u) bm[u] = neg_inf;
        for (int i = 0; i < n; ++i)
          for (int u = 0; u < NV; ++u) bm[u] = V::Max(bm[u], V::Load(St + i * kLanes + u * V::kWidth));
      }
      // Every lane sees key 0, so from the first block on its maximum is
      // finite and exp(old - new) is 0 there (from -inf), then in (0, 1].
      R alpha[NV], sum[NV];
      for (int u = 0; u < NV; ++u) {
        const R mx = V::Max(m[u], bm[u]);
        alpha[u] = V::Exp(V::Sub(m[u], mx));
        m[u] = mx;
        sum[u] = V::Zero();
      }
      if constexpr (kLanes == 8) {
        sum[0] = ExpRows8(St, n, m[0]);
      } else {
        for (int i = 0; i < n; ++i)
          for (int u = 0; u < NV; ++u) {
            float* si = St + i * kLanes + u * V::kWidth;
            const R p = V::Exp(V::Sub(V::Load(si), m[u]));
            V::Store(si, p);
            sum[u] = V::Add(sum[u], p);
          }
      }
      for (int u = 0; u < NV; ++u) l[u] = V::Fma(l[u], alpha[u], sum[u]);
      if (scattered) PrefetchListRows(rows, offset, keys, half, next1, W);
      Dot::Weighted(ws, St, k, n, L, alpha, Ot);
    }
    alignas(64) float inv[kLanes];
    for (int u = 0; u < NV; ++u) V::Store(inv + u * V::kWidth, l[u]);
    if constexpr (requires { Dot::WriteOutAll(Ot, lanes, L, inv, lat); }) {
      for (int j = 0; j < lanes; ++j) inv[j] = 1.0f / inv[j];
      Dot::WriteOutAll(Ot, lanes, L, inv, lat + static_cast<size_t>(hq0) * L);
    } else {
      for (int j = 0; j < lanes; ++j) Dot::WriteOut(Ot, j, L, 1.0f / inv[j], lat + static_cast<size_t>(hq0 + j) * L);
    }
    FreeScratch(Ot);
    FreeScratch(St);
  }
};

// mla_decode over tiles of head-queries, and mla_rows over (query, tile),
// on the pool.
template <class T>
void DecodeTiles(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                 size_t offset, const int* keys, int n_keys, float* lat) {
  const int tiles = (sh.heads + T::kLanes - 1) / T::kLanes;
  // Tiles in reverse: under causal visibility the last tiles see the most
  // keys, and taking the longest first balances the threads' ends.
  DefaultThreadPool().ParallelFor(static_cast<size_t>(tiles), [&](size_t t) {
    const int hq0 = (tiles - 1 - static_cast<int>(t)) * T::kLanes;
    T::Run(sh, q_abs, q_pe, rows, offset, keys, n_keys, hq0, std::min(T::kLanes, sh.heads - hq0), lat);
  });
}

template <class T>
void RowsTiles(const MlaDecodeShape& sh, int queries, const float* q_abs, const float* q_pe, const float* const* rows,
               size_t offset, const int* const* keys, const int* n_keys, float* lat) {
  const int H = sh.heads, per = (H + T::kLanes - 1) / T::kLanes;
  const size_t L = static_cast<size_t>(sh.kv_lora), R = static_cast<size_t>(sh.rope);
  DefaultThreadPool().ParallelFor(static_cast<size_t>(queries) * per, [&](size_t t) {
    const size_t j = t / per;
    const int hq0 = static_cast<int>(t % per) * T::kLanes;
    const MlaDecodeShape one{H, sh.kv_lora, sh.rope, sh.scale, nullptr};
    T::Run(one, q_abs + j * H * L, q_pe + j * H * R, rows, offset, keys[j], n_keys[j], hq0,
           std::min(T::kLanes, H - hq0), lat + j * H * L);
  });
}

}  // namespace moeserve::kernels::cpu::flash
