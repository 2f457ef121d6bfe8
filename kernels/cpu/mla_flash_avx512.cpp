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
// tile), HN (8 or 4) of them computed: both products recast so that each
// load feeds full 512-bit FMAs. Scores with the lanes multiplied by
// M = 16 / HN: lane M h + e sums head h's products over the row elements
// w = e (mod M), so one broadcast of a key's M elements (64 or 128 bits)
// feeds a 512-bit FMA; each head's M partial sums are added at the end.
// Weighted sums with latent columns in the lanes (Ot[h][Padded(L)]): a tile
// is HN heads by 256 / HN columns, per key 256 / HN / 16 loads of the key's
// latent row and HN broadcasts of the heads' weights for 16 FMAs, where
// lanes of heads took 16 broadcasts for 16 256-bit FMAs.
template <int HN>
struct Fp32DotFewHeads {
  static_assert(HN == 8 || HN == 4);
  static constexpr int kLanes = 8, kKeyTile = 12, M = 16 / HN;
  static constexpr int kVectors = 16 / HN, kColumns = 16 * kVectors;  // per weighted-sum tile
  static int Padded(int L) { return (L + kColumns - 1) / kColumns * kColumns; }
  static int Groups(int W) { return (W + M - 1) / M; }
  struct Work {
    float* Qt;  // Qt[pp][M h + e] = q_h[M pp + e] (0 past W)
    Work(int W, int /*L*/) : Qt(AllocScratch(static_cast<size_t>(Groups(W)) * 16)) {}
    ~Work() { FreeScratch(Qt); }
  };
  template <class Q>
  static void PackQ(Work& ws, int W, Q q) {
    std::fill(ws.Qt, ws.Qt + static_cast<size_t>(Groups(W)) * 16, 0.0f);
    for (int w = 0; w < W; ++w)
      for (int h = 0; h < HN; ++h) ws.Qt[(w / M) * 16 + M * h + w % M] = q(h, w);
  }

  // A key's elements [M pp, M pp + M) in every group of M lanes; past the
  // row's end (the last group of an uneven row), zeros.
  static __m512 Broadcast(const float* k, int pp, int W) {
    const int at = M * pp, rest = W - at;
    if constexpr (M == 2) {
      uint64_t pair = 0;
      std::memcpy(&pair, k + at, rest >= 2 ? 8 : 4);
      return _mm512_castsi512_ps(_mm512_set1_epi64(static_cast<long long>(pair)));
    } else {
      return _mm512_broadcast_f32x4(rest >= 4 ? _mm_loadu_ps(k + at) : _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << rest) - 1), k + at));
    }
  }

  template <int KN>
  [[gnu::noinline]] static void ScoreTile(const float* __restrict Qt, const float* const* k, int W, float* __restrict St) {
    __m512 a[KN];
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i) a[i] = _mm512_setzero_ps();
    const int whole = W / M;
    for (int pp = 0; pp < whole; ++pp) {
      const __m512 q = _mm512_load_ps(Qt + pp * 16);
#pragma GCC unroll 12
      for (int i = 0; i < KN; ++i) {
        __m512 kv;
        if constexpr (M == 2) {
          uint64_t pair;
          std::memcpy(&pair, k[i] + 2 * pp, 8);
          kv = _mm512_castsi512_ps(_mm512_set1_epi64(static_cast<long long>(pair)));
        } else {
          kv = _mm512_broadcast_f32x4(_mm_loadu_ps(k[i] + 4 * pp));
        }
        a[i] = _mm512_fmadd_ps(q, kv, a[i]);
      }
    }
    if (whole < Groups(W)) {  // the row's last elements, fewer than M
      const __m512 q = _mm512_load_ps(Qt + whole * 16);
      for (int i = 0; i < KN; ++i) a[i] = _mm512_fmadd_ps(q, Broadcast(k[i], whole, W), a[i]);
    }
    flash::StoreGroupedScores<KN, M>(a, St);
  }
  static void Score(Work& ws, const float* const* k, int n, int W, float* St) {
    flash::KeyTiles<kKeyTile>(n, [&](auto kn, int i) { ScoreTile<decltype(kn)::value>(ws.Qt, k + i, W, St + i * kLanes); });
  }

  static size_t OtFloats(int L) { return static_cast<size_t>(kLanes) * Padded(L); }
  static void WriteOut(const float* Ot, int j, int L, float r, float* out) {
    const float* row = Ot + static_cast<size_t>(j) * Padded(L);
    for (int c = 0; c < L; ++c) out[c] = row[c] * r;
  }
  // Ot[h][l0, l0 + kColumns) = alpha[h] Ot[h][..] + sum_i P[i][h] v_i[l0, ..), h < HN.
  [[gnu::noinline]] static void WeightedTile(const float* __restrict P, const float* const* v, int n, int l0, int L,
                                             const float* alpha, float* __restrict Ot) {
    const int Lp = Padded(L);
    __mmask16 m[kVectors];
    for (int c = 0; c < kVectors; ++c) m[c] = LaneMask16(L - l0 - 16 * c);
    __m512 a[HN][kVectors];
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h) {
      const __m512 s = _mm512_set1_ps(alpha[h]);
      for (int c = 0; c < kVectors; ++c) a[h][c] = _mm512_mul_ps(s, _mm512_load_ps(Ot + h * Lp + l0 + 16 * c));
    }
    for (int i = 0; i < n; ++i) {
      __m512 x[kVectors];
      for (int c = 0; c < kVectors; ++c) x[c] = _mm512_maskz_loadu_ps(m[c], v[i] + l0 + 16 * c);
#pragma GCC unroll 8
      for (int h = 0; h < HN; ++h) {
        const __m512 p = _mm512_set1_ps(P[i * kLanes + h]);
        for (int c = 0; c < kVectors; ++c) a[h][c] = _mm512_fmadd_ps(p, x[c], a[h][c]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < HN; ++h)
      for (int c = 0; c < kVectors; ++c) _mm512_store_ps(Ot + h * Lp + l0 + 16 * c, a[h][c]);
  }
  static void Weighted(Work&, const float* P, const float* const* v, int n, int L, const __m256* alpha, float* Ot) {
    alignas(32) float al[kLanes];
    _mm256_store_ps(al, alpha[0]);
    for (int l0 = 0; l0 < L; l0 += kColumns) WeightedTile(P, v, n, l0, L, al, Ot);
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
  if (sh.heads <= 4)
    return flash::RowsTiles<Tile<Ymm, 1, Fp32DotFewHeads<4>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  if (sh.heads <= 8)
    return flash::RowsTiles<Tile<Ymm, 1, Fp32DotFewHeads<8>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  if (sh.heads <= 16)
    return flash::RowsTiles<Tile<Zmm, 1, Fp32Dot<Zmm, 1>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  return flash::RowsTiles<Tile<Zmm, 2, Fp32Dot<Zmm, 2>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
}

}  // namespace moeserve::kernels::cpu
