// What a context costs in memory for a loaded model, and how large a KV pool
// a memory budget holds (docs/model-format.md, "Memory per token").
//
// A sequence of N tokens holds ceil(N / block_tokens) whole pool blocks of
// cache_floats_per_token() floats per token row (MLA/DSA latents, rope keys
// and indexer keys, gated GQA's keys and values: every attention layer
// together), plus its recurrent state, the same size whatever N is (each
// Gated DeltaNet layer's conv tails and S). The engine refuses at Submit a
// request whose prompt + max_tokens needs more than the whole pool, naming
// these figures.
#pragma once

#include <cstdint>
#include <string>

#include "moeserve/engine/kv_pool.hpp"

namespace moeserve::engine {

class FamilyModel;

struct ContextBytes {
  int64_t tokens = 0;
  int64_t blocks = 0;       // pool blocks the tokens occupy (whole blocks)
  int64_t pool_bytes = 0;   // blocks * block_tokens * floats_per_token * 4
  int64_t state_bytes = 0;  // recurrent state of one sequence (0 without DeltaNet layers)
  int64_t total() const { return pool_bytes + state_bytes; }
};

// Bytes of a sequence's recurrent state: the floats of every DeltaNet layer's
// conv tail and S in a fresh cache (FamilyModel::NewSequence).
int64_t RecurrentStateBytes(const SequenceCache& fresh);

// The cost of `tokens` tokens, from the pool's row size, the block size and
// the per-sequence state bytes (RecurrentStateBytes).
ContextBytes ContextCost(size_t floats_per_token, int block_tokens, int64_t state_bytes, int64_t tokens);
// The same for a loaded model (calls model.NewSequence once).
ContextBytes ContextCost(const FamilyModel& model, int block_tokens, int64_t tokens);

// The pool tokens (a multiple of block_tokens, at least one block) that
// `budget_bytes` holds once `sequences` recurrent states are set aside:
// what EngineOptions::cache_memory_bytes sizes the pool with.
int64_t PoolTokensFor(int64_t budget_bytes, size_t floats_per_token, int block_tokens, int64_t state_bytes,
                      int sequences);

// "1.5 GiB"-style figure for messages.
std::string HumanBytes(int64_t bytes);

}  // namespace moeserve::engine
