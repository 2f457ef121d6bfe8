// The BF16 dot-product GEMM (AVX-512 BF16, vdpbf16ps), compiled with those
// flags only here; reached only through the bf16act families' AVX-512
// entries, which call it only when the CPU reports avx512_bf16
// (bf16_activations.cpp).
//
// vdpbf16ps multiplies pairs of BF16 values and adds both products to one
// fp32 lane: twice the products of an fp32 FMA per instruction. The weights
// are exact in BF16 (MXFP4's E2M1 values times a power of two; BF16
// weights as stored); the activations are rounded to BF16 once per call.
//
// Layout: a panel holds 32 output columns x kc/2 k-pairs, Wp[p * 32 + c] =
// the 32-bit pair (W[c][2p] low, W[c][2p + 1] high); the activations are
// BF16 rows, so a pair of one row is one broadcast 32-bit load. A
// 12-row x 32-column register tile (24 accumulators) runs over the pairs.
#include <immintrin.h>

#include <cstring>

#include "avx512_mxfp4_scales.hpp"
#include "avx512_transpose.hpp"
#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kNR = 32;    // columns per panel
constexpr size_t kMR = 12;    // activation rows per register tile
constexpr size_t kKP = 1024;  // k-pairs per panel (2048 k: 128 KiB, in L2, as the fp32 GEMM's)

inline size_t Min(size_t a, size_t b) { return a < b ? a : b; }
template <size_t MR>
inline void Micro(const uint32_t* __restrict Wp, const uint16_t* __restrict X, size_t ldx, size_t kp, float* Y,
                  size_t ldy, __mmask16 m0, __mmask16 m1, bool first) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (size_t i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  if (!first) PrefetchTile<MR>(Y, ldy);
  for (size_t p = 0; p < kp; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_load_si512(Wp + p * kNR);
    const __m512bh w1 = (__m512bh)_mm512_load_si512(Wp + p * kNR + 16);
#pragma GCC unroll 16
    for (size_t i = 0; i < MR; ++i) {
      uint32_t pair;
      std::memcpy(&pair, X + i * ldx + 2 * p, 4);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      c0[i] = _mm512_dpbf16_ps(c0[i], x, w0);
      c1[i] = _mm512_dpbf16_ps(c1[i], x, w1);
    }
  }
#pragma GCC unroll 16
  for (size_t i = 0; i < MR; ++i) {
    float* y = Y + i * ldy;
    if (!first) {
      c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, y));
      c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, y + 16));
    }
    _mm512_mask_storeu_ps(y, m0, c0[i]);
    _mm512_mask_storeu_ps(y + 16, m1, c1[i]);
  }
}

template <size_t MR>
inline void Tail(size_t mr, const uint32_t* Wp, const uint16_t* X, size_t ldx, size_t kp, float* Y, size_t ldy,
                 __mmask16 m0, __mmask16 m1, bool first) {
  if constexpr (MR > 0) {
    if (mr == MR) return Micro<MR>(Wp, X, ldx, kp, Y, ldy, m0, m1, first);
    return Tail<MR - 1>(mr, Wp, X, ldx, kp, Y, ldy, m0, m1, first);
  }
}

// Y[:, o_begin:o_end] = X W^T; pack(Wp, o0, nr, p0, kp) writes the panel of
// columns [o0, o0 + nr) and pairs [p0, p0 + kp) (columns past nr zero).
template <class Pack>
void Gemm(Pack pack, size_t out, size_t pairs, const uint16_t* X, size_t ldx, size_t n, float* Y, size_t o_begin,
          size_t o_end) {
  uint32_t* Wp = reinterpret_cast<uint32_t*>(AllocScratch(Min(kKP, pairs) * kNR));
  for (size_t p0 = 0; p0 < pairs; p0 += kKP) {
    const size_t kp = Min(kKP, pairs - p0);
    for (size_t o0 = o_begin; o0 < o_end; o0 += kNR) {
      const size_t nr = Min(kNR, o_end - o0);
      pack(Wp, o0, nr, p0, kp);
      const __mmask16 m0 = LaneMask(nr), m1 = nr > 16 ? LaneMask(nr - 16) : __mmask16(0);
      const uint16_t* x = X + 2 * p0;
      size_t t = 0;
      for (; t + kMR <= n; t += kMR) Micro<kMR>(Wp, x + t * ldx, ldx, kp, Y + t * out + o0, out, m0, m1, p0 == 0);
      if (t < n) Tail<kMR - 1>(n - t, Wp, x + t * ldx, ldx, kp, Y + t * out + o0, out, m0, m1, p0 == 0);
    }
  }
  FreeScratch(reinterpret_cast<float*>(Wp));
}

// One 16-row group's pairs [p0, p0 + kp) into 16 columns of the panel
// (stride kNR), a block at a time (DecodeBlockPairs).
inline void DecodeGroupPairs(const Mxfp4PackedView& w, size_t g, size_t p0, size_t kp, uint32_t* dst) {
  const size_t nb = w.in / 32;
  const __m512 lut = _mm512_loadu_ps(kE2M1Values);
  for (size_t b = p0 / 16; b < (p0 + kp) / 16; ++b) {
    __m512i pairs[16];
    DecodeBlockPairs(w.codes + (g * nb + b) * 256, w.scales + (g * nb + b) * 16, lut, pairs);
    uint32_t* d = dst + (b * 16 - p0) * kNR;
#pragma GCC unroll 16
    for (size_t p = 0; p < 16; ++p) _mm512_storeu_si512(d + p * kNR, pairs[p]);
  }
}

}  // namespace

void round_bf16_rows_avx512bf16(const float* X, size_t n, size_t in, uint16_t* Xb, size_t ldx) {
  const size_t full = in / 32 * 32;
  for (size_t t = 0; t < n; ++t) {
    const float* x = X + t * in;
    uint16_t* d = Xb + t * ldx;
    size_t k = 0;
    for (; k < full; k += 32)
      _mm512_storeu_si512(d + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k)));
    if (k < in) {
      const size_t rest = in - k;
      const __m512 a = _mm512_maskz_loadu_ps(LaneMask(rest), x + k);
      const __m512 b = _mm512_maskz_loadu_ps(rest > 16 ? LaneMask(rest - 16) : __mmask16(0), x + k + 16);
      _mm512_storeu_si512(d + k, (__m512i)_mm512_cvtne2ps_pbh(b, a));
      k += 32;
    }
    for (; k < ldx; ++k) d[k] = 0;  // the pad pairs multiply zeros
  }
}

void mxfp4_gemm_bf16dot(const Mxfp4PackedView& w, const uint16_t* Xb, size_t ldx, size_t n, float* Y, size_t o_begin,
                        size_t o_end) {
  auto pack = [&](uint32_t* Wp, size_t o0, size_t nr, size_t p0, size_t kp) {
    if (o0 % kMxfp4PackRows == 0) {
      for (size_t half = 0; half < 2; ++half) {
        const size_t g = o0 / kMxfp4PackRows + half;
        if (half * 16 < nr) {
          DecodeGroupPairs(w, g, p0, kp, Wp + half * 16);
        } else {
          for (size_t p = 0; p < kp; ++p) _mm512_storeu_si512(Wp + p * kNR + half * 16, _mm512_setzero_si512());
        }
      }
      return;
    }
    // A range not on a group boundary: row by row (exactly the same values).
    float* row = AllocScratch(2 * kp);
    for (size_t c = 0; c < kNR; ++c) {
      if (c < nr) DecodePackedRow(w, o0 + c, 2 * p0 / 32, 2 * kp / 32, row, 1);
      for (size_t p = 0; p < kp; ++p) {
        uint32_t e = 0, o = 0;
        if (c < nr) {
          std::memcpy(&e, row + 2 * p, 4);
          std::memcpy(&o, row + 2 * p + 1, 4);
        }
        Wp[p * kNR + c] = (e >> 16) | (o & 0xFFFF0000u);
      }
    }
    FreeScratch(row);
  };
  Gemm(pack, w.out, w.in / 2, Xb, ldx, n, Y, o_begin, o_end);
}

void bf16_gemm_bf16dot(const uint16_t* W, size_t out, size_t in, const uint16_t* Xb, size_t ldx, size_t n, float* Y,
                       size_t o_begin, size_t o_end) {
  const size_t pairs = (in + 1) / 2;
  // The panel is the weights' pairs transposed: 16 columns by 16 pairs at a
  // time in registers (a row's 16 pairs are one 64-byte load), the rest
  // (a partial panel, the last pairs, odd `in`'s lone last element) one by one.
  auto pack = [&](uint32_t* Wp, size_t o0, size_t nr, size_t p0, size_t kp) {
    const size_t whole = Min(p0 + kp, in / 2);  // pairs [p0, whole) have both elements
    for (size_t c0 = 0; c0 < kNR; c0 += 16) {
      size_t p = p0;
      if (c0 + 16 <= nr)
        for (; p + 16 <= whole; p += 16) {
          __m512i r[16];
          for (size_t i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(W + (o0 + c0 + i) * in + 2 * p);
          Transpose16(r);
          for (size_t j = 0; j < 16; ++j) _mm512_storeu_si512(Wp + (p - p0 + j) * kNR + c0, r[j]);
        }
      for (size_t c = c0; c < c0 + 16; ++c) {
        const uint16_t* row = W + (o0 + c) * in;
        for (size_t q = p; q < p0 + kp; ++q) {
          uint32_t v = 0;
          if (c < nr && q < whole) std::memcpy(&v, row + 2 * q, 4);
          else if (c < nr) v = row[2 * q];  // odd in: the last element, its partner zero
          Wp[(q - p0) * kNR + c] = v;
        }
      }
    }
  };
  Gemm(pack, out, pairs, Xb, ldx, n, Y, o_begin, o_end);
}

}  // namespace moeserve::kernels::cpu
