// Decode-time attention kernels over a paged cache (model.md 5.1, 5.2), each
// a plain function with a reference beside it:
//   - absorbed MLA decode for one query over a set of cached rows,
//   - the DSA lightning indexer's scores over cached keys,
//   - top-k selection in O(n) (ties to the lower index).
// Cache rows are passed as an array of row pointers (one per cached token;
// a paged pool makes them non-contiguous) plus this layer's float offset in
// a row: [c (kv_lora) | k_pe (rope)] for MLA, [ik (index_dim)] for the indexer.
//
// The fast variants are the KernelSet families mla_decode and indexer_scores
// (cpu_kernels.hpp): they read each cache row once for all heads (not once
// per head), split the keys across the kernel thread pool (each chunk keeping
// its own softmax maxima and sums, merged after), and use their Isa's dot
// products (AVX-512 takes 8 heads per pass over a row). They differ from the
// reference only by fp32 summation order.
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <cstddef>

namespace moeserve::kernels {

enum class Isa;  // cpu_kernels.hpp

struct MlaDecodeShape {
  int heads;
  int kv_lora;
  int rope;
  float scale;  // softmax scale (YaRN m^2 included)
  // Optional, per head: it attends to the first visible[h] (>= 1) keys only.
  // Several queries of one sequence run as one call this way, their heads
  // side by side, each seeing the keys up to its own position (causal
  // prefill); every key row is then read once for all of them.
  const int* visible = nullptr;
};

// For each head h: p = softmax over keys of scale * (q_abs[h] . c_s + q_pe[h] . kpe_s),
// lat[h] = sum_s p_s c_s.  q_abs [heads, kv_lora], q_pe [heads, rope],
// lat [heads, kv_lora]. keys: indices into rows (nullptr: rows 0..n_keys-1).
void MlaDecodeRef(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe, const float* const* rows,
                  size_t offset, const int* keys, int n_keys, float* lat);

// Several queries, each with its own key list (DSA's sparse rows in
// prefill): query j's heads [j * heads, (j + 1) * heads) of q_abs, q_pe and
// lat attend over keys[j][0 .. n_keys[j]) (n_keys[j] >= 1) exactly as
// MlaDecodeRef would; shape.visible is not used. The fast variants run the
// queries in parallel (AVX-512: a query's heads as the vector lanes).
void MlaRowsRef(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe, const float* const* rows,
                size_t offset, const int* const* keys, const int* n_keys, float* lat);
// The BF16-dot attention kernels round the cached rows a call reads once
// per call, into a buffer of the calling thread that they keep for the next
// call up to this size, and release past it when the call ends.
inline constexpr size_t kAttentionScratchKeepBytes = size_t{16} << 20;
// What the calling thread's buffer holds now (0 where those kernels never ran).
size_t AttentionScratchHeldBytes();
// scores[s] = sum_j w[j] * ReLU(iq[j] . ik_s) for s in [0, n); iq [heads, dim].
void IndexerScoresRef(const float* iq, const float* w, int heads, int dim, const float* const* rows, size_t offset,
                      int n, float* scores);

// Several queries of one sequence at once (prefill): query b < queries
// scores keys [0, n[b]) into scores + b * ld exactly as IndexerScoresRef
// would (iq [queries, heads, dim], w [queries, heads]); the fast variants
// read each key row once for all the queries (AVX-512: 32 keys transposed
// into registers' lanes against every query's heads), instead of once per
// query, which left the per-query form bound by re-reading the cache.
void IndexerScoresBatchRef(const float* iq, const float* w, int queries, int heads, int dim, const float* const* rows,
                           size_t offset, const int* n, float* scores, size_t ld);

// Grouped-query attention with a sink logit per head, causal or banded (the
// gpt-oss layers): heads / kv_heads query heads share each cached key/value
// head. A cache row (one token) holds this layer's keys [kv_heads, head_dim]
// at key_offset floats and its values at value_offset.
struct GqaSinkShape {
  int heads;
  int kv_heads;
  int head_dim;
  float scale;         // on q . k
  const float* sinks;  // [heads]: one more logit in each head's softmax denominator, with no value
  size_t key_offset;
  size_t value_offset;
};

// For query i < queries and head h: p = softmax over the keys j in
// [first[i], last[i]] (first[i] <= last[i]) of scale * q[i, h] . k_j, the
// sink sinks[h] one more term of its denominator; out[i, h] = sum_j p_j v_j.
// rows[j] is the cache row of sequence position j; q, out [queries, heads,
// head_dim]. The reference takes each (query, head) alone, its
// exponentials and denominator in double, single-threaded.
void GqaSinkAttentionRef(const GqaSinkShape& shape, int queries, const float* q, const float* const* rows,
                         const int* first, const int* last, float* out);

// The same on an Isa's kernels, over the kernel thread pool:
// Isa::kReference runs the reference per query in parallel; the others run
// a tiled online-softmax form (flash attention): a task takes one key/value
// head and a block of consecutive queries (all of their heads sharing it),
// reads each key and value row once per block for all of them, in tiles
// of 64 keys, with the queries' heads as the vector lanes (AVX-512 where
// the Isa is kAvx512 or falls back to it; plain loops otherwise). It differs from the
// reference by fp32 summation order and a float exponential (within 2 ulp).
void GqaSinkAttention(const GqaSinkShape& shape, int queries, const float* q, const float* const* rows,
                      const int* first, const int* last, float* out, Isa isa);

// The k (<= n) indices with the largest scores, ties to the lower index
// (-0 and +0 tie), written in ascending order. Scores are not NaN.
// TopKIndicesRef: O(n), a radix select of the k-th largest score, then one
// pass in index order. TopKIndices: the same selection bit for bit, through
// the streamed threshold selection (topk_stream.hpp) when n >= 4k.
void TopKIndices(const float* scores, int n, int k, int* out);
void TopKIndicesRef(const float* scores, int n, int k, int* out);

}  // namespace moeserve::kernels
