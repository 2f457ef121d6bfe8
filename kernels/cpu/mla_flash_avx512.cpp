// Latent attention for many head-queries at once (causal prefill: the heads
// of several queries side by side; or a query of many heads), flash-style,
// with the head-queries as the vector lanes. Compiled with AVX-512 flags only
// here; reached only through mla_decode's AVX-512 entry (attention.cpp).
//
// Why lanes over head-queries: the per-row dot-product form (a score is a
// dot product of a query with a cached row, summed across lanes) must keep
// every query of the call near the FMA units for each key row, and once a
// block's queries outgrow the L1 cache their loads bound it; it also ends
// every dot product with a horizontal sum. Here a tile of 32 head-queries is
// packed once, transposed (Qt[w][lane]); a score micro-tile is 8 keys x 32
// lanes in 16 accumulators, each step two loads of Qt and eight broadcasts
// of key elements for 16 FMAs. Queries with their own key lists (DSA's
// sparse rows, mla_rows) run one query's heads per tile: 32 lanes, 16, or
// up to 8 (Fp32DotFewHeads below, whose products are recast to keep 512-bit
// FMAs busy). The softmax runs per lane over a block of 96 keys at a time (online: running
// maxima and sums, the output rescaled when a maximum rises), and the
// weighted latent sums are the same shape, the output held transposed
// (Ot[l][lane]): per key, two loads of the weights and eight broadcasts of
// the key's latent elements for 16 FMAs. The tile machinery is in
// mla_flash_tiles.hpp, shared with the BF16 dot-product form.
//
// A tile reads keys only up to the furthest its lanes see (causal prefill:
// the triangle, not the square), and masks scores only in blocks that reach
// past the nearest.
#include <cstring>

#include "mla_flash_tiles.hpp"

namespace moeserve::kernels::cpu {

using flash::Fp32Dot;
using flash::Tile;
using flash::Ymm;
using flash::Zmm;
using flash::kBlock;

namespace {

// Sparse rows of up to 8 heads (a query's heads as the lanes of a 256-bit
// tile): both products recast so that each load feeds full 512-bit FMAs.
// Scores with the 8 lanes doubled: lane 2h + e sums head h's products over
// the row elements w = e (mod 2), so one 64-bit broadcast of a key's two
// elements (w, w + 1) feeds a 512-bit FMA; the two partial sums of each head
// are added at the end. Weighted sums with latent columns in the lanes
// (Ot[h][Padded(L)]): per key and 32 columns, two loads of the key's latent
// row and eight broadcasts of the heads' weights for 16 FMAs, where lanes of
// heads took 16 broadcasts for 16 256-bit FMAs.
struct Fp32DotFewHeads {
  static constexpr int kLanes = 8, kKeyTile = 12;
  static int Padded(int L) { return (L + 31) / 32 * 32; }
  struct Work {
    float* Qt;  // Qt[ww][2h + e] = q_h[2 ww + e] (0 past W)
    Work(int W, int /*L*/) : Qt(AllocScratch(static_cast<size_t>(W + 1) / 2 * 2 * kLanes)) {}
    ~Work() { FreeScratch(Qt); }
  };
  template <class Q>
  static void PackQ(Work& ws, int W, Q q) {
    for (int w = 0; w < (W + 1) / 2 * 2; ++w)
      for (int h = 0; h < kLanes; ++h) ws.Qt[(w / 2) * 2 * kLanes + 2 * h + (w & 1)] = w < W ? q(h, w) : 0.0f;
  }

  template <int KN>
  [[gnu::noinline]] static void ScoreTile(const float* __restrict Qt, const float* const* k, int W, float* __restrict St) {
    __m512 a[KN];
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i) a[i] = _mm512_setzero_ps();
    const int whole = W / 2;
    for (int ww = 0; ww < whole; ++ww) {
      const __m512 q = _mm512_load_ps(Qt + ww * 2 * kLanes);
#pragma GCC unroll 12
      for (int i = 0; i < KN; ++i) {
        uint64_t pair;
        std::memcpy(&pair, k[i] + 2 * ww, 8);
        a[i] = _mm512_fmadd_ps(q, _mm512_castsi512_ps(_mm512_set1_epi64(static_cast<long long>(pair))), a[i]);
      }
    }
    if (W % 2 == 1) {  // the last element, its partner 0 (the row ends there)
      const __m512 q = _mm512_load_ps(Qt + whole * 2 * kLanes);
      for (int i = 0; i < KN; ++i) {
        uint32_t last;
        std::memcpy(&last, k[i] + W - 1, 4);
        a[i] = _mm512_fmadd_ps(q, _mm512_castsi512_ps(_mm512_set1_epi64(static_cast<long long>(last))), a[i]);
      }
    }
    // Lanes 2h and 2h + 1 summed, two keys to a 512-bit store (the softmax
    // reads them back 512 bits at a time).
    __m256i sc[KN];
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i)
      sc[i] = _mm512_cvtepi64_epi32(_mm512_castps_si512(_mm512_add_ps(a[i], _mm512_permute_ps(a[i], 0xB1))));
#pragma GCC unroll 6
    for (int i = 0; i + 1 < KN; i += 2)
      _mm512_store_si512(St + i * kLanes, _mm512_inserti64x4(_mm512_castsi256_si512(sc[i]), sc[i + 1], 1));
    if constexpr (KN % 2 == 1) _mm256_store_si256(reinterpret_cast<__m256i*>(St + (KN - 1) * kLanes), sc[KN - 1]);
  }
  template <int KN>
  static void ScoreRest(const float* Qt, const float* const* k, int n, int W, float* St) {
    if constexpr (KN > 0) {
      if (n == KN) return ScoreTile<KN>(Qt, k, W, St);
      return ScoreRest<KN - 1>(Qt, k, n, W, St);
    }
  }
  static void Score(Work& ws, const float* const* k, int n, int W, float* St) {
    int i = 0;
    for (; i + kKeyTile <= n; i += kKeyTile) ScoreTile<kKeyTile>(ws.Qt, k + i, W, St + i * kLanes);
    ScoreRest<kKeyTile - 1>(ws.Qt, k + i, n - i, W, St + i * kLanes);
  }

  static size_t OtFloats(int L) { return static_cast<size_t>(kLanes) * Padded(L); }
  static void WriteOut(const float* Ot, int j, int L, float r, float* out) {
    const float* row = Ot + static_cast<size_t>(j) * Padded(L);
    for (int c = 0; c < L; ++c) out[c] = row[c] * r;
  }
  // Ot[h][l0, l0 + 32) = alpha[h] Ot[h][..] + sum_i P[i][h] v_i[l0, l0 + 32).
  [[gnu::noinline]] static void WeightedTile(const float* __restrict P, const float* const* v, int n, int l0, int L,
                                             const float* alpha, float* __restrict Ot) {
    const int Lp = Padded(L);
    const __mmask16 m0 = LaneMask16(L - l0), m1 = LaneMask16(L - l0 - 16);
    __m512 a[kLanes][2];
#pragma GCC unroll 8
    for (int h = 0; h < kLanes; ++h) {
      const __m512 s = _mm512_set1_ps(alpha[h]);
      a[h][0] = _mm512_mul_ps(s, _mm512_load_ps(Ot + h * Lp + l0));
      a[h][1] = _mm512_mul_ps(s, _mm512_load_ps(Ot + h * Lp + l0 + 16));
    }
    for (int i = 0; i < n; ++i) {
      const __m512 x0 = _mm512_maskz_loadu_ps(m0, v[i] + l0), x1 = _mm512_maskz_loadu_ps(m1, v[i] + l0 + 16);
#pragma GCC unroll 8
      for (int h = 0; h < kLanes; ++h) {
        const __m512 p = _mm512_set1_ps(P[i * kLanes + h]);
        a[h][0] = _mm512_fmadd_ps(p, x0, a[h][0]);
        a[h][1] = _mm512_fmadd_ps(p, x1, a[h][1]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < kLanes; ++h) {
      _mm512_store_ps(Ot + h * Lp + l0, a[h][0]);
      _mm512_store_ps(Ot + h * Lp + l0 + 16, a[h][1]);
    }
  }
  static void Weighted(Work&, const float* P, const float* const* v, int n, int L, const __m256* alpha, float* Ot) {
    alignas(32) float al[kLanes];
    _mm256_store_ps(al, alpha[0]);
    for (int l0 = 0; l0 < L; l0 += 32) WeightedTile(P, v, n, l0, L, al, Ot);
  }
  // The first `valid` of 16 lanes (none below 1, all from 16).
  static __mmask16 LaneMask16(int valid) {
    return valid >= 16 ? __mmask16(0xFFFF) : valid <= 0 ? __mmask16(0) : __mmask16((1u << valid) - 1u);
  }
};

}  // namespace

void mla_flash_avx512(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                      size_t offset, const int* keys, int n_keys, float* lat) {
  flash::DecodeTiles<Tile<Zmm, 2, Fp32Dot<Zmm, 2>>>(sh, q_abs, q_pe, rows, offset, keys, n_keys, lat);
}

void mla_rows_flash_avx512(const MlaDecodeShape& sh, int queries, const float* q_abs, const float* q_pe,
                           const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                           float* lat) {
  if (sh.heads <= 8)
    return flash::RowsTiles<Tile<Ymm, 1, Fp32DotFewHeads>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  if (sh.heads <= 16)
    return flash::RowsTiles<Tile<Zmm, 1, Fp32Dot<Zmm, 1>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  return flash::RowsTiles<Tile<Zmm, 2, Fp32Dot<Zmm, 2>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
}

}  // namespace moeserve::kernels::cpu
