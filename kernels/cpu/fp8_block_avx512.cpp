// The AVX-512 row kernel of the FP8 block-scaled products (fp8_block.hpp).
// Built with the AVX-512 flags (kernels/CMakeLists.txt) and reached only
// through the avx512 set; like matmul_avx512.cpp it calls no inline library
// templates (nor fp8_block.hpp's inline members), so no AVX-512 code can
// leak into a shared COMDAT.
//
// Sixty-four codes at a time are decoded exactly to fp32 by two byte-table
// lookups (vpermi2b) and two rounds of unpacking (Decoder, below), then
// multiplied by their block's scale (one fp32 rounding, as the reference),
// or, for a row block whose scales all lie in [2^-64, 2^64], multiply-added
// as they are against activations multiplied by the scales once per row
// block (RowTile's Fold: the same bits for power-of-two scales); each vector
// feeds the FMAs of up to 4 activation rows, each row with four
// accumulators; a single activation row (decode) takes four output rows at
// a time, four weight streams. The unpacks leave the 64 weights in a fixed permutation, so
// the activations are permuted the same way once per call
// (fp8_block_permute_x_avx512). About 17 instructions decode, scale and
// multiply-add 64 weights for one row, where the FP16 route (ScaledWeights,
// kept for ragged tails) took about 40: one thread's matrix-vector product
// was compute-bound at ~11 GB/s of codes with it. The codes 2 KiB ahead are
// prefetched into L1 (past a row's end: the next rows', harmless at the
// matrix's end).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "cpu/variants.hpp"

// vpermi2b (the decode's byte tables): the avx512 set requires VBMI
// (dispatch.cpp), so only this file's functions get the flag.
#pragma GCC target("avx512vbmi")

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kBlock = 128;  // kFp8BlockSize
constexpr size_t kTile = 4;  // activation rows per decoded group (16 accumulators)
// Codes this far ahead are prefetched into L1 (prefetcht0): the hardware
// prefetchers alone do not keep enough misses in flight. At 18432 x 7168
// on the loaded 2-core EPYC here, one thread read 3.7 GB/s with none, 4.8 at
// 1 KiB, 6.6 at 4 KiB, 6.2-6.4 at 8-16 KiB, all into L2 (prefetcht1; in
// cache it computed 11.3). Later, with four rows a step and aligned
// activations, 8192 x 7168, one thread, L1 at 2 KiB against L2 at 4 KiB
// read 18.3-20.5 against 16.2-17.6 GB/s (1 KiB into L1 19.6-20.4; 8 and 16
// KiB into L2 no better than 4).
constexpr size_t kPrefetchAhead = 2048;

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

// The BF16 bits of every E4M3 magnitude (codes 0..127; 0x7F, NaN, gives
// 0x7FC0), split into a high-byte and a low-byte table of 128 entries each,
// for vpermi2b (which reads the index's low 7 bits). Every E4M3 value is
// exact in BF16 (at most 4 significant bits, exponents -9..8), and a BF16
// moved into fp32's top half is the same value, so the decode is exact.
constexpr uint16_t E4m3Bf16Bits(int mag) {
  if (mag == 0x7F) return 0x7FC0;
  const int e = mag >> 3, m = mag & 7;
  if (e > 0) return static_cast<uint16_t>(((e + 120) << 7) | (m << 4));
  if (m == 0) return 0;
  const int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m * 2^-9 = 2^(p-9) * (m / 2^p)
  return static_cast<uint16_t>(((p + 118) << 7) | ((m - (1 << p)) << (7 - p)));
}
struct E4m3Bf16Tables {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
};
constexpr E4m3Bf16Tables MakeTables() {
  E4m3Bf16Tables t{};
  for (int c = 0; c < 128; ++c) {
    t.hi[c] = static_cast<uint8_t>(E4m3Bf16Bits(c) >> 8);
    t.lo[c] = static_cast<uint8_t>(E4m3Bf16Bits(c) & 0xFF);
  }
  return t;
}
alignas(64) constexpr E4m3Bf16Tables kTables = MakeTables();

// 64 codes decoded exactly to fp32, four vectors: two byte lookups (vpermi2b)
// give each code's BF16 high and low bytes, the code's sign OR-ed into the
// high byte; unpacking bytes to words and words (under zeros) to dwords puts
// each BF16 in its fp32's top half. The unpacks work within 128-bit lanes,
// so vector q holds, at lane L and element j, the code 16 L + 4 q + j of the
// 64: the activations are permuted the same way beforehand
// (fp8_block_permute_x_avx512), so each product pairs the right column.
struct Decoder {
  __m512i hi0, hi1, lo0, lo1, sign;
  Decoder()
      : hi0(_mm512_load_si512(kTables.hi)), hi1(_mm512_load_si512(kTables.hi + 64)),
        lo0(_mm512_load_si512(kTables.lo)), lo1(_mm512_load_si512(kTables.lo + 64)),
        sign(_mm512_set1_epi8(static_cast<char>(0x80))) {}
  inline void Decode(const uint8_t* codes, __m512 v[4]) const {
    const __m512i c = _mm512_loadu_si512(codes);
    __m512i hi = _mm512_permutex2var_epi8(hi0, c, hi1);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, c, lo1);
    hi = _mm512_ternarylogic_epi32(hi, c, sign, 0xF8);  // hi | (c & 0x80)
    const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    const __m512i z = _mm512_setzero_si512();
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w0));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w0));
    v[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w1));
    v[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w1));
  }
};

// Output rows r .. r + RO - 1 for R activation rows (X permuted, X and Y
// already offset to the first activation row). Each (output, activation)
// pair keeps four accumulators (one per decoded vector of a 64-code group),
// so a single row is not bound by the FMA latency, and every tile shape sums
// a pair in the same order (a row's bits depend neither on its batch nor on
// the output rows decoded beside it). Several output rows at once (RO, for a
// single activation row) read several weight streams at once, which keeps
// more misses in flight than one stream a thread. Each weight is the decoded
// value times its block's scale, one fp32 rounding, as the reference (exact
// for any scale: no 2^8 fold here).
//
// Fold (the scales in the activations): the full 64-column groups read XS,
// the activations already multiplied by the row block's scales (ScaleX),
// and multiply-add the decoded values as they are: fma(v, fl(x s), acc)
// instead of fma(fl(v s), x, acc), one rounding moved from the weight to
// the activation. Power-of-two scales (the release's UE8M0) make both exact,
// so the bits are the same; other scales stay within the reference's bound.
// It saves the 4 multiplies per 64 weights and output row (a quarter of a
// decode row's work), for n x cols multiplies per 128 output rows. Which
// form a row takes depends only on its row block's scales (FoldableScales),
// never on the tile, so batch invariance holds.
template <size_t RO, size_t R, bool Fold>
inline void RowTile(const Decoder& dec, const Fp8BlockView& w, const float* X, const float* XS, float* Y, size_t r) {
  const size_t cols = w.cols, rows = w.rows, scale_cols = (cols + kBlock - 1) / kBlock;
  const uint8_t* codes[RO];
  const float* srow[RO];
  __m512 acc[RO][R][4];
  float table_sum[RO][R];  // ragged tails whose scale times 2^8 would overflow
  for (size_t o = 0; o < RO; ++o) {
    codes[o] = w.codes + (r + o) * cols;
    srow[o] = w.scales + ((r + o) / kBlock) * scale_cols;
    for (size_t j = 0; j < R; ++j) {
      for (int q = 0; q < 4; ++q) acc[o][j][q] = _mm512_setzero_ps();
      table_sum[o][j] = 0.0f;
    }
  }
  for (size_t k0 = 0, b = 0; k0 < cols; k0 += kBlock, ++b) {
    const size_t k1 = k0 + kBlock < cols ? k0 + kBlock : cols;
    size_t k = k0;
    for (; k + 64 <= k1; k += 64) {
      for (size_t o = 0; o < RO; ++o) {
        _mm_prefetch(reinterpret_cast<const char*>(codes[o] + k + kPrefetchAhead), _MM_HINT_T0);
        __m512 v[4];
        dec.Decode(codes[o] + k, v);
        if constexpr (!Fold) {
          const __m512 s = _mm512_set1_ps(srow[o][b]);
          for (int q = 0; q < 4; ++q) v[q] = _mm512_mul_ps(v[q], s);
        }
        for (size_t j = 0; j < R; ++j)
          for (int q = 0; q < 4; ++q)
            acc[o][j][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(XS + j * cols + k + 16 * q), acc[o][j][q]);
      }
    }
    if (k == k1) continue;
    // A ragged block's last 1-63 columns (X not permuted there): 16 at a time
    // through FP16, masked loads reading zeros past k1.
    for (size_t o = 0; o < RO; ++o) {
      const float scale = srow[o][b];
      if (__builtin_isfinite(scale) && !(__builtin_fabsf(scale) < 0x1p119f)) {
        const float* table = Fp8E4m3Table();
        for (size_t kk = k; kk < k1; ++kk) {
          const float weight = table[codes[o][kk]] * scale;
          for (size_t j = 0; j < R; ++j) table_sum[o][j] += weight * X[j * cols + kk];
        }
        continue;
      }
      const __m512 s256 = _mm512_set1_ps(scale * 256.0f);
      for (size_t kk = k; kk < k1; kk += 16) {
        const size_t left = k1 - kk;
        const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
        const __m512 wv = ScaledWeights(_mm_maskz_loadu_epi8(m, codes[o] + kk), s256);
        for (size_t j = 0; j < R; ++j)
          acc[o][j][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, X + j * cols + kk), acc[o][j][0]);
      }
    }
  }
  for (size_t o = 0; o < RO; ++o)
    for (size_t j = 0; j < R; ++j)
      Y[j * rows + r + o] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[o][j][0], acc[o][j][1]),
                                                               _mm512_add_ps(acc[o][j][2], acc[o][j][3]))) +
                            table_sum[o][j];
}

// Sixteen weights rounded to BF16, to nearest even (as Bf16BitsNearestEven in
// fp8_block.cpp; no NaN reaches here), stored.
inline void StoreBf16(uint16_t* out, __m512 w, __mmask16 m) {
  __m512i u = _mm512_castps_si512(w);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  _mm256_mask_storeu_epi16(out, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}

}  // namespace

long long fp8_find_nan_avx512(const uint8_t* codes, size_t n) {
  // 256 codes a step: (code | 0x80) == 0xFF for S.1111.111, the masks OR-ed,
  // the first hit then located in the step that has one.
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80)), ones = _mm512_set1_epi8(static_cast<char>(0xFF));
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    __mmask64 any = 0;
    for (size_t j = 0; j < 256; j += 64)
      any |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(_mm512_loadu_si512(codes + i + j), sign), ones);
    if (any) break;
  }
  for (; i < n; ++i)
    if ((codes[i] | 0x80) == 0xFF) return static_cast<long long>(i);
  return -1;
}

void fp8_block_to_bf16_avx512(const Fp8BlockView& w, size_t r_begin, size_t r_end, uint16_t* out) {
  const size_t cols = w.cols, scale_cols = (cols + kBlock - 1) / kBlock;
  for (size_t r = r_begin; r < r_end; ++r) {
    const uint8_t* codes = w.codes + r * cols;
    const float* srow = w.scales + (r / kBlock) * scale_cols;
    uint16_t* o = out + (r - r_begin) * cols;
    for (size_t k0 = 0, b = 0; k0 < cols; k0 += kBlock, ++b) {
      const float scale = srow[b];
      const size_t k1 = k0 + kBlock < cols ? k0 + kBlock : cols;
      if (__builtin_isfinite(scale) && !(__builtin_fabsf(scale) < 0x1p119f)) {  // scale * 2^8 would overflow
        const float* table = Fp8E4m3Table();
        for (size_t k = k0; k < k1; ++k) {
          const __m512 v = _mm512_set1_ps(table[codes[k]] * scale);
          StoreBf16(o + k, v, 1);
        }
        continue;
      }
      const __m512 s = _mm512_set1_ps(scale * 256.0f);
      for (size_t k = k0; k < k1; k += 16) {
        const size_t left = k1 - k;
        const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
        StoreBf16(o + k, ScaledWeights(_mm_maskz_loadu_epi8(m, codes + k), s), m);
      }
    }
  }
}

void fp8_block_permute_x_avx512(const float* X, size_t n, size_t cols, float* XP) {
  for (size_t i = 0; i < n; ++i) {
    const float* x = X + i * cols;
    float* xp = XP + i * cols;
    size_t k0 = 0;
    for (; k0 < cols; k0 += kBlock) {
      const size_t k1 = k0 + kBlock < cols ? k0 + kBlock : cols;
      size_t k = k0;
      for (; k + 64 <= k1; k += 64) {  // 128-bit chunk q of each of the 4 vectors into vector q
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        const __m512 x2 = _mm512_loadu_ps(x + k + 32), x3 = _mm512_loadu_ps(x + k + 48);
        const __m512 t0 = _mm512_shuffle_f32x4(x0, x1, 0x44), t1 = _mm512_shuffle_f32x4(x0, x1, 0xEE);
        const __m512 t2 = _mm512_shuffle_f32x4(x2, x3, 0x44), t3 = _mm512_shuffle_f32x4(x2, x3, 0xEE);
        _mm512_storeu_ps(xp + k, _mm512_shuffle_f32x4(t0, t2, 0x88));
        _mm512_storeu_ps(xp + k + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
        _mm512_storeu_ps(xp + k + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
        _mm512_storeu_ps(xp + k + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
      }
      for (; k < k1; ++k) xp[k] = x[k];  // a ragged block's tail stays in order
    }
  }
}

namespace {

// Whether row block rb's scales fold into the activations (RowTile's Fold):
// all within [2^-64, 2^64], so x s neither overflows nor leaves the normal
// range for any activation a layer makes (|x| < 2^64); the scales the
// release and its conversions carry are 2^-20 .. 2^-5.
bool FoldableScales(const Fp8BlockView& w, size_t rb) {
  const size_t scale_cols = (w.cols + kBlock - 1) / kBlock;
  const float* s = w.scales + rb * scale_cols;
  for (size_t b = 0; b < scale_cols; ++b)
    if (!(s[b] >= 0x1p-64f && s[b] <= 0x1p64f)) return false;
  return true;
}

// XS = XP with each full 64-column group times its column block's scale in
// row block rb (the ragged tails are left: RowTile reads them from XP).
void ScaleX(const Fp8BlockView& w, size_t rb, const float* XP, size_t n, float* XS) {
  const size_t cols = w.cols, scale_cols = (cols + kBlock - 1) / kBlock;
  const float* srow = w.scales + rb * scale_cols;
  for (size_t i = 0; i < n; ++i)
    for (size_t k0 = 0, b = 0; k0 < cols; k0 += kBlock, ++b) {
      const size_t k1 = k0 + kBlock < cols ? k0 + kBlock : cols;
      const __m512 s = _mm512_set1_ps(srow[b]);
      for (size_t k = k0; k + 64 <= k1; k += 64)
        for (int q = 0; q < 4; ++q)
          _mm512_storeu_ps(XS + i * cols + k + 16 * q, _mm512_mul_ps(_mm512_loadu_ps(XP + i * cols + k + 16 * q), s));
    }
}

// Output rows [r_begin, r_end), all in one row block, in the form Fold says.
template <bool Fold>
void RowsOfBlock(const Decoder& dec, const Fp8BlockView& w, const float* XP, const float* XS, size_t n, float* Y,
                 size_t r_begin, size_t r_end) {
  const size_t cols = w.cols, rows = w.rows;
  size_t r = r_begin;
  if (n == 1)  // decode: four weight streams at a time
    for (; r + 4 <= r_end; r += 4) RowTile<4, 1, Fold>(dec, w, XP, XS, Y, r);
  for (; r < r_end; ++r) {
    size_t i = 0;
    for (; i + kTile <= n; i += kTile) RowTile<1, kTile, Fold>(dec, w, XP + i * cols, XS + i * cols, Y + i * rows, r);
    switch (n - i) {
      case 3: RowTile<1, 3, Fold>(dec, w, XP + i * cols, XS + i * cols, Y + i * rows, r); break;
      case 2: RowTile<1, 2, Fold>(dec, w, XP + i * cols, XS + i * cols, Y + i * rows, r); break;
      case 1: RowTile<1, 1, Fold>(dec, w, XP + i * cols, XS + i * cols, Y + i * rows, r); break;
      default: break;
    }
  }
}

}  // namespace

void fp8_block_rows_avx512(const Fp8BlockView& w, const float* XP, size_t n, float* Y, size_t r_begin,
                           size_t r_end) {
  const Decoder dec;
  // The activations scaled per row block, in a buffer of this thread's that
  // only grows (n x cols floats, the size of XP; held for the thread's life).
  // malloc, not a std::vector: no library template may be instantiated with
  // this file's AVX-512 flags (the header above).
  thread_local float* xs = nullptr;
  thread_local size_t xs_floats = 0;
  for (size_t r = r_begin; r < r_end;) {
    const size_t rb = r / kBlock, block_end = (rb + 1) * kBlock, end = r_end < block_end ? r_end : block_end;
    bool fold = FoldableScales(w, rb);
    if (fold && xs_floats < n * w.cols) {
      std::free(xs);
      // 64-byte aligned: each 16-float load of a full group is then one
      // cache line, not two (128 x 7168 in L1, one thread, on the 2-core
      // EPYC: 44 GB/s of codes against 35 from malloc's 16-byte alignment).
      xs = static_cast<float*>(std::aligned_alloc(64, (n * w.cols * sizeof(float) + 63) / 64 * 64));
      xs_floats = xs ? n * w.cols : 0;
      fold = xs != nullptr;  // no memory: the unfolded form, same bits for power-of-two scales
    }
    if (fold) {
      ScaleX(w, rb, XP, n, xs);
      RowsOfBlock<true>(dec, w, XP, xs, n, Y, r, end);
    } else {
      RowsOfBlock<false>(dec, w, XP, XP, n, Y, r, end);
    }
    r = end;
  }
}

}  // namespace moeserve::kernels::cpu
