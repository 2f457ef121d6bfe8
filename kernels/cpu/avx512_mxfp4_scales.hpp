// AVX-512 pieces shared by the GEMM kernels that decode packed MXFP4 panels
// (matmul_avx512.cpp, matmul_bf16dot.cpp, amx_avx512.cpp). Include only from
// sources built with -mavx512f -mavx512bw.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace moeserve::kernels::cpu {

// A mask of the first `valid` of 16 lanes (all of them from 16 on).
inline __mmask16 LaneMask(size_t valid) {
  return valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1u);
}

// The 16 E8M0 scales at `scales` (one per row of a packed group) as floats:
// 2^(e - 127) built in the exponent field, and e = 0 as the denormal 2^-127.
inline __m512 E8M0Scales16(const uint8_t* scales) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                                   _mm512_set1_epi32(0x00400000)));
}

// One 64-byte line c of a packed group's block (32-bit lane r holds row r's
// elements 8c .. 8c + 7: low nibbles 8c + j, high nibbles 8c + 4 + j) as
// eight vectors of the 16 rows' values times their scales: lo[j] = element
// 8c + j, hi[j] = element 8c + 4 + j. vpermps reads only an index's low 4
// bits, so a shift selects each nibble.
inline void DecodeCodeLine(__m512i codes, __m512 lut, __m512 scales, __m512 lo[4], __m512 hi[4]) {
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    lo[j] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, 8 * j), lut), scales);
    hi[j] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, 8 * j + 4), lut), scales);
  }
}

// The even elements' BF16 in the low halves, the odd ones' in the high
// halves (values exact in BF16: the upper 16 bits of their fp32), as the
// BF16 pair instructions read them (vdpbf16ps, TDPBF16PS).
inline __m512i Bf16Pairs(__m512 even, __m512 odd) {
  return _mm512_mask_blend_epi16(0xAAAAAAAAu, _mm512_srli_epi32(_mm512_castps_si512(even), 16),
                                 _mm512_castps_si512(odd));
}

// A packed group's block (256 bytes of codes, 16 scales) as its 16 pairs:
// pairs[p] holds, in 32-bit lane r, row r's elements 2p (low half) and
// 2p + 1 (high half) in BF16, a line of codes at a time (DecodeCodeLine).
inline void DecodeBlockPairs(const uint8_t* codes, const uint8_t* scales, __m512 lut, __m512i pairs[16]) {
  const __m512 sc = E8M0Scales16(scales);
#pragma GCC unroll 4
  for (size_t c = 0; c < 4; ++c) {
    const __m512i v = _mm512_load_si512(codes + c * 64);
    __m512 lo[4], hi[4];
    DecodeCodeLine(v, lut, sc, lo, hi);
    // Pairs 4c .. 4c + 3: (8c, 8c+1), (8c+2, 8c+3), (8c+4, 8c+5), (8c+6, 8c+7).
    pairs[4 * c + 0] = Bf16Pairs(lo[0], lo[1]);
    pairs[4 * c + 1] = Bf16Pairs(lo[2], lo[3]);
    pairs[4 * c + 2] = Bf16Pairs(hi[0], hi[1]);
    pairs[4 * c + 3] = Bf16Pairs(hi[2], hi[3]);
  }
}

// Prefetches a GEMM tile's MR rows of 32 partial sums (Y, row stride ldy):
// read back after the k loop, they come from far caches or memory at large
// batches, so they are fetched while the FMAs run.
template <size_t MR>
inline void PrefetchTile(const float* Y, size_t ldy) {
#pragma GCC unroll 16
  for (size_t i = 0; i < MR; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(Y + i * ldy), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(Y + i * ldy + 16), _MM_HINT_T0);
  }
}

}  // namespace moeserve::kernels::cpu
