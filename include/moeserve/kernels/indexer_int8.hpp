// The DSA indexer's scores over int8 keys (ModelOptions::indexer_scores ==
// kInt8): keys are quantised once, when written to the cache, queries once
// per row, and a key's score is integer dot products (AVX-512 VNNI's
// vpdpbusd where the CPU has it) scaled once.
//
// Key, in a cache row at `offset` floats: dim bytes, each the symmetric int8
// code q = round(k / s) in [-127, 127] stored as the unsigned byte q + 128,
// then the fp32 scale s = max|k| / 127 (one per key: the score is one dot
// over the whole key, so a per-key scale factors out of it; DeepSeek-V3.2's
// indexer keys are one 128-element group, its act_quant group, so per key is
// its grouping too). kIndexerInt8KeyFloats(dim) floats in all: dim / 4 + 1
// (dim a multiple of 4), 33 for dim 128 where fp32 took 128.
//
// Query, per head h: symmetric int8 codes p_h (scale t_h = max|q_h| / 127),
// the weight folded with the scale, wt_h = w_h * t_h, and the offset the
// unsigned key bytes add, o_h = 128 * sum_d p_h[d]. Then, exactly in integers,
//   dot_h(s) = sum_d (q_s[d] + 128) * p_h[d] - o_h = sum_d q_s[d] p_h[d],
// and, since ReLU(a x) = a ReLU(x) for a = s t_h >= 0,
//   score(s) = s_s * (sum over h in order of fma(wt_h, float(max(0, dot_h)), .)),
// the sum starting at 0 and taken head by head with one rounding per fma:
// every variant computes this same expression, so they agree bit for bit
// with the reference (the integer parts exactly, the float parts by the
// fixed order). |dot_h| <= dim * 127^2 < 2^24 for dim <= 1040: the integer
// converts to float exactly.
//
// Keys by blocks (the engine's KV pool keeps a DSA layer's keys of one pool
// block together, KvPool::PartRow): the block_keys keys of block g start at
// blocks[g], transposed: dword Kt[d4 * block_keys + j] holds key j's stored
// bytes 4 d4 .. 4 d4 + 3, then the block's scales [block_keys]. The same
// floats as block_keys keys in rows, and the same scores; the VNNI kernel
// loads 16 keys' four bytes as one vector, so it scores a block where it lies
// instead of transposing every key first.
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeserve::kernels {

// Floats a key occupies in a cache row (dim bytes and its scale).
constexpr size_t IndexerInt8KeyFloats(int dim) { return static_cast<size_t>(dim) / 4 + 1; }
// The dims the int8 scores accept: a positive multiple of 4, at most 1024.
constexpr bool IndexerInt8DimSupported(int dim) { return dim > 0 && dim % 4 == 0 && dim <= 1024; }

// Writes key k [dim] into dst (IndexerInt8KeyFloats(dim) floats).
void QuantizeIndexerKeyInt8(const float* k, int dim, float* dst);
// The key's values as the scores see them (code x scale), for tests.
void DequantizeIndexerKeyInt8(const float* src, int dim, float* k);

// One query's heads, quantised: codes [heads, dim], wt [heads], offset [heads].
struct IndexerInt8Query {
  const int8_t* codes;
  const float* wt;
  const int32_t* offset;
};
// Quantises query q [heads, dim] with head weights w [heads] into codes,
// wt and offset (the layout above).
void QuantizeIndexerQueryInt8(const float* q, const float* w, int heads, int dim, int8_t* codes, float* wt,
                              int32_t* offset);

// scores[b * ld + s] for s < n[b]: query b's (query [b] of `queries`,
// codes at b * heads * dim, wt and offset at b * heads) scores over keys
// rows[s] + offset, as above; single-threaded, the ground truth.
void IndexerScoresInt8Ref(const IndexerInt8Query& query, int queries, int heads, int dim, const float* const* rows,
                          size_t offset, const int* n, float* scores, size_t ld);
// Quantises key k [dim] into slot `slot` of a block of block_keys keys at
// block (the layout above; IndexerInt8KeyFloats(dim) x block_keys floats).
void StoreIndexerKeyInt8Blocked(const float* k, int dim, float* block, int block_keys, int slot);
// Slot `slot`'s key in row form (IndexerInt8KeyFloats(dim) floats into row).
void LoadIndexerKeyInt8Blocked(const float* block, int dim, int block_keys, int slot, float* row);
// Prefetches the cache lines of keys [j0, j1) of a cache by blocks (per
// block, each row of dwords and the scales: a run of the keys' slots).
void PrefetchBlockedKeys(const float* const* blocks, int block_keys, int dim, int j0, int j1);
// As IndexerScoresInt8Ref, key s in block s / block_keys, slot s % block_keys;
// the same scores as the row form of the same keys.
void IndexerScoresInt8BlockedRef(const IndexerInt8Query& query, int queries, int heads, int dim,
                                 const float* const* blocks, int block_keys, const int* n, float* scores, size_t ld);

// The integer part alone, for tests: dot_h(s) of one query and key.
int32_t IndexerInt8Dot(const int8_t* codes, int32_t offset, const float* key_row, int dim);

}  // namespace moeserve::kernels
