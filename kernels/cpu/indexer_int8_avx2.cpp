// The int8 indexer scores on AVX2 without VNNI (the avx2 set's
// indexer_scores_int8): 16 keys at a time, their codes transposed so that
// each 32-bit lane holds four consecutive codes of one key, signed (the
// stored byte - 128), then per head and four dims vpmaddubsw of the head's
// four |codes| (unsigned) against the key codes with the head's signs
// applied (vpsignb), vpmaddwd by ones, and a 32-bit add. vpmaddubsw adds
// two products into 16 bits with saturation: the stored unsigned bytes
// (up to 255) against codes up to 127 could reach 64,770 and saturate, the
// signed codes reach at most 2 x 127 x 127 = 32,258, so every sum is exact
// and dot_h = sum_d q[d] p_h[d], the reference's integer (which it reaches
// as sum (q[d] + 128) p_h[d] - offset). The epilogue is the reference's:
// ReLU in integers, one conversion, the heads' fmas in head order, the
// key's scale last, lane by lane.
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

constexpr int kBlockKeys = 16;

// acc += the exact dot of the signed key codes k (four a lane) with the
// head's four codes, given as their magnitudes (pabs) and themselves (p,
// for the signs).
inline __m256i DotAdd(__m256i acc, __m256i k, __m256i p, __m256i pabs, __m256i ones) {
  const __m256i pairs = _mm256_maddubs_epi16(pabs, _mm256_sign_epi8(k, p));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
}

inline __m256i Codes4(const int8_t* codes) {
  int32_t four;
  std::memcpy(&four, codes, 4);
  return _mm256_set1_epi32(four);
}

// Head i's ReLU'd dots (a0: keys 0-7, a1: 8-15) folded into I0, I1.
inline void Fold(__m256i a0, __m256i a1, float wt, __m256& I0, __m256& I1) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256 w = _mm256_set1_ps(wt);
  I0 = _mm256_fmadd_ps(w, _mm256_cvtepi32_ps(_mm256_max_epi32(a0, zero)), I0);
  I1 = _mm256_fmadd_ps(w, _mm256_cvtepi32_ps(_mm256_max_epi32(a1, zero)), I1);
}

// HN (4 or 1) heads of one query over the block's 16 keys, folded into I0
// and I1 in head order.
template <int HN>
inline void Heads(const int32_t* Kt, const int8_t* codes, const float* wt, int dim, __m256& I0, __m256& I1) {
  static_assert(HN == 4 || HN == 1);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a00 = _mm256_setzero_si256(), a10 = a00, a01 = a00, a11 = a00, a02 = a00, a12 = a00, a03 = a00, a13 = a00;
  const int d4n = dim / 4;
  for (int d4 = 0; d4 < d4n; ++d4) {
    const __m256i k0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(Kt + d4 * 16));
    const __m256i k1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(Kt + d4 * 16 + 8));
#define MOESERVE_HEAD(i, A0, A1)                                        \
  {                                                                     \
    const __m256i p = Codes4(codes + static_cast<size_t>(i) * dim + 4 * d4); \
    const __m256i pabs = _mm256_abs_epi8(p);                            \
    A0 = DotAdd(A0, k0, p, pabs, ones);                                 \
    A1 = DotAdd(A1, k1, p, pabs, ones);                                 \
  }
    MOESERVE_HEAD(0, a00, a10)
    if constexpr (HN == 4) {
      MOESERVE_HEAD(1, a01, a11)
      MOESERVE_HEAD(2, a02, a12)
      MOESERVE_HEAD(3, a03, a13)
    }
#undef MOESERVE_HEAD
  }
  Fold(a00, a10, wt[0], I0, I1);
  if constexpr (HN == 4) {
    Fold(a01, a11, wt[1], I0, I1);
    Fold(a02, a12, wt[2], I0, I1);
    Fold(a03, a13, wt[3], I0, I1);
  }
}

// Stored bytes (code + 128) back to signed codes, four at a time.
constexpr uint32_t kFlip = 0x80808080u;

// Kt and scale of keys [kb, kb + nk) of a row-form cache (zeros past nk).
void FillFromRows(const float* const* rows, size_t offset, int d4n, int kb, int nk, int32_t* Kt, float* scale) {
  for (int j = 0; j < kBlockKeys; ++j) {
    if (j < nk) {
      const float* row = rows[kb + j] + offset;
      const uint32_t* src = reinterpret_cast<const uint32_t*>(row);
      for (int d4 = 0; d4 < d4n; ++d4) Kt[d4 * 16 + j] = static_cast<int32_t>(src[d4] ^ kFlip);
      std::memcpy(&scale[j], row + d4n, sizeof(float));
    } else {
      for (int d4 = 0; d4 < d4n; ++d4) Kt[d4 * 16 + j] = 0;
      scale[j] = 0.0f;
    }
  }
}

// The same from a cache by blocks (indexer_int8.hpp).
void FillFromBlocks(const float* const* blocks, int block_keys, int d4n, int kb, int nk, int32_t* Kt, float* scale) {
  for (int j = 0; j < kBlockKeys; ++j) {
    if (j < nk) {
      const int s = kb + j, slot = s % block_keys;
      const uint32_t* src = reinterpret_cast<const uint32_t*>(blocks[s / block_keys]);
      for (int d4 = 0; d4 < d4n; ++d4)
        Kt[d4 * 16 + j] = static_cast<int32_t>(src[static_cast<size_t>(d4) * block_keys + slot] ^ kFlip);
      std::memcpy(&scale[j], src + static_cast<size_t>(d4n) * block_keys + slot, sizeof(float));
    } else {
      for (int d4 = 0; d4 < d4n; ++d4) Kt[d4 * 16 + j] = 0;
      scale[j] = 0.0f;
    }
  }
}

// Every query's scores over the 16 keys at kb (nk of them valid) in Kt.
void ScoreBlock(const IndexerInt8Query& query, int queries, int heads, int dim, const int* n, float* scores, size_t ld,
                int kb, int nk, const int32_t* Kt, const float* scale) {
  const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
  for (int b = 0; b < queries; ++b) {
    if (kb >= n[b]) continue;
    const size_t qh = static_cast<size_t>(b) * heads;
    const int8_t* codes = query.codes + qh * dim;
    const float* wt = query.wt + qh;
    __m256 I0 = _mm256_setzero_ps(), I1 = _mm256_setzero_ps();
    int h = 0;
    for (; h + 4 <= heads; h += 4) Heads<4>(Kt, codes + static_cast<size_t>(h) * dim, wt + h, dim, I0, I1);
    for (; h < heads; ++h) Heads<1>(Kt, codes + static_cast<size_t>(h) * dim, wt + h, dim, I0, I1);
    const int valid = std::min(nk, n[b] - kb);
    alignas(32) float out[kBlockKeys];
    _mm256_store_ps(out, _mm256_mul_ps(I0, s0));
    _mm256_store_ps(out + 8, _mm256_mul_ps(I1, s1));
    std::memcpy(scores + static_cast<size_t>(b) * ld + kb, out, static_cast<size_t>(valid) * sizeof(float));
  }
}

// The keys split in chunks of whole 16-key blocks across the pool; fill(kb,
// nk, Kt, scale) transposes a block of keys, prefetch(kb, k1) asks for the
// next one's.
template <class Fill, class Prefetch>
void Scores(const IndexerInt8Query& query, int queries, int heads, int dim, const int* n, float* scores, size_t ld,
            Fill&& fill, Prefetch&& prefetch) {
  int n_max = 0;
  for (int b = 0; b < queries; ++b) n_max = std::max(n_max, n[b]);
  if (n_max <= 0) return;
  ThreadPool& pool = DefaultThreadPool();
  int chunk = std::max(1024, (n_max + pool.size() * 16 - 1) / (pool.size() * 16));
  chunk = (chunk + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  const int chunks = (n_max + chunk - 1) / chunk;
  const size_t kt_ints = static_cast<size_t>(dim / 4) * kBlockKeys;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    thread_local std::vector<int32_t> buf;
    if (buf.size() < kt_ints + 8 + kBlockKeys) buf.resize(kt_ints + 8 + kBlockKeys);
    // 32-byte aligned for the aligned loads.
    int32_t* Kt = buf.data() + ((32 - reinterpret_cast<uintptr_t>(buf.data()) % 32) % 32) / sizeof(int32_t);
    float* scale = reinterpret_cast<float*>(Kt + kt_ints);
    const int k0 = static_cast<int>(c) * chunk, k1 = std::min(n_max, k0 + chunk);
    for (int kb = k0; kb < k1; kb += kBlockKeys) {
      prefetch(kb + kBlockKeys, std::min(k1, kb + 2 * kBlockKeys));
      const int nk = std::min(kBlockKeys, k1 - kb);
      fill(kb, nk, Kt, scale);
      ScoreBlock(query, queries, heads, dim, n, scores, ld, kb, nk, Kt, scale);
    }
  });
}

}  // namespace

void indexer_scores_int8_avx2(const IndexerInt8Query& query, int queries, int heads, int dim,
                              const float* const* rows, size_t offset, const int* n, float* scores, size_t ld) {
  Scores(
      query, queries, heads, dim, n, scores, ld,
      [&](int kb, int nk, int32_t* Kt, float* scale) { FillFromRows(rows, offset, dim / 4, kb, nk, Kt, scale); },
      // The next block's rows on their way while this one is scored.
      [&](int j0, int j1) {
        for (int j = j0; j < j1; ++j) _mm_prefetch(reinterpret_cast<const char*>(rows[j] + offset), _MM_HINT_T0);
      });
}

void indexer_scores_int8_blocked_avx2(const IndexerInt8Query& query, int queries, int heads, int dim,
                                      const float* const* blocks, int block_keys, const int* n, float* scores,
                                      size_t ld) {
  Scores(
      query, queries, heads, dim, n, scores, ld,
      [&](int kb, int nk, int32_t* Kt, float* scale) {
        FillFromBlocks(blocks, block_keys, dim / 4, kb, nk, Kt, scale);
      },
      // The next 16 keys' dwords and scales on their way.
      [&](int j0, int j1) { PrefetchBlockedKeys(blocks, block_keys, dim, j0, j1); });
}

}  // namespace moeserve::kernels::cpu
