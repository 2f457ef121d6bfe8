// AVX-512 pieces shared by the GEMM kernels that decode packed MXFP4 panels
// (matmul_avx512.cpp, matmul_bf16dot.cpp). Include only from sources built
// with -mavx512f -mavx512bw.
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
