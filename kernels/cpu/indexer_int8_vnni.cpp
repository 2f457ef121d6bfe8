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
//
// Where a long context's time went, and what this file does about it (1M
// keys at the flagship's 64 heads of 128 on a 2-core Zen 5, perf): the keys
// are scattered cache rows (one 132-byte key per ~2.4-2.9 KB row), so the
// step is as much a memory walk as integer products. The transpose is
// 16x16 dword transposes in registers (it was 32 x dim/4 scalar moves, each
// a demand miss when the prefetch had not landed); the next-but-one block's
// rows are prefetched a few keys per pass of heads, spread through the
// block's work, instead of 64 lines at once (which filled the miss buffers
// and stalled on the prefetches themselves), and the first line of each key
// eight blocks ahead, so that its page's translation is in the TLB by the
// time the whole key is fetched (a key per row: nearly every key its own
// 4 KiB page; 20% less CPU time at 1M); and the query's four codes are
// broadcast by vpbroadcastd's load form, no shuffle, once per head for the
// two products that share them (as vpdpbusd's {1to16} memory operand, one
// load per product, it ran ~20% slower with the keys in cache).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx512_transpose.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {

namespace {

constexpr int kBlockKeys = 32;
// Blocks between the one scored and the one whose keys are prefetched,
// whole keys and, further on, their first lines (for the TLB when keys sit
// in separate pages). The engine's pool keeps a layer's keys of 16 tokens
// together (KvPool::PartRow), and a layer's keys in a stripe of their own,
// so consecutive pool blocks' keys follow each other. A one-thread probe of
// 16 keys in a run of lines then a jump to the next pool block, at 1M keys
// of 36 bytes, read them in 11.4 ms with the hardware's prefetch alone, 5.1
// ms with software prefetch 2 runs ahead and 2.3 ms 8-16 runs ahead
// (contiguous: 1.9 ms); on the striped pool 4 and 8 blocks ahead are the
// best of 2 to 64, within the noise of each other (bench/README.md, "Stripes").
constexpr int kPrefetchBlocks = 8;
constexpr int kPrefetchPageBlocks = 16;

// acc += the u8 x s8 dot products of k and q, four bytes a lane. Inline
// assembly because GCC 12 copied the accumulators of the unrolled heads
// into other registers and back around every _mm512_dpbusd_epi32 (twice as
// many instructions as products, and a spill).
inline void Dpbusd(__m512i& acc, __m512i k, __m512i q) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(k), "v"(q)); }

// The four signed bytes at q in every lane, straight from memory (GCC 12
// made _mm512_set1_epi32 of a loaded int a move and a shuffle).
inline __m512i Codes4(const int8_t* q) {
  __m512i v;
  asm("vpbroadcastd %1, %0" : "=v"(v) : "m"(*reinterpret_cast<const int32_t*>(q)));
  return v;
}

__mmask16 Tail(int n) { return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u); }

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
// The block's dwords: key j < 16's bytes 4 d4 .. 4 d4 + 3 at K0[d4 * stride + j],
// key 16 + j's at K1[d4 * stride + j].
template <int HN>
inline void Heads(const int32_t* K0, const int32_t* K1, int stride, const int8_t* codes, const float* wt,
                  const int32_t* off, int dim, __m512& I0, __m512& I1) {
  static_assert(HN == 8 || HN == 4 || HN == 1);
  const auto init = [&](int i) { return _mm512_set1_epi32(i < HN ? -off[i] : 0); };
  __m512i a00 = init(0), a10 = a00, a01 = init(1), a11 = a01, a02 = init(2), a12 = a02, a03 = init(3), a13 = a03;
  __m512i a04 = init(4), a14 = a04, a05 = init(5), a15 = a05, a06 = init(6), a16 = a06, a07 = init(7), a17 = a07;
  const int d4n = dim / 4;
  for (int d4 = 0; d4 < d4n; ++d4) {
    const __m512i k0 = _mm512_loadu_si512(K0 + d4 * stride), k1 = _mm512_loadu_si512(K1 + d4 * stride);
    const int8_t* q = codes + 4 * d4;
#define MOESERVE_HEAD(i, A0, A1)                              \
  {                                                           \
    const __m512i qb = Codes4(q + static_cast<size_t>(i) * dim); \
    Dpbusd(A0, k0, qb);                                       \
    Dpbusd(A1, k1, qb);                                       \
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

// Kt[d4 * 32 + j] for the block's nk keys (zeros past nk and past dim),
// d4 up to d4n rounded up to 16, and the keys' scales.
void TransposeBlock(const float* const* rows, size_t offset, int kb, int nk, int d4n, int32_t* Kt, float* scale) {
  const int groups = (d4n + 15) / 16;
  for (int half = 0; half < 2; ++half)
    for (int g = 0; g < groups; ++g) {
      const __mmask16 m = Tail(d4n - 16 * g);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int j = 16 * half + i;
        r[i] = j < nk ? _mm512_maskz_loadu_epi32(m, rows[kb + j] + offset + 16 * g) : _mm512_setzero_si512();
      }
      Transpose16(r);
      for (int d = 0; d < 16; ++d) _mm512_store_si512(Kt + (16 * g + d) * 32 + 16 * half, r[d]);
    }
  for (int j = 0; j < kBlockKeys; ++j)
    if (j < nk) std::memcpy(&scale[j], rows[kb + j] + offset + d4n, sizeof(float));
    else scale[j] = 0.0f;
}

// Every cache line of keys [j0, j1) (the codes and the scale); a line the
// previous key ended in (keys stored together share lines) is not fetched again.
inline void PrefetchKeys(const float* const* rows, size_t offset, int j0, int j1, int bytes) {
  uintptr_t last = 0;
  for (int j = j0; j < j1; ++j) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(rows[j] + offset);
    uintptr_t a = p & ~uintptr_t{63};
    if (a == last) a += 64;
    for (; a < p + bytes; a += 64) _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0), last = a;
  }
}

// Keys ahead of the block being scored, prefetched while it is: [pf0, pf1)
// whole, [pg0, pg1) their first line only.
struct Ahead {
  int pf0, pf1, pg0, pg1;
};

// Every query's scores over the 32 keys at kb (nk of them valid) whose
// dwords are at K0, K1 (Heads) and scales in s0, s1; between() runs once
// per pass of 8 heads (the prefetches spread through the work).
template <class Between>
void ScoreKeys(const IndexerInt8Query& query, int queries, int heads, int dim, const int* n, float* scores, size_t ld,
               int kb, int nk, const int32_t* K0, const int32_t* K1, int stride, __m512 s0, __m512 s1,
               Between&& between) {
  for (int b = 0; b < queries; ++b) {
    if (kb >= n[b]) continue;
    const size_t qh = static_cast<size_t>(b) * heads;
    const int8_t* codes = query.codes + qh * dim;
    const float* wt = query.wt + qh;
    const int32_t* off = query.offset + qh;
    __m512 I0 = _mm512_setzero_ps(), I1 = _mm512_setzero_ps();
    int h = 0;
    // 8 heads a pass: 16 independent sums, each loaded piece of keys serving 8 heads.
    for (; h + 8 <= heads; h += 8) {
      between();
      Heads<8>(K0, K1, stride, codes + static_cast<size_t>(h) * dim, wt + h, off + h, dim, I0, I1);
    }
    for (; h + 4 <= heads; h += 4) Heads<4>(K0, K1, stride, codes + static_cast<size_t>(h) * dim, wt + h, off + h, dim, I0, I1);
    for (; h < heads; ++h) Heads<1>(K0, K1, stride, codes + static_cast<size_t>(h) * dim, wt + h, off + h, dim, I0, I1);
    const int valid = std::min(nk, n[b] - kb);
    float* out = scores + static_cast<size_t>(b) * ld + kb;
    _mm512_mask_storeu_ps(out, Tail(valid), _mm512_mul_ps(I0, s0));
    if (valid > 16) _mm512_mask_storeu_ps(out + 16, Tail(valid - 16), _mm512_mul_ps(I1, s1));
  }
}

// Scores of the block of nk keys at kb for every query; while it runs, the
// keys `ahead` are prefetched a few per pass of heads.
void Block(const IndexerInt8Query& query, int queries, int heads, int dim, const float* const* rows, size_t offset,
           const int* n, float* scores, size_t ld, int kb, int nk, int32_t* Kt, float* scale, Ahead ahead) {
  const int d4n = dim / 4;
  const int key_bytes = dim + 4;
  TransposeBlock(rows, offset, kb, nk, d4n, Kt, scale);
  const int passes = std::max(1, (heads + 7) / 8) * queries;
  const int per_pass = (ahead.pf1 - ahead.pf0 + passes - 1) / passes;
  const int pg_per_pass = (ahead.pg1 - ahead.pg0 + passes - 1) / passes;
  int pf = ahead.pf0, pg = ahead.pg0;
  const auto prefetch_some = [&] {
    const int e = std::min(ahead.pf1, pf + per_pass);
    PrefetchKeys(rows, offset, pf, e, key_bytes);
    pf = e;
    const int eg = std::min(ahead.pg1, pg + pg_per_pass);
    PrefetchKeys(rows, offset, pg, eg, 1);
    pg = eg;
  };
  ScoreKeys(query, queries, heads, dim, n, scores, ld, kb, nk, Kt, Kt + 16, 32, _mm512_loadu_ps(scale),
            _mm512_loadu_ps(scale + 16), prefetch_some);
  PrefetchKeys(rows, offset, pf, ahead.pf1, key_bytes);
  PrefetchKeys(rows, offset, pg, ahead.pg1, 1);
}

// The same over a cache by blocks (indexer_int8.hpp) whose size is not a
// multiple of 16 keys (GroupsOfBlocked scores the others where they lie):
// the step's keys are gathered into Kt first, and the keys 8 steps ahead
// prefetched.
void BlockOfBlocked(const IndexerInt8Query& query, int queries, int heads, int dim, const float* const* blocks,
                    int block_keys, const int* n, float* scores, size_t ld, int kb, int nk, int k1, int32_t* Kt,
                    float* scale) {
  const int d4n = dim / 4;
  const int p0 = std::min(k1, kb + kPrefetchBlocks * kBlockKeys), p1 = std::min(k1, p0 + kBlockKeys);
  for (int j = 0; j < kBlockKeys; ++j) {
    const int s = kb + j, slot = s % block_keys;
    const float* base = j < nk ? blocks[s / block_keys] : nullptr;
    for (int d4 = 0; d4 <= d4n; ++d4) {
      int32_t v = 0;
      if (base) std::memcpy(&v, base + static_cast<size_t>(d4) * block_keys + slot, 4);
      if (d4 < d4n) Kt[d4 * 32 + j] = v;
      else std::memcpy(&scale[j], &v, 4);
    }
  }
  ScoreKeys(query, queries, heads, dim, n, scores, ld, kb, nk, Kt, Kt + 16, 32, _mm512_loadu_ps(scale),
            _mm512_loadu_ps(scale + 16), [] {});
  PrefetchBlockedKeys(blocks, block_keys, dim, p0, p1);
}

// Walks a blocked cache's 16-key groups in key order without a division
// per step (pool blocks of block_keys, a multiple of 16, keys from `key`).
class GroupCursor {
 public:
  GroupCursor(const float* const* blocks, int block_keys, int key)
      : blocks_(blocks), block_keys_(block_keys), block_(key / block_keys), slot_(key % block_keys) {}
  // The group's dwords: key j's bytes 4 d4 .. 4 d4 + 3 at [d4 * block_keys + j].
  const int32_t* dwords() const { return reinterpret_cast<const int32_t*>(blocks_[block_]) + slot_; }
  void Next() {
    slot_ += 16;
    if (slot_ == block_keys_) slot_ = 0, ++block_;
  }

 private:
  const float* const* blocks_;
  int block_keys_, block_, slot_;
};

// Keys [k0, k1) of a cache by blocks of a multiple of 16 keys (k0 a multiple
// of 16), scored where they lie: 16 keys' dwords a vector load. While a
// 32-key step is scored, the two groups kPrefetchBlocks steps ahead are
// prefetched, a few lines per pass of heads (all at once they filled the
// miss buffers and the prefetches themselves stalled). Everything a step
// needs is carried from the step before, no division or pointer table
// arithmetic per step: at the long preset's 4 heads of 32 the products are
// a quarter of the step, and the bookkeeping had been most of the rest.
void GroupsOfBlocked(const IndexerInt8Query& query, int queries, int heads, int dim, const float* const* blocks,
                     int block_keys, const int* n, float* scores, size_t ld, int k0, int k1) {
  const int d4n = dim / 4;
  const size_t row = static_cast<size_t>(block_keys);
  const int lines = 2 * (d4n + 1), passes = std::max(1, heads / 8) * queries;
  const int per_pass = (lines + passes - 1) / passes;
  const auto scales = [&](const int32_t* K) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(K + static_cast<size_t>(d4n) * row));
  };
  const auto fetch_group = [&](const int32_t* g, int from, int to) {
    for (int l = from; l < to; ++l) _mm_prefetch(reinterpret_cast<const char*>(g + static_cast<size_t>(l) * row), _MM_HINT_T0);
  };
  GroupCursor at(blocks, block_keys, k0), ahead(blocks, block_keys, k0);
  int ahead_key = k0;
  // The first steps' keys up front; after that each step fetches the
  // groups kPrefetchBlocks steps on.
  for (; ahead_key < std::min(k1, k0 + kPrefetchBlocks * kBlockKeys); ahead_key += 16, ahead.Next())
    fetch_group(ahead.dwords(), 0, d4n + 1);
  for (int kb = k0; kb < k1; kb += kBlockKeys) {
    const int nk = std::min(kBlockKeys, k1 - kb);
    const int32_t* K0 = at.dwords();
    at.Next();
    const int32_t* K1 = K0;
    if (nk > 16) K1 = at.dwords(), at.Next();
    // The two groups ahead (none past k1: the block table may end there).
    const int32_t* A0 = nullptr;
    const int32_t* A1 = nullptr;
    if (ahead_key < k1) A0 = ahead.dwords(), ahead.Next(), ahead_key += 16;
    if (ahead_key < k1) A1 = ahead.dwords(), ahead.Next(), ahead_key += 16;
    int next = 0;
    const auto fetch = [&](int upto) {
      upto = std::min(upto, lines);
      if (next >= upto) return;
      // Lines [next, upto) of the pair: group A0's d4n + 1, then A1's.
      const int split = d4n + 1;
      if (A0 && next < split) fetch_group(A0, next, std::min(upto, split));
      if (A1 && upto > split) fetch_group(A1, std::max(next, split) - split, upto - split);
      next = upto;
    };
    ScoreKeys(query, queries, heads, dim, n, scores, ld, kb, nk, K0, K1, block_keys, scales(K0), scales(K1),
              [&] { fetch(next + per_pass); });
    fetch(lines);
  }
}

// The keys [0, n_max) in chunks of whole 32-key blocks across the pool,
// chunk(k0, k1, Kt, scale) scoring one.
template <class Chunk>
void SplitKeys(const int* n, int queries, int dim, Chunk&& chunk_fn) {
  int n_max = 0;
  for (int b = 0; b < queries; ++b) n_max = std::max(n_max, n[b]);
  if (n_max <= 0) return;
  ThreadPool& pool = DefaultThreadPool();
  // Chunks of whole 32-key blocks, many per thread: a thread slowed by
  // other work on the machine leaves its remaining chunks to the others.
  int chunk = std::max(1024, (n_max + pool.size() * 16 - 1) / (pool.size() * 16));
  chunk = (chunk + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  const int chunks = (n_max + chunk - 1) / chunk;
  const int d4_rows = (dim / 4 + 15) / 16 * 16;
  const size_t kt_ints = static_cast<size_t>(d4_rows) * kBlockKeys;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    thread_local std::vector<int32_t> buf;
    if (buf.size() < kt_ints + 16 + kBlockKeys) buf.resize(kt_ints + 16 + kBlockKeys);
    // 64-byte aligned for the aligned loads.
    int32_t* Kt = buf.data() + ((64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64) / sizeof(int32_t);
    float* scale = reinterpret_cast<float*>(Kt + kt_ints);
    const int k0 = static_cast<int>(c) * chunk, k1 = std::min(n_max, k0 + chunk);
    chunk_fn(k0, k1, Kt, scale);
  });
}

}  // namespace

void indexer_scores_int8_avx512(const IndexerInt8Query& query, int queries, int heads, int dim,
                                const float* const* rows, size_t offset, const int* n, float* scores, size_t ld) {
  SplitKeys(n, queries, dim, [&](int k0, int k1, int32_t* Kt, float* scale) {
    // The chunk's first blocks are fetched up front (whole keys, then first
    // lines); after that each block prefetches the ones further on.
    const auto at = [&](int blocks) { return std::min(k1, k0 + blocks * kBlockKeys); };
    PrefetchKeys(rows, offset, k0, at(kPrefetchBlocks), dim + 4);
    PrefetchKeys(rows, offset, at(kPrefetchBlocks), at(kPrefetchPageBlocks), 1);
    for (int kb = k0; kb < k1; kb += kBlockKeys) {
      const int pf0 = std::min(k1, kb + kPrefetchBlocks * kBlockKeys), pg0 = std::min(k1, kb + kPrefetchPageBlocks * kBlockKeys);
      const Ahead ahead{pf0, std::min(k1, pf0 + kBlockKeys), pg0, std::min(k1, pg0 + kBlockKeys)};
      Block(query, queries, heads, dim, rows, offset, n, scores, ld, kb, std::min(kBlockKeys, k1 - kb), Kt, scale, ahead);
    }
  });
}

void indexer_scores_int8_blocked_avx512(const IndexerInt8Query& query, int queries, int heads, int dim,
                                        const float* const* blocks, int block_keys, const int* n, float* scores,
                                        size_t ld) {
  SplitKeys(n, queries, dim, [&](int k0, int k1, int32_t* Kt, float* scale) {
    if (block_keys % 16 == 0) return GroupsOfBlocked(query, queries, heads, dim, blocks, block_keys, n, scores, ld, k0, k1);
    PrefetchBlockedKeys(blocks, block_keys, dim, k0, std::min(k1, k0 + kPrefetchBlocks * kBlockKeys));
    for (int kb = k0; kb < k1; kb += kBlockKeys)
      BlockOfBlocked(query, queries, heads, dim, blocks, block_keys, n, scores, ld, kb, std::min(kBlockKeys, k1 - kb),
                     k1, Kt, scale);
  });
}

}  // namespace moeserve::kernels::cpu
