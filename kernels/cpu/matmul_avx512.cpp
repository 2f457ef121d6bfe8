// AVX-512 variants (F, BW, VL, DQ, VNNI, VBMI + FMA), compiled with those flags
// only here.
//
// MXFP4 matrix-vector: integer dot products over the packed layout (see
// mxfp4_matvec_avx512 below and mxfp4_packed.hpp).
// GEMM: weights are dequantised (or, for F32, transposed) into a k-major panel
// of 32 columns x 2048 k, then an 8-row x 32-column register tile accumulates
// broadcasts of X against the panel; panels are produced once per call.
#include <immintrin.h>

#include "avx512_mxfp4_scales.hpp"
#include "avx512_transpose.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kNR = 32;   // columns per packed strip (two vectors)
constexpr size_t kMR = 8;    // activation rows per register tile
// k per panel (multiple of 32). Long panels (256 KiB, in L2) mean few passes
// over Y: each pass re-reads partial sums that at batch 512 sit in L3 or
// memory, and the tile ends waiting for them. Measured at batch 512 here
// (interleaved runs, median): 169 / 170 GFLOP/s with 256 (L1-sized panels),
// 184 / 182 with 512, 191 / 186 with 1024, 204 / 198 with 2048
// (4096x14336 / 7168x2048; the last two in a faster window).
constexpr size_t kKC = kGemmPanelK;

inline size_t Min(size_t a, size_t b) { return a < b ? a : b; }

template <size_t MR>
inline void Micro(const float* __restrict Wp, const float* __restrict X, size_t ldx, size_t kc, float* Y, size_t ldy,
                  __mmask16 m0, __mmask16 m1, bool first) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (size_t i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  if (!first) PrefetchTile<MR>(Y, ldy);
  for (size_t k = 0; k < kc; ++k) {
    const __m512 w0 = _mm512_load_ps(Wp + k * kNR);
    const __m512 w1 = _mm512_load_ps(Wp + k * kNR + 16);
#pragma GCC unroll 16
    for (size_t i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(X[i * ldx + k]);
      c0[i] = _mm512_fmadd_ps(x, w0, c0[i]);
      c1[i] = _mm512_fmadd_ps(x, w1, c1[i]);
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

inline void MicroTail(size_t mr, const float* Wp, const float* X, size_t ldx, size_t kc, float* Y, size_t ldy,
                      __mmask16 m0, __mmask16 m1, bool first) {
  switch (mr) {
    case 1: return Micro<1>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    case 2: return Micro<2>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    case 3: return Micro<3>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    case 4: return Micro<4>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    case 5: return Micro<5>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    case 6: return Micro<6>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    case 7: return Micro<7>(Wp, X, ldx, kc, Y, ldy, m0, m1, first);
    default: return;
  }
}

// One k chunk [k0, k0 + kc) of Y[:, o_begin:o_end] = X W^T (the first chunk
// stores, the others add): Xp holds the chunk's n rows, kc floats each,
// contiguous; pack(Wp, o0, nr, k0, kc) produces the k-major panel
// Wp[k * 32 + c] (zero beyond nr columns). A Y element's sum does not depend
// on the column range or the strip it falls in.
template <class Pack>
inline void GemmChunk(Pack& pack, size_t out, const float* Xp, size_t n, size_t k0, size_t kc, float* Y,
                      size_t o_begin, size_t o_end, float* Wp) {
  for (size_t o0 = o_begin; o0 < o_end; o0 += kNR) {
    const size_t nr = Min(kNR, o_end - o0);
    pack(Wp, o0, nr, k0, kc);
    const __mmask16 m0 = LaneMask(nr), m1 = nr > 16 ? LaneMask(nr - 16) : __mmask16(0);
    size_t t = 0;
    for (; t + kMR <= n; t += kMR) Micro<kMR>(Wp, Xp + t * kc, kc, kc, Y + t * out + o0, out, m0, m1, k0 == 0);
    if (t < n) MicroTail(n - t, Wp, Xp + t * kc, kc, kc, Y + t * out + o0, out, m0, m1, k0 == 0);
  }
}

// Y[:, o_begin:o_end] = X W^T, chunk by chunk of kKC (GemmChunk).
template <class Pack>
void Gemm(Pack pack, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin, size_t o_end) {
  // Sized to the panel actually used: a short k (most expert and attention
  // projections) needs far less than a full panel.
  const size_t kc_max = Min(kKC, in);
  float* Wp = AllocScratch(kc_max * kNR);
  // The k-chunk of X, copied contiguous: X's own row stride can alias cache
  // sets (e.g. 14336 floats = 14 x 4 KiB) and defeat the caches.
  float* Xp = AllocScratch(n * kc_max);
  for (size_t k0 = 0; k0 < in; k0 += kKC) {
    const size_t kc = Min(kKC, in - k0);
    for (size_t t = 0; t < n; ++t)
      for (size_t k = 0; k < kc; ++k) Xp[t * kc + k] = X[t * in + k0 + k];
    GemmChunk(pack, out, Xp, n, k0, kc, Y, o_begin, o_end, Wp);
  }
  FreeScratch(Xp);
  FreeScratch(Wp);
}

inline float HSum(__m512 v) { return _mm512_reduce_add_ps(v); }

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// One block (16 rows x 32 elements) of one group: y += scales * exact sums,
// P int8 parts of the activations (parts[p] points at part p's block): 2 * P
// vpdpbusd per 64-byte line of codes.
template <int P>
inline __m512 Mxfp4BlockRows(const uint8_t* codes, const uint8_t* scales16, const int8_t* const* parts,
                             int32_t offset, float act_scale, __m512 y, __m512i lut) {
#pragma GCC unroll 4
  for (size_t line = 0; line < 256; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(codes + kMxfp4PrefetchBytes + line), _MM_HINT_T1);
  // Two accumulators per part (low- and high-nibble elements) halve the
  // dependency chains.
  __m512i acc0[P], acc1[P];
#pragma GCC unroll 3
  for (int p = 0; p < P; ++p) acc0[p] = acc1[p] = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (size_t c = 0; c < 4; ++c) {
    const __m512i v = _mm512_load_si512(codes + c * 64);
    const __m512i w_lo = _mm512_permutexvar_epi8(v, lut);
    const __m512i w_hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
#pragma GCC unroll 3
    for (int p = 0; p < P; ++p) {
      acc0[p] = _mm512_dpbusd_epi32(acc0[p], w_lo, _mm512_set1_epi32(Load4(parts[p] + c * 8)));
      acc1[p] = _mm512_dpbusd_epi32(acc1[p], w_hi, _mm512_set1_epi32(Load4(parts[p] + c * 8 + 4)));
    }
  }
  __m512i q = _mm512_setzero_si512();
#pragma GCC unroll 3
  for (int p = 0; p < P; ++p)
    q = _mm512_add_epi32(q, _mm512_slli_epi32(_mm512_add_epi32(acc0[p], acc1[p]), Mxfp4ActShift(P, p)));
  const __m512i d = _mm512_sub_epi32(q, _mm512_set1_epi32(offset));
  const __m512 sc = _mm512_mul_ps(E8M0Scales16(scales16), _mm512_set1_ps(act_scale));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, y);
}

// Groups gs[0..S) (S side by side), every activation row, blocks [b0, b1).
template <int P, int S>
inline void Mxfp4Groups(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, const size_t* gs, size_t b0,
                        size_t b1, __m512i lut) {
  const size_t nb = w.in / 32;
  __mmask16 valid[S];
#pragma GCC unroll 4
  for (int i = 0; i < S; ++i) valid[i] = LaneMask(Min(16, w.out - gs[i] * 16));
  for (size_t t = 0; t < x.n; ++t) {
    const int8_t* part[P];
#pragma GCC unroll 3
    for (int p = 0; p < P; ++p) part[p] = x.part(t, p);
    const float* as = x.scale + t * nb;
    const int32_t* off = x.offset + t * nb;
    __m512 y[S];
#pragma GCC unroll 4
    for (int i = 0; i < S; ++i)
      y[i] = b0 > 0 ? _mm512_maskz_loadu_ps(valid[i], Y + t * w.out + gs[i] * 16) : _mm512_setzero_ps();
    for (size_t b = b0; b < b1; ++b) {
      const int8_t* block[P];
#pragma GCC unroll 3
      for (int p = 0; p < P; ++p) block[p] = part[p] + b * 32;
#pragma GCC unroll 4
      for (int i = 0; i < S; ++i)
        y[i] = Mxfp4BlockRows<P>(w.codes + (gs[i] * nb + b) * 256, w.scales + (gs[i] * nb + b) * 16, block, off[b],
                                 as[b], y[i], lut);
    }
#pragma GCC unroll 4
    for (int i = 0; i < S; ++i) _mm512_mask_storeu_ps(Y + t * w.out + gs[i] * 16, valid[i], y[i]);
  }
}

template <int P>
void Mxfp4MatVec(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin, size_t g_end,
                 size_t b_begin, size_t b_end) {
  // vpermb reads 6 index bits; with the 16-entry table repeated 4 times,
  // bits 4-5 (the other nibble, or bits shifted in) select an identical copy,
  // so neither nibble needs masking.
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  // Four groups a quarter of the range apart go together: four memory
  // streams keep more misses in flight than one (each group's own sums are
  // unchanged, so results stay bit-identical to the scalar variant).
  const size_t q = (g_end - g_begin) / 4;
  for (size_t g = g_begin; g < g_begin + q; ++g) {
    const size_t gs[4] = {g, g + q, g + 2 * q, g + 3 * q};
    Mxfp4Groups<P, 4>(w, x, Y, gs, b_begin, b_end, lut);
  }
  for (size_t g = g_begin + 4 * q; g < g_end; ++g) Mxfp4Groups<P, 1>(w, x, Y, &g, b_begin, b_end, lut);
}

}  // namespace

// Per group of 16 rows and block of 32 elements: four 64-byte lines of codes
// (16 rows x 8 elements each) are split into low and high nibbles, mapped by
// a byte permute (VBMI) to twice the E2M1 value plus 12 (so unsigned), and
// multiplied against 4 broadcast activation bytes by vpdpbusd, once per int8
// part of the activation. The block's 16 row sums are then exact integers;
// one convert, one scale product and one FMA apply both scales to all 16 rows.
void mxfp4_matvec_avx512(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                         size_t g_end, size_t b_begin, size_t b_end) {
  switch (x.nparts) {
    case 1: return Mxfp4MatVec<1>(w, x, Y, g_begin, g_end, b_begin, b_end);
    case 2: return Mxfp4MatVec<2>(w, x, Y, g_begin, g_end, b_begin, b_end);
    default: return Mxfp4MatVec<3>(w, x, Y, g_begin, g_end, b_begin, b_end);
  }
}

// As mxfp4_quantize_scalar, 32 activations at a time; vcvtps2dq rounds to
// nearest even as the scalar code's 1.5 * 2^23 trick does.
void mxfp4_quantize_avx512(const float* X, size_t n, size_t in, int nparts, int8_t* parts, float* scale,
                           int32_t* offset) {
  const size_t nb = in / 32;
  const size_t np = static_cast<size_t>(nparts);
  const float qmax = static_cast<float>(Mxfp4ActQmax(nparts));
  for (size_t t = 0; t < n; ++t)
    for (size_t b = 0; b < nb; ++b) {
      const float* x = X + t * in + b * 32;
      int8_t* p0 = parts + t * np * in + b * 32;
      const __m512 a[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
      const bool nan = (_mm512_cmp_ps_mask(a[0], a[0], _CMP_UNORD_Q) | _mm512_cmp_ps_mask(a[1], a[1], _CMP_UNORD_Q)) != 0;
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a[0]), _mm512_abs_ps(a[1])));
      if (nan || !(amax <= 3.40282347e38f)) {
        for (size_t p = 0; p < np; ++p) __builtin_memset(p0 + p * in, 0, 32);
        scale[t * nb + b] = __builtin_nanf("");
        offset[t * nb + b] = 0;
        continue;
      }
      const __m512 inv = _mm512_set1_ps(amax > 0.0f ? qmax / amax : 0.0f);
      __m512i sum = _mm512_setzero_si512();
      for (int half = 0; half < 2; ++half) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(a[half], inv));
        __m512i ps[3];
        if (nparts == 3) {
          const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(8192)), 14);
          const __m512i r = _mm512_sub_epi32(q, _mm512_slli_epi32(h, 14));
          const __m512i m = _mm512_srai_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(64)), 7);
          ps[0] = h;
          ps[1] = m;
          ps[2] = _mm512_sub_epi32(r, _mm512_slli_epi32(m, 7));
        } else if (nparts == 2) {
          const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(128)), 8);
          ps[0] = h;
          ps[1] = _mm512_sub_epi32(q, _mm512_slli_epi32(h, 8));
        } else {
          ps[0] = q;
        }
        for (size_t p = 0; p < np; ++p)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + p * in + 16 * half), _mm512_cvtepi32_epi8(ps[p]));
        sum = _mm512_add_epi32(sum, q);
      }
      scale[t * nb + b] = amax * (0.5f / qmax);
      offset[t * nb + b] = 12 * _mm512_reduce_add_epi32(sum);
    }
}

namespace {

// One 16-row group's elements [k0, k0 + kc) into 16 columns of a k-major
// panel (stride kNR), the same fp32 values as DecodePackedRow (E2M1 value
// times the E8M0 scale) 16 rows per vector, a line of codes at a time
// (DecodeCodeLine: instead of one scalar decode and one strided store per
// element).
inline void DecodeGroupPanel(const Mxfp4PackedView& w, size_t g, size_t k0, size_t kc, float* dst) {
  const size_t nb = w.in / 32;
  const __m512 lut = _mm512_loadu_ps(kE2M1Values);
  for (size_t b = k0 / 32; b < (k0 + kc) / 32; ++b) {
    const uint8_t* codes = w.codes + (g * nb + b) * 256;
    const __m512 sc = E8M0Scales16(w.scales + (g * nb + b) * 16);
    float* d = dst + (b * 32 - k0) * kNR;
#pragma GCC unroll 4
    for (size_t c = 0; c < 4; ++c) {
      const __m512i v = _mm512_load_si512(codes + c * 64);
      __m512 lo[4], hi[4];
      DecodeCodeLine(v, lut, sc, lo, hi);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        _mm512_store_ps(d + (8 * c + j) * kNR, lo[j]);
        _mm512_store_ps(d + (8 * c + 4 + j) * kNR, hi[j]);
      }
    }
  }
}

}  // namespace

void mxfp4_gemm_avx512(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, size_t o_begin, size_t o_end) {
  auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {

    if (o0 % kMxfp4PackRows != 0) return DecodePackedPanel(w, o0, nr, k0, kc, Wp, kNR);
    for (size_t half = 0; half < 2; ++half) {
      if (half * 16 < nr) {
        DecodeGroupPanel(w, o0 / kMxfp4PackRows + half, k0, kc, Wp + half * 16);
      } else {
        for (size_t k = 0; k < kc; ++k) _mm512_store_ps(Wp + k * kNR + half * 16, _mm512_setzero_ps());
      }
    }
  };
  Gemm(pack, w.out, w.in, X, n, Y, o_begin, o_end);
}

// The F32 products of up to kSmallBatchMaxRows rows: WR adjacent W rows x MR
// x rows, one accumulator per (W row, x row) pair over 16-element steps
// (the last one masked), then its horizontal sum; the same operations for a
// pair whatever the tile, so a row's result does not depend on the rows
// beside it. Each W load serves MR rows and each x load WR rows: at WR = 4,
// MR = 6, 24 accumulators, 4 W vectors and one of x in the 32 registers.
namespace {

constexpr size_t kF32TileRows = 6;

template <size_t WR, size_t MR>
inline void F32Tile(const float* W, size_t in, const float* X, float* Y, size_t ldy) {
  const size_t kv = in / 16 * 16;
  __m512 acc[WR][MR];
#pragma GCC unroll 4
  for (size_t r = 0; r < WR; ++r)
#pragma GCC unroll 6
    for (size_t i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  const auto step = [&](size_t k, __mmask16 m) __attribute__((always_inline)) {
    __m512 w[WR];
#pragma GCC unroll 4
    for (size_t r = 0; r < WR; ++r) w[r] = _mm512_maskz_loadu_ps(m, W + r * in + k);
#pragma GCC unroll 6
    for (size_t i = 0; i < MR; ++i) {
      const __m512 x = _mm512_maskz_loadu_ps(m, X + i * in + k);
#pragma GCC unroll 4
      for (size_t r = 0; r < WR; ++r) acc[r][i] = _mm512_fmadd_ps(w[r], x, acc[r][i]);
    }
  };
  size_t k = 0;
  for (; k < kv; k += 16) step(k, static_cast<__mmask16>(0xFFFF));
  if (k < in) step(k, LaneMask(in - kv));
#pragma GCC unroll 4
  for (size_t r = 0; r < WR; ++r)
#pragma GCC unroll 6
    for (size_t i = 0; i < MR; ++i) Y[i * ldy + r] = HSum(acc[r][i]);
}

// W rows [0, WR) against all n x rows, in tiles of kF32TileRows.
template <size_t WR>
void F32TileColumn(const float* W, size_t in, const float* X, size_t n, float* Y, size_t ldy) {
  size_t t = 0;
  for (; t + kF32TileRows <= n; t += kF32TileRows) F32Tile<WR, kF32TileRows>(W, in, X + t * in, Y + t * ldy, ldy);
  const float* x = X + t * in;
  float* y = Y + t * ldy;
  switch (n - t) {
    case 0: return;
    case 1: return F32Tile<WR, 1>(W, in, x, y, ldy);
    case 2: return F32Tile<WR, 2>(W, in, x, y, ldy);
    case 3: return F32Tile<WR, 3>(W, in, x, y, ldy);
    case 4: return F32Tile<WR, 4>(W, in, x, y, ldy);
    default: return F32Tile<WR, 5>(W, in, x, y, ldy);
  }
}

}  // namespace

namespace {

// The k-major panel of rows [0, nr) of a row-major matrix (zero columns from
// nr to kNR), 16 rows x 16 elements at a time transposed in registers:
// load(c, k, mask) gives row c's elements [k, k + 16) as floats (masked
// past kc). Element by element, each store went to another line of the
// panel: at 512 rows the f32 GEMM's pack took about a fifth of the time of
// the BF16 projections it served (perf, Qwen3-Next prefill).
template <class Load>
inline void PackPanel(Load load, size_t nr, size_t kc, float* Wp) {
  for (size_t h = 0; h < kNR / 16; ++h)
    for (size_t kb = 0; kb < kc; kb += 16) {
      const size_t valid = Min(16, kc - kb);
      const __mmask16 m = LaneMask(valid);
      __m512 r[16];
#pragma GCC unroll 16
      for (size_t i = 0; i < 16; ++i) r[i] = h * 16 + i < nr ? load(h * 16 + i, kb, m) : _mm512_setzero_ps();
      Transpose16(r);
      for (size_t i = 0; i < valid; ++i) _mm512_store_ps(Wp + (kb + i) * kNR + h * 16, r[i]);
    }
}

}  // namespace

void f32_matmul_cols_avx512(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin,
                            size_t o_end) {
  if (n > kSmallBatchMaxRows) {
    auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {
      const float* w = W + o0 * in + k0;
      PackPanel([&](size_t c, size_t k, __mmask16 m) { return _mm512_maskz_loadu_ps(m, w + c * in + k); }, nr, kc, Wp);
    };
    Gemm(pack, out, in, X, n, Y, o_begin, o_end);
    return;
  }
  // Up to kSmallBatchMaxRows rows (decode): four W rows at a time against
  // tiles of kF32TileRows x rows (F32Tile), then the rows left over.
  size_t o = o_begin;
  for (; o + 4 <= o_end; o += 4) F32TileColumn<4>(W + o * in, in, X, n, Y + o, out);
  for (; o < o_end; ++o) F32TileColumn<1>(W + o * in, in, X, n, Y + o, out);
}

void bf16_panel_gemm_cols_avx512(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                                 size_t o_begin, size_t o_end) {
  auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {
    const uint16_t* w = W + o0 * in + k0;
    PackPanel(
        [&](size_t c, size_t k, __mmask16 m) {
          const __m256i h = _mm256_maskz_loadu_epi16(m, w + c * in + k);
          return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        },
        nr, kc, Wp);
  };
  Gemm(pack, out, in, X, n, Y, o_begin, o_end);
}

namespace {

// 16 E4M3 codes (bytes) to their values in fp32, exactly: a normal code's
// exponent and mantissa moved into fp32's fields with the bias moved from 7
// to 127, a subnormal m * 2^-9 converted from the integer, the sign OR-ed in
// (DecodeE4m3Finite in fp8_block.cpp, 16 lanes; a NaN code decodes as 480,
// and those are refused at load).
inline __m512 DecodeE4m3x16(__m128i codes) {
  const __m512i c = _mm512_cvtepu8_epi32(codes);
  const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(mag, _mm512_set1_epi32(7))),
                                   _mm512_set1_ps(0x1p-9f));
  const __mmask16 is_normal = _mm512_test_epi32_mask(mag, _mm512_set1_epi32(0x78));
  const __m512i bits = _mm512_mask_blend_epi32(is_normal, _mm512_castps_si512(sub), normal);
  return _mm512_castsi512_ps(_mm512_or_si512(bits, _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24)));
}

}  // namespace

void fp8_block_gemm_cols_avx512(const Fp8BlockView& w, const float* Xc, size_t n, float* Y, size_t o_begin,
                                size_t o_end) {
  // Each weight is its code's value times its block's scale, one fp32
  // rounding (Fp8BlockToF32's value), decoded 16 codes of a row at a time
  // straight into the panel's layout: no fp32 copy of W, no pass over one.
  // Fp8BlockView::scale is not used (no inline library code in this file).
  const size_t cols = w.cols, scale_cols = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {
    PackPanel(
        [&](size_t c, size_t k, __mmask16 m) {
          const size_t r = o0 + c, kk = k0 + k;  // a 16-column step never crosses a 128-column block
          const __m512 s = _mm512_set1_ps(w.scales[r / kFp8BlockSize * scale_cols + kk / kFp8BlockSize]);
          return _mm512_mul_ps(DecodeE4m3x16(_mm_maskz_loadu_epi8(m, w.codes + r * cols + kk)), s);
        },
        nr, kc, Wp);
  };
  float* Wp = AllocScratch(Min(kKC, cols) * kNR);
  for (size_t k0 = 0; k0 < cols; k0 += kKC) {
    const size_t kc = Min(kKC, cols - k0);
    GemmChunk(pack, w.rows, Xc + n * k0, n, k0, kc, Y, o_begin, o_end, Wp);
  }
  FreeScratch(Wp);
}

void rms_norm_avx512(const float* x, const float* w, float eps, size_t d, float* y) {
  const size_t kv = d / 16 * 16;
  const __mmask16 tail = LaneMask(d - kv);
  __m512 ss = _mm512_setzero_ps();
  size_t i = 0;
  for (; i < kv; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  if (i < d) {
    const __m512 v = _mm512_maskz_loadu_ps(tail, x + i);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const float inv = 1.0f / __builtin_sqrtf(HSum(ss) / static_cast<float>(d) + eps);
  const __m512 iv = _mm512_set1_ps(inv);
  for (i = 0; i < kv; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), iv)));
  if (i < d)
    _mm512_mask_storeu_ps(y + i, tail,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, w + i),
                                        _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), iv)));
}

}  // namespace moeserve::kernels::cpu
