// The int8 indexer scores on AVX-512 VNNI (the avx512 set's
// indexer_scores_int8): 32 keys at a time, their bytes transposed so that
// each 32-bit lane holds four consecutive bytes of one key (Kt[d4 * 32 + j]
// = bytes 4 d4 .. 4 d4 + 3 of key j), then per head vpdpbusd of the key
// bytes (unsigned, code + 128) with the head's four codes broadcast
// (signed), the sums starting at -offset so that they are the exact dot
// products; ReLU in integers, one conversion, the heads' fmas in head order
// and the keys' scales last: the reference's expression, lane by lane.
// Every query of the call reads the transposed block (prefill's blocks of
// rows share it), and the keys are split across the pool in chunks of
// whole blocks.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {

namespace {

// acc += the u8 x s8 dot products of k and q, four bytes a lane. Inline
// assembly because GCC 12 copied the accumulators of the unrolled heads
// into other registers and back around every _mm512_dpbusd_epi32 (twice as
// many instructions as products, and a spill).
inline void Dpbusd(__m512i& acc, __m512i k, __m512i q) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(k), "v"(q)); }

__mmask16 Tail(int n) { return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u); }

// The broadcast four codes of head i at dims 4 d4 .. 4 d4 + 3.
inline __m512i Codes4(const int8_t* codes, int dim, int i, int d4) {
  int32_t four;
  std::memcpy(&four, codes + static_cast<size_t>(i) * dim + 4 * d4, 4);
  return _mm512_set1_epi32(four);
}

// Head i's ReLU'd dots (a0: keys 0-15, a1: 16-31) folded into I0, I1.
inline void Fold(__m512i a0, __m512i a1, float wt, __m512& I0, __m512& I1) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512 w = _mm512_set1_ps(wt);
  I0 = _mm512_fmadd_ps(w, _mm512_cvtepi32_ps(_mm512_max_epi32(a0, zero)), I0);
  I1 = _mm512_fmadd_ps(w, _mm512_cvtepi32_ps(_mm512_max_epi32(a1, zero)), I1);
}

// HN (8, 4 or 1) heads of one query over the block's 32 keys, folded into
// I0 (keys 0-15) and I1 (16-31) in head order. The accumulators are named
// variables: held in arrays, GCC 12 kept them in memory or copied them
// around every product.
template <int HN>
inline void Heads(const int32_t* Kt, const int8_t* codes, const float* wt, const int32_t* off, int dim, __m512& I0,
                  __m512& I1) {
  static_assert(HN == 8 || HN == 4 || HN == 1);
  const auto init = [&](int i) { return _mm512_set1_epi32(i < HN ? -off[i] : 0); };
  __m512i a00 = init(0), a10 = a00, a01 = init(1), a11 = a01, a02 = init(2), a12 = a02, a03 = init(3), a13 = a03;
  __m512i a04 = init(4), a14 = a04, a05 = init(5), a15 = a05, a06 = init(6), a16 = a06, a07 = init(7), a17 = a07;
  const int d4n = dim / 4;
  for (int d4 = 0; d4 < d4n; ++d4) {
    const __m512i k0 = _mm512_load_si512(Kt + d4 * 32), k1 = _mm512_load_si512(Kt + d4 * 32 + 16);
#define MOESERVE_HEAD(i, A0, A1)              \
  {                                           \
    const __m512i q = Codes4(codes, dim, i, d4); \
    Dpbusd(A0, k0, q);                        \
    Dpbusd(A1, k1, q);                        \
  }
    MOESERVE_HEAD(0, a00, a10)
    if constexpr (HN >= 4) {
      MOESERVE_HEAD(1, a01, a11)
      MOESERVE_HEAD(2, a02, a12)
      MOESERVE_HEAD(3, a03, a13)
    }
    if constexpr (HN == 8) {
      MOESERVE_HEAD(4, a04, a14)
      MOESERVE_HEAD(5, a05, a15)
      MOESERVE_HEAD(6, a06, a16)
      MOESERVE_HEAD(7, a07, a17)
    }
#undef MOESERVE_HEAD
  }
  Fold(a00, a10, wt[0], I0, I1);
  if constexpr (HN >= 4) {
    Fold(a01, a11, wt[1], I0, I1);
    Fold(a02, a12, wt[2], I0, I1);
    Fold(a03, a13, wt[3], I0, I1);
  }
  if constexpr (HN == 8) {
    Fold(a04, a14, wt[4], I0, I1);
    Fold(a05, a15, wt[5], I0, I1);
    Fold(a06, a16, wt[6], I0, I1);
    Fold(a07, a17, wt[7], I0, I1);
  }
}

void Block(const IndexerInt8Query& query, int queries, int heads, int dim, const float* const* rows, size_t offset,
           const int* n, float* scores, size_t ld, int kb, int nk, int32_t* Kt, float* scale) {
  const int d4n = dim / 4;
  for (int j = 0; j < 32; ++j) {
    if (j < nk) {
      const float* row = rows[kb + j] + offset;
      const int32_t* src = reinterpret_cast<const int32_t*>(row);
      for (int d4 = 0; d4 < d4n; ++d4) Kt[d4 * 32 + j] = src[d4];
      std::memcpy(&scale[j], row + d4n, sizeof(float));
    } else {
      for (int d4 = 0; d4 < d4n; ++d4) Kt[d4 * 32 + j] = 0;
      scale[j] = 0.0f;
    }
  }
  const __m512 s0 = _mm512_loadu_ps(scale), s1 = _mm512_loadu_ps(scale + 16);
  for (int b = 0; b < queries; ++b) {
    if (kb >= n[b]) continue;
    const size_t qh = static_cast<size_t>(b) * heads;
    const int8_t* codes = query.codes + qh * dim;
    const float* wt = query.wt + qh;
    const int32_t* off = query.offset + qh;
    __m512 I0 = _mm512_setzero_ps(), I1 = _mm512_setzero_ps();
    int h = 0;
    // 8 heads a pass: 16 independent sums, each loaded piece of Kt serving 8 heads.
    for (; h + 8 <= heads; h += 8) Heads<8>(Kt, codes + static_cast<size_t>(h) * dim, wt + h, off + h, dim, I0, I1);
    for (; h + 4 <= heads; h += 4) Heads<4>(Kt, codes + static_cast<size_t>(h) * dim, wt + h, off + h, dim, I0, I1);
    for (; h < heads; ++h) Heads<1>(Kt, codes + static_cast<size_t>(h) * dim, wt + h, off + h, dim, I0, I1);
    const int valid = std::min(nk, n[b] - kb);
    float* out = scores + static_cast<size_t>(b) * ld + kb;
    _mm512_mask_storeu_ps(out, Tail(valid), _mm512_mul_ps(I0, s0));
    if (valid > 16) _mm512_mask_storeu_ps(out + 16, Tail(valid - 16), _mm512_mul_ps(I1, s1));
  }
}

}  // namespace

void indexer_scores_int8_avx512(const IndexerInt8Query& query, int queries, int heads, int dim,
                                const float* const* rows, size_t offset, const int* n, float* scores, size_t ld) {
  int n_max = 0;
  for (int b = 0; b < queries; ++b) n_max = std::max(n_max, n[b]);
  if (n_max <= 0) return;
  ThreadPool& pool = DefaultThreadPool();
  // Chunks of whole 32-key blocks, a few per thread.
  int chunk = std::max(512, (n_max + pool.size() * 4 - 1) / (pool.size() * 4));
  chunk = (chunk + 31) / 32 * 32;
  const int chunks = (n_max + chunk - 1) / chunk;
  const size_t kt_ints = static_cast<size_t>(dim / 4) * 32;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    thread_local std::vector<int32_t> buf;
    if (buf.size() < kt_ints + 16 + 32) buf.resize(kt_ints + 16 + 32);
    // 64-byte aligned for the aligned loads.
    int32_t* Kt = buf.data() + ((64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64) / sizeof(int32_t);
    float* scale = reinterpret_cast<float*>(Kt + kt_ints);
    const int k0 = static_cast<int>(c) * chunk, k1 = std::min(n_max, k0 + chunk);
    for (int kb = k0; kb < k1; kb += 32) {
      // The next block's rows on their way while this one is scored.
      for (int j = kb + 32; j < std::min(k1, kb + 64); ++j) {
        const char* p = reinterpret_cast<const char*>(rows[j] + offset);
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + dim, _MM_HINT_T0);
      }
      Block(query, queries, heads, dim, rows, offset, n, scores, ld, kb, std::min(32, k1 - kb), Kt, scale);
    }
  });
}

}  // namespace moeserve::kernels::cpu
