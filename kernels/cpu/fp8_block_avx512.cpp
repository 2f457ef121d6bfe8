// The AVX-512 row kernel of the FP8 block-scaled products (fp8_block.hpp).
// Built with the AVX-512 flags (kernels/CMakeLists.txt) and reached only
// through the avx512 set; like matmul_avx512.cpp it calls no inline library
// templates (nor fp8_block.hpp's inline members), so no AVX-512 code can
// leak into a shared COMDAT.
//
// Sixteen codes at a time are decoded by bit manipulation through FP16
// (ScaledWeights, below), exactly, and multiplied by their block's scale
// (one fp32 rounding, as the reference); each vector then feeds the FMAs of up to 8
// activation rows, each with two accumulators (alternate 16-column pieces)
// so a single row is not bound by the FMA latency. The codes 4 KiB ahead are
// prefetched into L2 (past a row's end: the next rows', harmless at the
// matrix's end).
#include <immintrin.h>

#include "cpu/variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kBlock = 128;  // kFp8BlockSize
constexpr size_t kTile = 8;  // activation rows per decoded vector (16 accumulators)
// Codes this far ahead go to L2 (prefetcht1): one sequential stream per
// thread does not keep enough misses in flight on its own. At 18432 x 7168
// on the loaded 2-core EPYC here, one thread read 3.7 GB/s with none, 4.8 at
// 1 KiB, 6.6 at 4 KiB, 6.2-6.4 at 8-16 KiB (in cache it computes 11.3).
constexpr size_t kPrefetchAhead = 4096;

// E4M3 and FP16 share the mantissa width's top and the exponent's layout:
// the code's 7 magnitude bits shifted into an FP16's bits 7..13 are the
// code's value times 2^-8 (bias 15 against 7), subnormals included (FP16
// subnormals, which vcvtph2ps widens exactly to normal fp32 values). So
// w = half(code) * (scale * 2^8) is E4M3(code) * scale rounded once, as the
// reference's, while scale * 2^8 is exact (|scale| < 2^119; larger blocks
// take the table). NaN codes (S.1111.111, which as FP16 would be 1.875 *
// 2^-8) are set to NaN by mask.
inline __m512 ScaledWeights(__m128i codes, __m512 scale256) {
  __m256i h = _mm256_cvtepu8_epi16(codes);                        // 16 x u16
  h = _mm256_srai_epi16(_mm256_slli_epi16(h, 8), 1);                // sign at 15 (and 14), magnitude at 7..13
  h = _mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0xBFFF)));  // FP16 bits of the value * 2^-8
  const __m512 w = _mm512_mul_ps(_mm512_cvtph_ps(h), scale256);
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(codes, _mm_set1_epi8(static_cast<char>(0x80))),
                                            _mm_set1_epi8(static_cast<char>(0xFF)));
  return _mm512_mask_mov_ps(w, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

// Output row r for R activation rows (X, Y already offset to the first).
template <size_t R>
inline void RowTile(const uint8_t* codes, const float* srow, size_t cols, size_t rows, const float* X, float* Y,
                    size_t r) {
  __m512 acc0[R], acc1[R];
  float table_sum[R];  // blocks whose scale times 2^8 would overflow
  for (size_t j = 0; j < R; ++j) {
    acc0[j] = _mm512_setzero_ps();
    acc1[j] = _mm512_setzero_ps();
    table_sum[j] = 0.0f;
  }
  for (size_t k0 = 0, b = 0; k0 < cols; k0 += kBlock, ++b) {
    const float scale = srow[b];
    const size_t k1 = k0 + kBlock < cols ? k0 + kBlock : cols;
    if (__builtin_isfinite(scale) && !(__builtin_fabsf(scale) < 0x1p119f)) {
      const float* table = Fp8E4m3Table();
      for (size_t k = k0; k < k1; ++k) {
        const float weight = table[codes[k]] * scale;
        for (size_t j = 0; j < R; ++j) table_sum[j] += weight * X[j * cols + k];
      }
      continue;
    }
    const __m512 s = _mm512_set1_ps(scale * 256.0f);
    size_t k = k0;
    for (; k + 32 <= k1; k += 32) {
      if ((k & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(codes + k + kPrefetchAhead), _MM_HINT_T1);
      const __m512 w0 = ScaledWeights(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k)), s);
      const __m512 w1 = ScaledWeights(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k + 16)), s);
      for (size_t j = 0; j < R; ++j) {
        acc0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(X + j * cols + k), acc0[j]);
        acc1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(X + j * cols + k + 16), acc1[j]);
      }
    }
    for (; k < k1; k += 16) {  // a ragged block's last 1-31 columns: masked loads read zeros past k1
      const size_t left = k1 - k;
      const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
      const __m512 w = ScaledWeights(_mm_maskz_loadu_epi8(m, codes + k), s);
      for (size_t j = 0; j < R; ++j) acc0[j] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, X + j * cols + k), acc0[j]);
    }
  }
  for (size_t j = 0; j < R; ++j) Y[j * rows + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) + table_sum[j];
}

}  // namespace

void fp8_block_rows_avx512(const Fp8BlockView& w, const float* X, size_t n, float* Y, size_t r_begin,
                           size_t r_end) {
  const size_t cols = w.cols, rows = w.rows;
  const size_t scale_cols = (cols + kBlock - 1) / kBlock;
  for (size_t r = r_begin; r < r_end; ++r) {
    const uint8_t* codes = w.codes + r * cols;
    const float* srow = w.scales + (r / kBlock) * scale_cols;
    size_t i = 0;
    for (; i + kTile <= n; i += kTile) RowTile<kTile>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r);
    switch (n - i) {
      case 7: RowTile<7>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      case 6: RowTile<6>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      case 5: RowTile<5>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      case 4: RowTile<4>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      case 3: RowTile<3>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      case 2: RowTile<2>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      case 1: RowTile<1>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r); break;
      default: break;
    }
  }
}

}  // namespace moeserve::kernels::cpu
