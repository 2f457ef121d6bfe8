// AVX2 + FMA variants, compiled with those flags only here. Same structure as
// matmul_avx512.cpp with 8-float vectors: MXFP4 blocks are decoded with a
// byte shuffle into twice the E2M1 value (an int8), widened to float and
// scaled by half the block scale; the GEMM tile is 6 rows x 16 columns.
#include <immintrin.h>

#include "moeserve/kernels/mxfp4.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kNR = 16;
constexpr size_t kMR = 6;
constexpr size_t kKC = 256;

alignas(32) constexpr float kLut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline size_t Min(size_t a, size_t b) { return a < b ? a : b; }

inline __m256i Mask(size_t valid) {
  const int v = valid >= 8 ? 8 : static_cast<int>(valid);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <size_t MR>
inline void Micro(const float* __restrict Wp, const float* __restrict X, size_t ldx, size_t kc, float* Y, size_t ldy,
                  __m256i m0, __m256i m1, bool full, bool first) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; ++i) c0[i] = c1[i] = _mm256_setzero_ps();
  for (size_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(Wp + k * kNR);
    const __m256 w1 = _mm256_load_ps(Wp + k * kNR + 8);
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; ++i) {
      const __m256 x = _mm256_broadcast_ss(X + i * ldx + k);
      c0[i] = _mm256_fmadd_ps(x, w0, c0[i]);
      c1[i] = _mm256_fmadd_ps(x, w1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (size_t i = 0; i < MR; ++i) {
    float* y = Y + i * ldy;
    if (full) {
      if (!first) {
        c0[i] = _mm256_add_ps(c0[i], _mm256_loadu_ps(y));
        c1[i] = _mm256_add_ps(c1[i], _mm256_loadu_ps(y + 8));
      }
      _mm256_storeu_ps(y, c0[i]);
      _mm256_storeu_ps(y + 8, c1[i]);
    } else {
      if (!first) {
        c0[i] = _mm256_add_ps(c0[i], _mm256_maskload_ps(y, m0));
        c1[i] = _mm256_add_ps(c1[i], _mm256_maskload_ps(y + 8, m1));
      }
      _mm256_maskstore_ps(y, m0, c0[i]);
      _mm256_maskstore_ps(y + 8, m1, c1[i]);
    }
  }
}

inline void MicroTail(size_t mr, const float* Wp, const float* X, size_t ldx, size_t kc, float* Y, size_t ldy,
                      __m256i m0, __m256i m1, bool full, bool first) {
  switch (mr) {
    case 1: return Micro<1>(Wp, X, ldx, kc, Y, ldy, m0, m1, full, first);
    case 2: return Micro<2>(Wp, X, ldx, kc, Y, ldy, m0, m1, full, first);
    case 3: return Micro<3>(Wp, X, ldx, kc, Y, ldy, m0, m1, full, first);
    case 4: return Micro<4>(Wp, X, ldx, kc, Y, ldy, m0, m1, full, first);
    case 5: return Micro<5>(Wp, X, ldx, kc, Y, ldy, m0, m1, full, first);
    default: return;
  }
}

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
      const __m256i m0 = Mask(nr), m1 = Mask(nr > 8 ? nr - 8 : 0);
      const bool full = nr == kNR;
      size_t t = 0;
      for (; t + kMR <= n; t += kMR)
        Micro<kMR>(Wp, Xp + t * kc, kc, kc, Y + t * out + o0, out, m0, m1, full, k0 == 0);
      if (t < n) MicroTail(n - t, Wp, Xp + t * kc, kc, kc, Y + t * out + o0, out, m0, m1, full, k0 == 0);
    }
  }
  FreeScratch(Xp);
  FreeScratch(Wp);
}

inline __m256 Widen(__m128i bytes8) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8)); }

template <size_t R>
inline void Mxfp4DotRows(const uint8_t* blocks, const uint8_t* scales, size_t nb, size_t o, const float* xs,
                         float* acc_out) {
  // Twice the E2M1 values, as int8.
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m = _mm_set1_epi8(0x0F);
  __m256 acc[R];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const float* x = xs + b * 32;
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + ((o + r) * nb + b) * 16));
      const __m128i ve = _mm_shuffle_epi8(lut, _mm_and_si128(q, m));
      const __m128i vo = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m));
      __m256 p = _mm256_mul_ps(Widen(ve), _mm256_load_ps(x));
      p = _mm256_fmadd_ps(Widen(_mm_srli_si128(ve, 8)), _mm256_load_ps(x + 8), p);
      p = _mm256_fmadd_ps(Widen(vo), _mm256_load_ps(x + 16), p);
      p = _mm256_fmadd_ps(Widen(_mm_srli_si128(vo, 8)), _mm256_load_ps(x + 24), p);
      acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(kE8M0.half[scales[(o + r) * nb + b]]), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) acc_out[r] = HSum(acc[r]);
}

}  // namespace

void mxfp4_matmul_avx2(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, const float* X,
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

void f32_matmul_avx2(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin,
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
  const size_t kv = in / 8 * 8;
  size_t o = o_begin;
  for (; o + 4 <= o_end; o += 4)
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * in;
      const float* w = W + o * in;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      size_t k = 0;
      for (; k < kv; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + in + k), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * in + k), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * in + k), xv, a3);
      }
      float s[4] = {HSum(a0), HSum(a1), HSum(a2), HSum(a3)};
      for (; k < in; ++k)
        for (size_t r = 0; r < 4; ++r) s[r] += w[r * in + k] * x[k];
      for (size_t r = 0; r < 4; ++r) Y[t * out + o + r] = s[r];
    }
  for (; o < o_end; ++o)
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * in;
      const float* w = W + o * in;
      __m256 a = _mm256_setzero_ps();
      size_t k = 0;
      for (; k < kv; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a);
      float s = HSum(a);
      for (; k < in; ++k) s += w[k] * x[k];
      Y[t * out + o] = s;
    }
}

void rms_norm_avx2(const float* x, const float* w, float eps, size_t d, float* y) {
  const size_t kv = d / 8 * 8;
  __m256 ss = _mm256_setzero_ps();
  size_t i = 0;
  for (; i < kv; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  float s = HSum(ss);
  for (; i < d; ++i) s += x[i] * x[i];
  const float inv = 1.0f / __builtin_sqrtf(s / static_cast<float>(d) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i < kv; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), iv)));
  for (; i < d; ++i) y[i] = w[i] * (x[i] * inv);
}

}  // namespace moeserve::kernels::cpu
