// The per-sequence caches of model.md: MLA/DSA keep, per token and layer, the
// latent c (kv_lora_rank), k_pe (qk_rope_head_dim) and, for DSA, the indexer
// key (index_head_dim); Gated DeltaNet keeps O(1) state per sequence (conv
// tails and S).
//
// KvPool is a paged allocator: fixed-size blocks of `block_tokens` tokens
// shared by all sequences, reference-counted so that the prefix cache and
// several sequences can hold the same full block. Allocation failure is an
// error value, never an abort.
//
// Thread safety: none; the engine's step thread owns the pool.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

class KvPool {
 public:
  // The pool's memory is mapped zeroed and touched only as blocks are used
  // (kernels::AllocateZeroedPages); throws std::bad_alloc when it cannot be
  // mapped. `stripe_starts` (see PartRow): the per-token float offsets where
  // a stripe begins, ascending, the first 0, all below floats_per_token;
  // empty means one stripe. Invalid starts throw std::invalid_argument.
  KvPool(int64_t num_blocks, int block_tokens, size_t floats_per_token, const std::vector<size_t>& stripe_starts = {});
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  Result<int> Allocate();  // refcount 1; kResourceExhausted when full
  void Ref(int block);
  void Unref(int block);   // frees at refcount 0
  int refcount(int block) const { return refs_[static_cast<size_t>(block)]; }

  // A block is block_tokens x floats_per_token floats. A family with one
  // kind of row uses it token by token (TokenRow). The moe-dsa-v1 graph
  // splits each token's floats into parts (a layer's MLA latent, a DSA
  // layer's indexer key, a GQA layer's keys and values) and keeps each
  // part's block_tokens rows together: the part at per-token offset o,
  // `floats` wide, starts block_tokens x o floats into the block. A step that
  // reads one part of every cached token (the DSA indexer) then streams it
  // instead of touching one cache line in every token's row.
  //
  // Stripes go one step further: the per-token floats are cut at the stripe
  // starts, and each stripe keeps its share of every block in a region of
  // its own, block after block. With a stripe per part, the indexer keys of
  // a layer for consecutive blocks (a long sequence's blocks are handed out
  // in order) are one contiguous stream, not a 576-byte run every 11 KB.
  // Inside a stripe a block keeps the layout above, so one stripe is the
  // plain block layout.
  float* PartRow(int block, int slot, size_t part_offset, size_t part_floats) {
    const Stripe& s = stripes_[stripe_of_[part_offset]];
    return s.base + static_cast<size_t>(block) * block_tokens_ * s.floats +
           static_cast<size_t>(block_tokens_) * (part_offset - s.start) + static_cast<size_t>(slot) * part_floats;
  }
  // A token's whole row: only for a pool of one stripe (the families that
  // use rows give none).
  float* TokenRow(int block, int slot) {
    return data_ + (static_cast<size_t>(block) * block_tokens_ + static_cast<size_t>(slot)) * floats_per_token_;
  }
  const float* TokenRow(int block, int slot) const {
    return data_ + (static_cast<size_t>(block) * block_tokens_ + static_cast<size_t>(slot)) * floats_per_token_;
  }
  // A block's floats in the one-stripe layout (block_floats() of them, to or
  // from bytes of any alignment), whatever the stripes: what the disk tier
  // stores, so its files do not depend on how a pool is striped.
  size_t block_floats() const { return static_cast<size_t>(block_tokens_) * floats_per_token_; }
  void CopyBlockOut(int block, void* out) const;
  void CopyBlockIn(int block, const void* in);
  void CopyBlock(int dst, int src);

  int block_tokens() const { return block_tokens_; }
  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  size_t floats_per_token() const { return floats_per_token_; }
  size_t num_stripes() const { return stripes_.size(); }

 private:
  // The checked (start, width) of each stripe, then the pool made from them.
  static std::vector<std::pair<size_t, size_t>> StripeSpans(size_t floats_per_token, const std::vector<size_t>& starts);
  KvPool(int64_t num_blocks, int block_tokens, size_t floats_per_token,
         const std::vector<std::pair<size_t, size_t>>& spans);
  struct Stripe {
    size_t start;   // per-token float offset
    size_t floats;  // per-token floats
    float* base;    // block 0's share
  };
  int block_tokens_;
  size_t floats_per_token_;
  size_t bytes_;
  float* data_;
  std::vector<Stripe> stripes_;
  std::vector<uint32_t> stripe_of_;  // per-token offset -> stripe
  std::vector<int> refs_;
  std::vector<int> free_;
};

// State of one Gated DeltaNet layer for one sequence.
struct DeltaLayerState {
  std::vector<float> conv_tail;  // [conv_size-1, q+k+v channels]: the last pre-conv inputs
  std::vector<float> S;          // [heads, head_k_dim, head_v_dim]
};

struct SequenceCache {
  std::vector<int> blocks;              // block table: position p lives in blocks[p / block_tokens]
  std::vector<DeltaLayerState> delta;   // indexed by layer; empty for attention layers
  int64_t length = 0;                   // tokens whose state is in the cache
  // Expert parallelism led by rank 0 (Model::SetGroup): the key followers
  // know the sequence by, and the group epoch it started in.
  uint64_t ep_key = 0;
  uint64_t ep_group = 0;
  // Multi-token prediction (a model with its MTP module loaded): the trunk's
  // last hidden rows (after the last layer, before the final norm; up to 8)
  // of the latest Forward, [rows, hidden size], the first at position
  // mtp_hidden_pos0. The MTP module reads the row at the position before
  // the next segment, or at cache length - 1 for a draft (after a rollback
  // too); a position outside them gets no MTP row or draft.
  std::vector<float> mtp_hidden;
  int64_t mtp_hidden_pos0 = 0;
};

// Makes the block table cover `new_length` tokens (allocating as needed).
Status EnsureBlocks(KvPool& pool, SequenceCache& cache, int64_t new_length);
// Drops every block reference of the cache.
void ReleaseBlocks(KvPool& pool, SequenceCache& cache);

}  // namespace moeserve::engine
