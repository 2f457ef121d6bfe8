// The AVX2 row kernel of the FP8 block-scaled products (fp8_block.hpp).
// Built with -mavx2 -mfma (kernels/CMakeLists.txt) and reached only through
// the avx2 set; it calls no inline library templates (nor fp8_block.hpp's
// inline members), so no AVX2 code can leak into a shared COMDAT.
//
// The same exact bit-manipulation decode as the AVX-512 kernel, eight codes
// at a time (normal: fields shifted into fp32's, bias 7 -> 127; subnormal:
// m * 2^-9 from the integer; S.1111.111: NaN; sign to bit 31), the weight
// times its block's scale in fp32, then FMAs for up to 4 activation rows
// with two accumulators each. A ragged block's last 1-7 columns go through
// the scalar table.
#include <immintrin.h>

#include "cpu/variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kBlock = 128;  // kFp8BlockSize
constexpr size_t kTile = 4;
constexpr size_t kPrefetchAhead = 4096;  // as the AVX-512 kernel: codes into L2, 4 KiB ahead

inline __m256 DecodeE4m3(const uint8_t* p) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i em = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  const __m256 normal =
      _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0f / 512.0f));
  __m256 mag = _mm256_blendv_ps(normal, subnormal,
                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em)));
  mag = _mm256_blendv_ps(mag, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7F))));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(mag), sign));
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <size_t R>
inline void RowTile(const uint8_t* codes, const float* srow, size_t cols, size_t rows, const float* X, float* Y,
                    size_t r, const float* table) {
  __m256 acc0[R], acc1[R];
  float tail[R];
  for (size_t j = 0; j < R; ++j) {
    acc0[j] = _mm256_setzero_ps();
    acc1[j] = _mm256_setzero_ps();
    tail[j] = 0.0f;
  }
  for (size_t k0 = 0, b = 0; k0 < cols; k0 += kBlock, ++b) {
    const float scale = srow[b];
    const __m256 s = _mm256_set1_ps(scale);
    const size_t k1 = k0 + kBlock < cols ? k0 + kBlock : cols;
    size_t k = k0;
    for (; k + 16 <= k1; k += 16) {
      if ((k & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(codes + k + kPrefetchAhead), _MM_HINT_T1);
      const __m256 w0 = _mm256_mul_ps(DecodeE4m3(codes + k), s);
      const __m256 w1 = _mm256_mul_ps(DecodeE4m3(codes + k + 8), s);
      for (size_t j = 0; j < R; ++j) {
        acc0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(X + j * cols + k), acc0[j]);
        acc1[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(X + j * cols + k + 8), acc1[j]);
      }
    }
    if (k + 8 <= k1) {
      const __m256 w = _mm256_mul_ps(DecodeE4m3(codes + k), s);
      for (size_t j = 0; j < R; ++j) acc0[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(X + j * cols + k), acc0[j]);
      k += 8;
    }
    for (; k < k1; ++k) {
      const float weight = table[codes[k]] * scale;
      for (size_t j = 0; j < R; ++j) tail[j] += weight * X[j * cols + k];
    }
  }
  for (size_t j = 0; j < R; ++j) Y[j * rows + r] = HorizontalSum(_mm256_add_ps(acc0[j], acc1[j])) + tail[j];
}

}  // namespace

void fp8_block_rows_avx2(const Fp8BlockView& w, const float* X, size_t n, float* Y, size_t r_begin,
                         size_t r_end) {
  const size_t cols = w.cols, rows = w.rows;
  const size_t scale_cols = (cols + kBlock - 1) / kBlock;
  const float* table = Fp8E4m3Table();
  for (size_t r = r_begin; r < r_end; ++r) {
    const uint8_t* codes = w.codes + r * cols;
    const float* srow = w.scales + (r / kBlock) * scale_cols;
    size_t i = 0;
    for (; i + kTile <= n; i += kTile) RowTile<kTile>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r, table);
    switch (n - i) {
      case 3: RowTile<3>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r, table); break;
      case 2: RowTile<2>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r, table); break;
      case 1: RowTile<1>(codes, srow, cols, rows, X + i * cols, Y + i * rows, r, table); break;
      default: break;
    }
  }
}

}  // namespace moeserve::kernels::cpu
