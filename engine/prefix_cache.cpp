#include "prefix_cache.hpp"

#include <algorithm>

namespace moeserve::engine {

PrefixCache::Hit PrefixCache::Lookup(const std::vector<int>& tokens, int64_t max_length) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t len = static_cast<int64_t>(it->tokens.size());
    if (len > max_length || len > static_cast<int64_t>(tokens.size())) continue;
    if (best != entries_.end() && len <= static_cast<int64_t>(best->tokens.size())) continue;
    if (std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin())) best = it;
  }
  if (best == entries_.end()) return {};
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  const Entry& e = entries_.front();
  return {static_cast<int64_t>(e.tokens.size()), &e.blocks, &e.delta};
}

void PrefixCache::Insert(KvPool& pool, const std::vector<int>& tokens, int64_t length, const SequenceCache& cache) {
  if (length <= 0 || length % pool.block_tokens() != 0) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (static_cast<int64_t>(it->tokens.size()) == length && std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin())) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  Entry e;
  e.tokens.assign(tokens.begin(), tokens.begin() + length);
  e.blocks.assign(cache.blocks.begin(), cache.blocks.begin() + length / pool.block_tokens());
  for (int b : e.blocks) pool.Ref(b);
  e.delta = cache.delta;
  entries_.push_front(std::move(e));
  while (entries_.size() > max_entries_) EvictOne(pool);
}

bool PrefixCache::EvictOne(KvPool& pool) {
  if (entries_.empty()) return false;
  for (int b : entries_.back().blocks) pool.Unref(b);
  entries_.pop_back();
  return true;
}

void PrefixCache::Clear(KvPool& pool) {
  while (EvictOne(pool)) {
  }
}

}  // namespace moeserve::engine
