// The AVX-512 helpers of the AMX products (amx_tiles.hpp): activations
// rounded and packed as B tiles, accumulator tiles written to Y transposed,
// and packed MXFP4 groups decoded to BF16 rows for the A tiles. Built with AVX-512 F/BW/VL/DQ and BF16 flags
// (kernels/CMakeLists.txt); called only where CpuHasAvx512Bf16 (the amx
// row requires it, and the model run asks). No library templates here: an
// inline one instantiated with these flags could be linked into code that
// runs on CPUs without them.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "avx512_mxfp4_scales.hpp"
#include "avx512_transpose.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
void amx_pack_activations_avx512bf16(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end,
                                     uint16_t* packed) {
  const size_t ksteps = (in + 31) / 32;
  for (size_t tb = tb_begin; tb < tb_end; ++tb)
    for (size_t ks = 0; ks < ksteps; ++ks) {
      const size_t k0 = ks * 32, rest = in - k0;
      const __mmask16 lo = LaneMask(rest), hi = rest > 16 ? LaneMask(rest - 16) : __mmask16(0);
      // Token j's 32 values as 16 BF16 pairs (dwords); the transpose makes
      // row r the pairs r of the 16 tokens.
      __m512i r[16];
      for (size_t j = 0; j < 16; ++j) {
        const size_t t = tb * 16 + j;
        if (t >= n) {
          r[j] = _mm512_setzero_si512();
          continue;
        }
        const float* x = X + t * in + k0;
        r[j] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x));
      }
      Transpose16(r);
      uint16_t* d = packed + (tb * ksteps + ks) * 512;
      for (size_t row = 0; row < 16; ++row) _mm512_storeu_si512(d + row * 32, r[row]);
    }
}

void amx_write_tile_transposed_avx512(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols) {
  __m512 r[16];
  for (size_t m = 0; m < 16; ++m) r[m] = _mm512_loadu_ps(tile + m * 16);
  Transpose16(r);  // r[t] holds token t's 16 outputs
  const __mmask16 mask = LaneMask(rows);
  for (size_t t = 0; t < cols; ++t) _mm512_mask_storeu_ps(Y + t * ldy, mask, r[t]);
}

void amx_decode_mxfp4_group_avx512bf16(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld) {
  const size_t nb = w.in / 32;
  const __m512 lut = _mm512_loadu_ps(kE2M1Values);
  for (size_t b = 0; b < nb; ++b) {
    // Lane r of pairs[p] is row r's pair p; transposed, pairs[r] is row
    // r's 32 elements of the block in order: one A tile row.
    __m512i pairs[16];
    DecodeBlockPairs(w.codes + (g * nb + b) * 256, w.scales + (g * nb + b) * 16, lut, pairs);
    Transpose16(pairs);
    for (size_t r = 0; r < 16; ++r) _mm512_storeu_si512(dst + r * ld + b * 32, pairs[r]);
  }
}

}  // namespace moeserve::kernels::cpu
