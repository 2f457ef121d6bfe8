// The MXFP4 product over int8-quantised activations for many rows at once
// (AVX-512 F/BW/VNNI/VBMI; compiled with those flags only here).
//
// It computes exactly what mxfp4_matvec_avx512 (and its scalar reference,
// mxfp4_matvec_scalar) computes for every row: the same exact integer sums
// per block of 32, the same scale product and the same fp32 FMA per block in
// block order, so a row's result does not depend on the rows beside it. What
// changes is the order of the work: a line of codes is decoded once (two
// vpermb through the 16-entry table) and multiplied into MR rows, instead of
// being decoded again for every row, so the dot products, not the decoding,
// fill the vector pipes:
//   per block of 16 outputs x 32 elements and row: 8 * P vpdpbusd (P int8
//   parts of the activations) and 1 + 2 * P epilogue operations, plus 12
//   decoding operations shared by MR rows.
// Loop nest: chunks of kChunkBlocks blocks (codes of a group's chunk stay in
// L1 across the row tiles), panels of kPanelRows rows (their quantised
// activations stay in L2 across the groups), groups of 16 outputs, tiles of
// MR rows. Partial sums cross chunks through Y as fp32 (a store and reload
// change no bit).
#include <immintrin.h>

#include <cstring>

#include "avx512_mxfp4_scales.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kChunkBlocks = 32;  // 1024 elements: 8 KiB of a group's codes
constexpr size_t kPanelRows = 96;    // at 3 parts and 1024 elements, 288 KiB of activations

// Rows per register tile: P int accumulators and one fp32 sum per row, plus
// the decoded line, the table and temporaries, within 32 registers.
template <int P>
inline constexpr size_t kTileRows = P == 3 ? 6 : P == 2 ? 8 : 12;

inline size_t Min(size_t a, size_t b) { return a < b ? a : b; }

inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [t0, t0 + MR) of group g over blocks [b0, b1).
template <int P, size_t MR>
inline void Tile(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g, size_t t0, size_t b0,
                 size_t b1, __m512i lut, __mmask16 valid, const uint8_t* prefetch) {
  const size_t nb = w.in / 32;
  const int8_t* part[MR][P];
#pragma GCC unroll 12
  for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 3
    for (int p = 0; p < P; ++p) part[i][p] = x.part(t0 + i, p);
  __m512 y[MR];
#pragma GCC unroll 12
  for (size_t i = 0; i < MR; ++i)
    y[i] = b0 > 0 ? _mm512_maskz_loadu_ps(valid, Y + (t0 + i) * w.out + g * 16) : _mm512_setzero_ps();
  for (size_t b = b0; b < b1; ++b) {
    const uint8_t* codes = w.codes + (g * nb + b) * 256;
    if (prefetch != nullptr) {
#pragma GCC unroll 4
      for (size_t line = 0; line < 256; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + (b - b0) * 256 + line), _MM_HINT_T1);
    }
    // The last part (weight 1 in q) starts at -offset, so q comes out as
    // Mxfp4BlockRows's q - offset with one subtraction fewer per row.
    __m512i acc[MR][P];
#pragma GCC unroll 12
    for (size_t i = 0; i < MR; ++i) {
#pragma GCC unroll 3
      for (int p = 0; p + 1 < P; ++p) acc[i][p] = _mm512_setzero_si512();
      acc[i][P - 1] = _mm512_set1_epi32(-x.offset[(t0 + i) * nb + b]);
    }
#pragma GCC unroll 4
    for (size_t c = 0; c < 4; ++c) {
      const __m512i v = _mm512_load_si512(codes + c * 64);
      const __m512i w_lo = _mm512_permutexvar_epi8(v, lut);
      const __m512i w_hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
#pragma GCC unroll 12
      for (size_t i = 0; i < MR; ++i)
#pragma GCC unroll 3
        for (int p = 0; p < P; ++p) {
          const int8_t* a = part[i][p] + b * 32 + c * 8;
          acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], w_lo, Broadcast4(a));
          acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], w_hi, Broadcast4(a + 4));
        }
    }
    // As Mxfp4BlockRows (matmul_avx512.cpp) applies them: exact integers,
    // then one scale product and one FMA per row.
    const __m512 ws = E8M0Scales16(w.scales + (g * nb + b) * 16);
#pragma GCC unroll 12
    for (size_t i = 0; i < MR; ++i) {
      __m512i d = acc[i][P - 1];
#pragma GCC unroll 3
      for (int p = 0; p + 1 < P; ++p) d = _mm512_add_epi32(d, _mm512_slli_epi32(acc[i][p], Mxfp4ActShift(P, p)));
      const __m512 sc = _mm512_mul_ps(ws, _mm512_set1_ps(x.scale[(t0 + i) * nb + b]));
      y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, y[i]);
    }
  }
#pragma GCC unroll 12
  for (size_t i = 0; i < MR; ++i) _mm512_mask_storeu_ps(Y + (t0 + i) * w.out + g * 16, valid, y[i]);
}

// A tile of m < M rows (the first of its group when prefetch is set: a
// batch of fewer rows than a tile has no other).
template <int P, size_t M>
inline void TailTile(size_t m, const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g, size_t t0,
                     size_t b0, size_t b1, __m512i lut, __mmask16 valid, const uint8_t* prefetch) {
  if constexpr (M > 1) {
    if (m == M - 1) return Tile<P, M - 1>(w, x, Y, g, t0, b0, b1, lut, valid, prefetch);
    TailTile<P, M - 1>(m, w, x, Y, g, t0, b0, b1, lut, valid, prefetch);
  }
}

template <int P>
void GemmQ(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin, size_t g_end,
           size_t b_begin, size_t b_end) {
  constexpr size_t MR = kTileRows<P>;
  const size_t nb = w.in / 32;
  // As in mxfp4_matvec_avx512: the 16-entry table of 2 x E2M1 + 12 repeated
  // four times, so vpermb's two extra index bits need no masking.
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  for (size_t k0 = b_begin; k0 < b_end; k0 += kChunkBlocks) {
    const size_t k1 = Min(b_end, k0 + kChunkBlocks);
    for (size_t r0 = 0; r0 < x.n; r0 += kPanelRows) {
      const size_t r1 = Min(x.n, r0 + kPanelRows);
      for (size_t g = g_begin; g < g_end; ++g) {
        const __mmask16 valid = LaneMask(Min(16, w.out - g * 16));
        // The first tile of a group fetches the next group's chunk into L2.
        const uint8_t* next = g + 1 < g_end ? w.codes + ((g + 1) * nb + k0) * 256 : nullptr;
        size_t t = r0;
        for (; t + MR <= r1; t += MR) {
          Tile<P, MR>(w, x, Y, g, t, k0, k1, lut, valid, next);
          next = nullptr;
        }
        if (t < r1) TailTile<P, MR>(r1 - t, w, x, Y, g, t, k0, k1, lut, valid, next);
      }
    }
  }
}

}  // namespace

void mxfp4_matvec_rows_avx512(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                         size_t g_end, size_t b_begin, size_t b_end) {
  switch (x.nparts) {
    case 1: return GemmQ<1>(w, x, Y, g_begin, g_end, b_begin, b_end);
    case 2: return GemmQ<2>(w, x, Y, g_begin, g_end, b_begin, b_end);
    default: return GemmQ<3>(w, x, Y, g_begin, g_end, b_begin, b_end);
  }
}

}  // namespace moeserve::kernels::cpu
