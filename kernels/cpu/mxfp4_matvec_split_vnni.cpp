// The AVX-512 VNNI building block of the split-activation MXFP4
// matrix-vector product (mxfp4_matvec_split.hpp). Built with AVX-512
// F/BW/VNNI/VBMI flags (kernels/CMakeLists.txt) and reached only through
// Mxfp4SplitVariants(), which offers it only when the CPU has them.
#include <immintrin.h>

#include "avx512_mxfp4_scales.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// One block (16 rows x 32 elements) of one group: y += scales * exact sums.
// P int8 parts of the activations: 2 * P vpdpbusd per 64-byte line.
template <int P>
inline __m512 BlockRows(const uint8_t* codes, const uint8_t* scales16, const int8_t* hi, const int8_t* lo,
                        int32_t offset, float act_scale, __m512 y, __m512i lut) {
#pragma GCC unroll 4
  for (size_t line = 0; line < 256; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(codes + kMxfp4PrefetchBytes + line), _MM_HINT_T1);
  // Separate accumulators for low- and high-nibble elements halve the
  // dependency chains.
  __m512i h0 = _mm512_setzero_si512(), h1 = h0, l0 = h0, l1 = h0;
#pragma GCC unroll 4
  for (size_t c = 0; c < 4; ++c) {
    const __m512i v = _mm512_load_si512(codes + c * 64);
    const __m512i w_lo = _mm512_permutexvar_epi8(v, lut);
    const __m512i w_hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
    h0 = _mm512_dpbusd_epi32(h0, w_lo, _mm512_set1_epi32(Load4(hi + c * 8)));
    h1 = _mm512_dpbusd_epi32(h1, w_hi, _mm512_set1_epi32(Load4(hi + c * 8 + 4)));
    if constexpr (P == 2) {
      l0 = _mm512_dpbusd_epi32(l0, w_lo, _mm512_set1_epi32(Load4(lo + c * 8)));
      l1 = _mm512_dpbusd_epi32(l1, w_hi, _mm512_set1_epi32(Load4(lo + c * 8 + 4)));
    }
  }
  __m512i q = _mm512_add_epi32(h0, h1);
  if constexpr (P == 2) q = _mm512_add_epi32(_mm512_slli_epi32(q, 8), _mm512_add_epi32(l0, l1));
  const __m512i d = _mm512_sub_epi32(q, _mm512_set1_epi32(offset));
  const __m512 sc = _mm512_mul_ps(E8M0Scales16(scales16), _mm512_set1_ps(act_scale));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, y);
}

// Groups gs[0..S) side by side (S memory streams keep more misses in
// flight than one; each group's sums are unchanged).
template <int P, int S>
inline void Groups(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y, const size_t* gs,
                   __m512i lut) {
  const size_t nb = w.in / 32;
  const int8_t* hi = x.part(0);
  const int8_t* lo = P == 2 ? x.part(1) : hi;
  __m512 acc[S];
#pragma GCC unroll 4
  for (int i = 0; i < S; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
#pragma GCC unroll 4
    for (int i = 0; i < S; ++i)
      acc[i] = BlockRows<P>(w.codes + (gs[i] * nb + b) * 256, w.scales + (gs[i] * nb + b) * 16, hi + b * 32,
                            lo + b * 32, x.offset[b], x.scale[b], acc[i], lut);
  }
#pragma GCC unroll 4
  for (int i = 0; i < S; ++i) {
    const size_t rows = w.out - gs[i] * 16;
    _mm512_mask_storeu_ps(y + gs[i] * 16, LaneMask(rows < 16 ? rows : 16), acc[i]);
  }
}

template <int P>
void MatVec(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y, size_t g_begin, size_t g_end) {
  // Twice the E2M1 value plus 12, the 16 entries repeated: vpermb reads 6
  // index bits, and bits 4-5 then select an identical copy, so neither
  // nibble needs masking.
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const size_t q = (g_end - g_begin) / 4;
  for (size_t g = g_begin; g < g_begin + q; ++g) {
    const size_t gs[4] = {g, g + q, g + 2 * q, g + 3 * q};
    Groups<P, 4>(w, x, y, gs, lut);
  }
  for (size_t g = g_begin + 4 * q; g < g_end; ++g) Groups<P, 1>(w, x, y, &g, lut);
}

}  // namespace

void mxfp4_split_matvec_avx512vnni(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y, size_t g_begin,
                                   size_t g_end) {
  if (x.parts == 1) return MatVec<1>(w, x, y, g_begin, g_end);
  MatVec<2>(w, x, y, g_begin, g_end);
}

}  // namespace moeserve::kernels::cpu
