// AVX-512 pieces shared by the kernels that decode packed MXFP4 panels
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

}  // namespace moeserve::kernels::cpu
