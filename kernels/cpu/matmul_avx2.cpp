// AVX2 + FMA variants, compiled with those flags only here. Same structure as
// matmul_avx512.cpp with 8-lane vectors: the MXFP4 matrix-vector product
// works on the packed layout with vpmaddubsw/vpmaddwd in place of VNNI (each
// 16-row group is two 8-row halves); the GEMM tile is 6 rows x 16 columns.
#include <immintrin.h>

#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kNR = 16;
constexpr size_t kMR = 6;
constexpr size_t kKC = 2048;  // long panels: few passes over Y (see the AVX-512 variant)

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
  // The partial sums read back after the k loop: fetched now (see the
  // AVX-512 variant).
  if (!first) {
#pragma GCC unroll 8
    for (size_t i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(Y + i * ldy), _MM_HINT_T0);
  }
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

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// One half (8 rows) of a 64-byte line of packed codes against 4 + 4
// broadcast bytes of each int8 activation part: vpmaddubsw pairs, summed to
// 32-bit lanes by vpmaddwd. No saturation: |(2v + 12) * a| <= 24 * 128, a
// pair and the sum of two pairs within int16.
inline void DotHalf(const uint8_t* codes32, __m256i lut, __m256i nibble, __m256i ones, int nparts,
                    const __m256i (&a)[3][2], __m256i (&acc)[3]) {
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes32));
  const __m256i w_lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nibble));
  const __m256i w_hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
  for (int p = 0; p < nparts; ++p) {
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w_lo, a[p][0]), _mm256_maddubs_epi16(w_hi, a[p][1]));
    acc[p] = _mm256_add_epi32(acc[p], _mm256_madd_epi16(pairs, ones));
  }
}

// Applies one block's scales to 8 rows' exact integer sums.
inline __m256 ScaleRows(const __m256i (&acc)[3], int nparts, int32_t offset, const uint8_t* scales8, float act_scale,
                        __m256 y) {
  __m256i q = _mm256_setzero_si256();
  for (int p = 0; p < nparts; ++p)
    q = _mm256_add_epi32(q, _mm256_sll_epi32(acc[p], _mm_cvtsi32_si128(Mxfp4ActShift(nparts, p))));
  const __m256i d = _mm256_sub_epi32(q, _mm256_set1_epi32(offset));
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales8)));
  const __m256i zero_scale = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
  const __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000), zero_scale);
  const __m256 s = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(act_scale));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, y);
}

}  // namespace

void mxfp4_matvec_avx2(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                       size_t g_end, size_t b_begin, size_t b_end) {
  const size_t nb = w.in / 32;
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t g = g_begin; g < g_end; ++g) {
    const size_t rows = Min(16, w.out - g * 16);
    const __m256i valid0 = Mask(rows), valid1 = Mask(rows > 8 ? rows - 8 : 0);
    const uint8_t* gcodes = w.codes + g * nb * 256;
    const uint8_t* gscales = w.scales + g * nb * 16;
    for (size_t t = 0; t < x.n; ++t) {
      const int np = x.nparts;
      const int8_t* part[3] = {x.part(t, 0), x.part(t, np > 1 ? 1 : 0), x.part(t, np > 2 ? 2 : 0)};
      float* out = Y + t * w.out + g * 16;
      __m256 y0 = _mm256_setzero_ps(), y1 = y0;
      if (b_begin > 0) {
        y0 = _mm256_maskload_ps(out, valid0);
        y1 = _mm256_maskload_ps(out + 8, valid1);
      }
      for (size_t b = b_begin; b < b_end; ++b) {
        const uint8_t* codes = gcodes + b * 256;
#pragma GCC unroll 4
        for (size_t line = 0; line < 256; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(codes + kMxfp4PrefetchBytes + line), _MM_HINT_T1);
        __m256i acc0[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        __m256i acc1[3] = {acc0[0], acc0[0], acc0[0]};
#pragma GCC unroll 4
        for (size_t c = 0; c < 4; ++c) {
          __m256i a[3][2];
          for (int p = 0; p < np; ++p) {
            a[p][0] = _mm256_set1_epi32(Load4(part[p] + b * 32 + c * 8));
            a[p][1] = _mm256_set1_epi32(Load4(part[p] + b * 32 + c * 8 + 4));
          }
          DotHalf(codes + c * 64, lut, nibble, ones, np, a, acc0);
          DotHalf(codes + c * 64 + 32, lut, nibble, ones, np, a, acc1);
        }
        const float as = x.scale[t * nb + b];
        const int32_t off = x.offset[t * nb + b];
        y0 = ScaleRows(acc0, np, off, gscales + b * 16, as, y0);
        y1 = ScaleRows(acc1, np, off, gscales + b * 16 + 8, as, y1);
      }
      _mm256_maskstore_ps(out, valid0, y0);
      _mm256_maskstore_ps(out + 8, valid1, y1);
    }
  }
}

void mxfp4_gemm_avx2(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, size_t o_begin, size_t o_end) {
  auto pack = [&](float* Wp, size_t o0, size_t nr, size_t k0, size_t kc) {
    DecodePackedPanel(w, o0, nr, k0, kc, Wp, kNR);
  };
  Gemm(pack, w.out, w.in, X, n, Y, o_begin, o_end);
}

void f32_matmul_cols_avx2(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin,
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
