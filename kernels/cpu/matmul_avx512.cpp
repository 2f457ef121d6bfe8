// AVX-512 variants (F, BW, VL, DQ + FMA), compiled with those flags only here.
//
// Matrix-vector (n < kGemmMinRows): each MXFP4 block's 16 bytes become two
// 16-float vectors (low nibbles = even elements, high = odd) by a table
// permute; x is pre-split per block into its even and odd halves to match, so
// one block costs two FMAs and one scaled accumulate per row.
// GEMM: weights are dequantised (or, for F32, transposed) into a k-major panel
// of 32 columns x 256 k, then an 8-row x 32-column register tile accumulates
// broadcasts of X against the panel; panels are produced once per call.
#include <immintrin.h>

#include "moeserve/kernels/mxfp4.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kNR = 32;   // columns per packed strip (two vectors)
constexpr size_t kMR = 8;    // activation rows per register tile
constexpr size_t kKC = 256;  // k per panel (multiple of 32)

alignas(64) constexpr float kLut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline size_t Min(size_t a, size_t b) { return a < b ? a : b; }

inline __mmask16 Mask(size_t valid) { return valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1u); }

template <size_t MR>
inline void Micro(const float* __restrict Wp, const float* __restrict X, size_t ldx, size_t kc, float* Y, size_t ldy,
                  __mmask16 m0, __mmask16 m1, bool first) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (size_t i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
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

// Y[:, o_begin:o_end] = X W^T with pack(Wp, o0, nr, k0, kc) producing the
// k-major panel Wp[k * 32 + c] (zero beyond nr columns).
template <class Pack>
void Gemm(Pack pack, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin, size_t o_end) {
  float* Wp = AllocScratch(kKC * kNR);
  // The k-chunk of X, copied contiguous: X's own row stride can alias cache
  // sets (e.g. 14336 floats = 14 x 4 KiB) and defeat the caches.
  float* Xp = AllocScratch(n * kKC);
  for (size_t k0 = 0; k0 < in; k0 += kKC) {
    const size_t kc = Min(kKC, in - k0);
    for (size_t t = 0; t < n; ++t)
      for (size_t k = 0; k < kc; ++k) Xp[t * kc + k] = X[t * in + k0 + k];
    for (size_t o0 = o_begin; o0 < o_end; o0 += kNR) {
      const size_t nr = Min(kNR, o_end - o0);
      pack(Wp, o0, nr, k0, kc);
      const __mmask16 m0 = Mask(nr), m1 = nr > 16 ? Mask(nr - 16) : __mmask16(0);
      size_t t = 0;
      for (; t + kMR <= n; t += kMR) Micro<kMR>(Wp, Xp + t * kc, kc, kc, Y + t * out + o0, out, m0, m1, k0 == 0);
      if (t < n) MicroTail(n - t, Wp, Xp + t * kc, kc, kc, Y + t * out + o0, out, m0, m1, k0 == 0);
    }
  }
  FreeScratch(Xp);
  FreeScratch(Wp);
}

inline float HSum(__m512 v) { return _mm512_reduce_add_ps(v); }

// Decodes 16 packed bytes into (even elements, odd elements), unscaled.
inline void DecodeHalves(const uint8_t* q16, __m512 lut, __m512* even, __m512* odd) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(q, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
  *even = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(lo), lut);
  *odd = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(hi), lut);
}

template <size_t R>
inline void Mxfp4DotRows(const uint8_t* blocks, const uint8_t* scales, size_t nb, size_t o, const float* xs,
                         float* acc_out) {
  const __m512 lut = _mm512_load_ps(kLut);
  __m512 acc[R];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const __m512 xe = _mm512_load_ps(xs + b * 32);
    const __m512 xo = _mm512_load_ps(xs + b * 32 + 16);
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
      __m512 we, wo;
      DecodeHalves(blocks + ((o + r) * nb + b) * 16, lut, &we, &wo);
      __m512 p = _mm512_mul_ps(we, xe);
      p = _mm512_fmadd_ps(wo, xo, p);
      acc[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(kE8M0.v[scales[(o + r) * nb + b]]), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) acc_out[r] = HSum(acc[r]);
}

}  // namespace

void mxfp4_matmul_avx512(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, const float* X,
                         size_t n, float* Y, size_t o_begin, size_t o_end) {
  const size_t nb = in / 32;
  if (n >= kGemmMinRows) {
    auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {
      const size_t b0 = k0 / 32, nbc = kc / 32;
      for (size_t c = 0; c < kNR; ++c) {
        if (c >= nr) {
          for (size_t k = 0; k < kc; ++k) Wp[k * kNR + c] = 0.0f;
          continue;
        }
        const uint8_t* q = blocks + ((o0 + c) * nb + b0) * 16;
        const uint8_t* s = scales + (o0 + c) * nb + b0;
        for (size_t b = 0; b < nbc; ++b) {
          const float sc = kE8M0.v[s[b]];
          float* w = Wp + b * 32 * kNR + c;
          for (size_t j = 0; j < 16; ++j) {
            const uint8_t byte = q[b * 16 + j];
            w[(2 * j) * kNR] = kLut[byte & 15] * sc;
            w[(2 * j + 1) * kNR] = kLut[byte >> 4] * sc;
          }
        }
      }
    };
    Gemm(pack, out, in, X, n, Y, o_begin, o_end);
    return;
  }
  // x split per block into even then odd elements.
  float* xs = AllocScratch(n * in);
  for (size_t t = 0; t < n; ++t)
    for (size_t b = 0; b < nb; ++b)
      for (size_t j = 0; j < 16; ++j) {
        xs[t * in + b * 32 + j] = X[t * in + b * 32 + 2 * j];
        xs[t * in + b * 32 + 16 + j] = X[t * in + b * 32 + 2 * j + 1];
      }
  size_t o = o_begin;
  float acc[4];
  for (; o + 4 <= o_end; o += 4)
    for (size_t t = 0; t < n; ++t) {
      Mxfp4DotRows<4>(blocks, scales, nb, o, xs + t * in, acc);
      for (size_t r = 0; r < 4; ++r) Y[t * out + o + r] = acc[r];
    }
  for (; o < o_end; ++o)
    for (size_t t = 0; t < n; ++t) {
      Mxfp4DotRows<1>(blocks, scales, nb, o, xs + t * in, acc);
      Y[t * out + o] = acc[0];
    }
  FreeScratch(xs);
}

void f32_matmul_avx512(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin,
                       size_t o_end) {
  if (n >= kGemmMinRows) {
    auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {
      for (size_t c = 0; c < kNR; ++c) {
        if (c >= nr) {
          for (size_t k = 0; k < kc; ++k) Wp[k * kNR + c] = 0.0f;
          continue;
        }
        const float* w = W + (o0 + c) * in + k0;
        for (size_t k = 0; k < kc; ++k) Wp[k * kNR + c] = w[k];
      }
    };
    Gemm(pack, out, in, X, n, Y, o_begin, o_end);
    return;
  }
  const size_t kv = in / 16 * 16;
  const __mmask16 tail = Mask(in - kv);
  size_t o = o_begin;
  for (; o + 4 <= o_end; o += 4)
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * in;
      const float* w = W + o * in;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      size_t k = 0;
      for (; k < kv; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + in + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 2 * in + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 3 * in + k), xv, a3);
      }
      if (k < in) {
        const __m512 xv = _mm512_maskz_loadu_ps(tail, x + k);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + in + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + 2 * in + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + 3 * in + k), xv, a3);
      }
      float* y = Y + t * out + o;
      y[0] = HSum(a0);
      y[1] = HSum(a1);
      y[2] = HSum(a2);
      y[3] = HSum(a3);
    }
  for (; o < o_end; ++o)
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * in;
      const float* w = W + o * in;
      __m512 a = _mm512_setzero_ps();
      size_t k = 0;
      for (; k < kv; k += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a);
      if (k < in) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + k), _mm512_maskz_loadu_ps(tail, x + k), a);
      Y[t * out + o] = HSum(a);
    }
}

void rms_norm_avx512(const float* x, const float* w, float eps, size_t d, float* y) {
  const size_t kv = d / 16 * 16;
  const __mmask16 tail = Mask(d - kv);
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
