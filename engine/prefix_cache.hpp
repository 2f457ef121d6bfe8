// Prefix cache: prompts that repeat an earlier prompt's prefix (every agent
// turn re-sends the whole history) reuse its full KV blocks and the DeltaNet
// state snapshot taken at the end of that prefix. Entries hold references on
// their blocks; least recently used entries are evicted when the pool needs
// room.
#pragma once

#include <cstdint>
#include <list>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"

namespace moeserve::engine {

class PrefixCache {
 public:
  explicit PrefixCache(size_t max_entries = 4096) : max_entries_(max_entries) {}

  struct Hit {
    int64_t length = 0;  // tokens reused (a multiple of the block size)
    const std::vector<int>* blocks = nullptr;
    const std::vector<DeltaLayerState>* delta = nullptr;
  };
  // The longest cached prefix of `tokens` no longer than max_length.
  Hit Lookup(const std::vector<int>& tokens, int64_t max_length);
  // Records tokens[0, length) with the cache's first length/block_tokens blocks
  // and the DeltaNet state at that point (length must be block-aligned).
  void Insert(KvPool& pool, const std::vector<int>& tokens, int64_t length, const SequenceCache& cache);
  // Drops the least recently used entry; false when empty.
  bool EvictOne(KvPool& pool);
  void Clear(KvPool& pool);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<int> tokens;
    std::vector<int> blocks;
    std::vector<DeltaLayerState> delta;
  };
  std::list<Entry> entries_;  // front: most recently used
  size_t max_entries_;
};

}  // namespace moeserve::engine
