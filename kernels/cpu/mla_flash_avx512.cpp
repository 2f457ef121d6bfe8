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
// for 8 heads 8 lanes in 256-bit vectors (12 keys per micro-tile there),
// which Zen 4 and others run at the same FMA rate as 512-bit ones. The
// softmax runs per lane over a block of 48 keys at a time (online: running
// maxima and sums, the output rescaled when a maximum rises), and the
// weighted latent sums are the same shape, the output held transposed
// (Ot[l][lane]): per key, two loads of the weights and eight broadcasts of
// the key's latent elements for 16 FMAs. The tile machinery is in
// mla_flash_tiles.hpp, shared with the BF16 dot-product form.
//
// A tile reads keys only up to the furthest its lanes see (causal prefill:
// the triangle, not the square), and masks scores only in blocks that reach
// past the nearest.
#include "mla_flash_tiles.hpp"

namespace moeserve::kernels::cpu {

using flash::Fp32Dot;
using flash::Tile;
using flash::Ymm;
using flash::Zmm;

void mla_flash_avx512(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                      size_t offset, const int* keys, int n_keys, float* lat) {
  flash::DecodeTiles<Tile<Zmm, 2, Fp32Dot<Zmm, 2>>>(sh, q_abs, q_pe, rows, offset, keys, n_keys, lat);
}

void mla_rows_flash_avx512(const MlaDecodeShape& sh, int queries, const float* q_abs, const float* q_pe,
                           const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                           float* lat) {
  if (sh.heads <= 8)
    return flash::RowsTiles<Tile<Ymm, 1, Fp32Dot<Ymm, 1>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  if (sh.heads <= 16)
    return flash::RowsTiles<Tile<Zmm, 1, Fp32Dot<Zmm, 1>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
  return flash::RowsTiles<Tile<Zmm, 2, Fp32Dot<Zmm, 2>>>(sh, queries, q_abs, q_pe, rows, offset, keys, n_keys, lat);
}

}  // namespace moeserve::kernels::cpu
