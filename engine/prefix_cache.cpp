#include "prefix_cache.hpp"

#include <algorithm>
#include <chrono>

#include "moeserve/common/log.hpp"

namespace moeserve::engine {

namespace {

// Per heap allocation: malloc's chunk header and rounding to 16 bytes, on
// average; without it a cache of many short prefixes would be undercounted.
constexpr int64_t kAllocOverhead = 16;

template <class T>
int64_t VectorBytes(const std::vector<T>& v) {
  return v.capacity() == 0 ? 0 : static_cast<int64_t>(v.capacity() * sizeof(T)) + kAllocOverhead;
}

// A std::list node: the two links and the element.
constexpr int64_t kListNodeBytes = static_cast<int64_t>(2 * sizeof(void*)) + kAllocOverhead;

double SteadyNow() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool Begins(const std::vector<int>& whole, const std::vector<int>& prefix) {
  return prefix.size() <= whole.size() && std::equal(prefix.begin(), prefix.end(), whole.begin());
}

}  // namespace

PrefixCache::~PrefixCache() {
  if (!disk_ || !disk_pool_) return;
  // Least recently used first, so that the tier's own order matches memory's.
  try {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) Spill(*disk_pool_, *it);
  } catch (...) {  // a cache: what is not written is recomputed
  }
}

void PrefixCache::AttachDiskTier(std::unique_ptr<PrefixDiskTier> tier, KvPool& pool) {
  disk_ = std::move(tier);
  disk_pool_ = &pool;
}

void PrefixCache::Spill(const KvPool& pool, const Entry& e) {
  if (!disk_ || !e.images.empty()) return;
  if (auto st = disk_->Write(pool, e.tokens, e.blocks, e.delta, e.partition, e.is_public); !st)
    log::Warn("prefix cache: entry of " + std::to_string(e.tokens.size()) + " tokens not written to disk: " +
              st.error().ToString());
}

PrefixCache::Hit PrefixCache::LookupOrRestore(KvPool& pool, const std::vector<int>& tokens, int64_t max_length,
                                              const std::string& partition, int64_t public_length,
                                              std::span<const ImageSpan> images) {
  Hit hit = Lookup(tokens, max_length, partition, public_length, images);
  if (!disk_) return hit;
  int64_t cap = max_length;  // entries on disk end before the first image
  for (const ImageSpan& s : images) cap = std::min(cap, s.offset);
  disk_->ExpireOld();
  const std::optional<PrefixDiskTier::Found> found = disk_->Find(tokens, cap, partition, public_length, hit.length);
  if (!found) return hit;
  Result<PrefixDiskTier::Restored> restored = disk_->Read(pool, *found, tokens, partition);
  if (!restored) {
    if (restored.error().code() != ErrorCode::kResourceExhausted)
      log::Warn("prefix cache: " + restored.error().ToString());
    return hit;
  }
  SequenceCache loaded;
  loaded.blocks = std::move(restored->blocks);
  loaded.delta = std::move(restored->delta);
  loaded.length = found->length;
  try {
    Insert(pool, tokens, found->length, loaded, partition, found->is_public, {});
  } catch (...) {
    ReleaseBlocks(pool, loaded);
    throw;
  }
  ReleaseBlocks(pool, loaded);  // the entry holds its own references
  // Insert may have evicted the memory hit: look again.
  return Lookup(tokens, max_length, partition, public_length, images);
}

int64_t PrefixCache::HeapBytes(const Entry& e) {
  int64_t n = kListNodeBytes + static_cast<int64_t>(sizeof(Entry));
  n += VectorBytes(e.tokens) + VectorBytes(e.blocks) + VectorBytes(e.delta) + VectorBytes(e.images);
  for (const ImageKey& k : e.images) n += static_cast<int64_t>(k.content_hash.capacity());
  for (const DeltaLayerState& d : e.delta) n += VectorBytes(d.conv_tail) + VectorBytes(d.S);
  return n;
}

int64_t PrefixCache::state_bytes() const {
  return entry_heap_bytes_ + (cache_refs_.capacity() ? TableBytes() + kAllocOverhead : 0);
}

PrefixCacheStats PrefixCache::Stats() const {
  PrefixCacheStats s = counters_;
  s.kv_bytes = kv_bytes();
  s.state_bytes = state_bytes();
  s.bytes = bytes();
  s.limit_bytes = max_bytes_;
  s.entries = static_cast<int64_t>(entries_.size());
  if (disk_) disk_->FillStats(s);
  const double now = SteadyNow();
  for (const Entry& e : entries_) {
    if (!Pinned(e, now)) continue;
    ++s.pinned_entries;
    s.pinned_bytes += EntryBytes(e);
  }
  return s;
}

std::vector<PrefixCache::ImageKey> PrefixCache::ImageKeys(std::span<const ImageSpan> images, int64_t length) {
  std::vector<ImageKey> keys;
  for (const ImageSpan& s : images)
    if (s.offset < length) keys.push_back({s.offset, s.image.content_hash});
  return keys;
}

bool PrefixCache::SameImages(const std::vector<ImageKey>& keys, std::span<const ImageSpan> images, int64_t length) {
  size_t i = 0;
  for (const ImageSpan& s : images) {
    if (s.offset >= length) continue;
    if (i >= keys.size() || keys[i].offset != s.offset || keys[i].content_hash != s.image.content_hash) return false;
    ++i;
  }
  return i == keys.size();
}

PrefixCache::Hit PrefixCache::Lookup(const std::vector<int>& tokens, int64_t max_length, const std::string& partition,
                                     int64_t public_length, std::span<const ImageSpan> images) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t len = static_cast<int64_t>(it->tokens.size());
    if (len > max_length || len > static_cast<int64_t>(tokens.size())) continue;
    if (it->is_public ? len > public_length : it->partition != partition) continue;
    if (best != entries_.end() && len <= static_cast<int64_t>(best->tokens.size())) continue;
    if (std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin()) && SameImages(it->images, images, len)) best = it;
  }
  if (best == entries_.end()) return {};
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  const Entry& e = entries_.front();
  return {static_cast<int64_t>(e.tokens.size()), &e.blocks, &e.delta};
}

void PrefixCache::Insert(KvPool& pool, const std::vector<int>& tokens, int64_t length, const SequenceCache& cache,
                         const std::string& partition, bool is_public, std::span<const ImageSpan> images) {
  if (length <= 0 || length % pool.block_tokens() != 0) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (static_cast<int64_t>(it->tokens.size()) == length && it->is_public == is_public &&
        (is_public || it->partition == partition) && std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin()) &&
        SameImages(it->images, images, length)) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  block_bytes_ = static_cast<int64_t>(pool.block_tokens() * pool.floats_per_token() * sizeof(float));
  // Everything that can throw comes before the first change to the cache.
  Entry e;
  e.tokens.assign(tokens.begin(), tokens.begin() + length);
  e.images = ImageKeys(images, length);
  if (!is_public) e.partition = partition;
  e.is_public = is_public;
  e.blocks.assign(cache.blocks.begin(), cache.blocks.begin() + length / pool.block_tokens());
  e.delta = cache.delta;
  e.heap_bytes = HeapBytes(e);
  const double now = SteadyNow();
  for (const auto& [key, pin] : pins_)
    if (pin.expiry > now && Begins(pin.tokens, e.tokens)) e.pin = key;
  // Alone, with every block its own, the entry must fit; else evicting the
  // whole cache would still not make room.
  const size_t table_size = std::max(cache_refs_.capacity(), static_cast<size_t>(pool.num_blocks()));
  const int64_t alone = e.heap_bytes + static_cast<int64_t>(e.blocks.size()) * block_bytes_ +
                        static_cast<int64_t>(table_size * sizeof(uint32_t)) + kAllocOverhead;
  if (alone > max_bytes_) {
    if (counters_.too_large++ == 0)
      log::Warn("prefix cache: one snapshot of " + std::to_string(length) + " tokens needs " + std::to_string(alone) +
                " bytes, more than prefix_cache_bytes (" + std::to_string(max_bytes_) + "); such prefixes are not cached");
    return;
  }
  if (cache_refs_.size() < static_cast<size_t>(pool.num_blocks())) cache_refs_.resize(static_cast<size_t>(pool.num_blocks()), 0);
  entries_.push_front(std::move(e));
  const Entry& added = entries_.front();
  for (int b : added.blocks) {
    pool.Ref(b);
    if (cache_refs_[static_cast<size_t>(b)]++ == 0) ++distinct_blocks_;
  }
  entry_heap_bytes_ += added.heap_bytes;
  while (entries_.size() > max_entries_) EvictOne(pool, Why::kEntries);
  // The newest entry fits alone (checked above), so this stops with it kept.
  while (bytes() > max_bytes_ && entries_.size() > 1) EvictOne(pool, Why::kBytes);
}

void PrefixCache::Drop(KvPool& pool, std::list<Entry>::iterator victim) {
  for (int b : victim->blocks) {
    pool.Unref(b);
    if (--cache_refs_[static_cast<size_t>(b)] == 0) --distinct_blocks_;
  }
  entry_heap_bytes_ -= victim->heap_bytes;
  entries_.erase(victim);
}

bool PrefixCache::Pinned(const Entry& e, double now) const {
  if (e.pin == 0) return false;
  auto it = pins_.find(e.pin);
  return it != pins_.end() && it->second.expiry > now;
}

void PrefixCache::SetPin(uint64_t key, const std::vector<int>& tokens, double expiry) {
  const double now = SteadyNow();
  std::erase_if(pins_, [&](const auto& kv) { return kv.second.expiry <= now; });
  if (key == 0) return;
  if (expiry <= now) {
    pins_.erase(key);
    return;
  }
  pins_[key] = Pin{tokens, expiry};
  for (Entry& e : entries_)
    if (Begins(tokens, e.tokens)) e.pin = key;
}

bool PrefixCache::EvictOne(KvPool& pool, Why why) {
  if (entries_.empty()) return false;
  // The least recently used unpinned entry; a pinned one only when none is
  // left, or when pinned entries hold more than their share of the bound.
  const double now = SteadyNow();
  int64_t pinned_bytes = 0;
  auto oldest_unpinned = entries_.end(), oldest_pinned = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (Pinned(*it, now)) {
      pinned_bytes += EntryBytes(*it);
      oldest_pinned = it;
    } else {
      oldest_unpinned = it;
    }
  }
  const bool over_share = static_cast<double>(pinned_bytes) > pin_share_ * static_cast<double>(max_bytes_);
  auto victim = (over_share || oldest_unpinned == entries_.end()) ? oldest_pinned : oldest_unpinned;
  if (victim == entries_.end()) victim = std::prev(entries_.end());
  Spill(pool, *victim);
  Drop(pool, victim);
  switch (why) {
    case Why::kBytes: ++counters_.evicted_for_bytes; break;
    case Why::kEntries: ++counters_.evicted_for_entries; break;
    case Why::kPool: ++counters_.evicted_for_pool; break;
  }
  return true;
}

void PrefixCache::Clear(KvPool& pool) {
  while (!entries_.empty()) DropLru(pool);
}

}  // namespace moeserve::engine
