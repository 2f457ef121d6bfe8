// Prefix cache: prompts that repeat an earlier prompt's prefix (every agent
// turn re-sends the whole history) reuse its full KV blocks and the DeltaNet
// state snapshot taken at the end of that prefix. Entries hold references on
// their blocks.
//
// Bounded in bytes: each entry owns a copy of every DeltaNet layer's state
// (conv tails and S, tens of MiB per entry on large models, independent of
// the prefix length), so an entry cap alone lets the heap grow with the
// number of distinct prompts. Counted are the KV blocks the cache references
// (each block once, however many entries share it), the state copies, the
// token and block lists, and the bookkeeping (list nodes, the per-block
// reference table), all by capacity, i.e. what is really allocated. Inserting
// past the bound evicts least recently used entries; a snapshot larger than
// the whole bound is not cached. The engine also evicts when the KV pool
// needs room for a new sequence.
//
// Pins (SetPin): a session keeps the prefixes of its latest prompt cached
// between turns. An entry covered by a live pin is evicted only when no
// unpinned entry is left, or when the pinned entries together pass
// `pin_share` of the bound (then the least recently used pinned one goes).
//
// Partitions: an entry is reused only by lookups of the partition it was
// inserted under (the daemon passes one per tenant), so what one tenant's
// prompts left in the cache shows in no other tenant's cached_tokens or
// timing. Public entries (the deployment's configured public prefix) are
// reused by every partition, up to the lookup's public length.
//
// A tier on disk (AttachDiskTier, prefix_disk_tier.hpp): entries evicted
// from memory are written there (those covering an image excepted), and a
// lookup that finds a longer prefix on disk than in memory reads it back into
// new pool blocks and inserts it here. When the cache is destroyed, the
// entries still in memory are written too, so a restart finds them.
//
// Thread safety: none; the engine's step thread owns the cache.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "prefix_disk_tier.hpp"

namespace moeserve::engine {

class PrefixCache {
 public:
  explicit PrefixCache(int64_t max_bytes = int64_t{1} << 30, size_t max_entries = 4096, double pin_share = 0.5)
      : max_bytes_(max_bytes), max_entries_(max_entries), pin_share_(pin_share) {}
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Evicted entries go to `tier` from now on, and LookupOrRestore reads them
  // back. `pool` is the one pool the cache is used with: the destructor
  // reads the rows of the entries it writes out from it (so the pool must
  // outlive the cache).
  void AttachDiskTier(std::unique_ptr<PrefixDiskTier> tier, KvPool& pool);
  bool has_disk_tier() const { return disk_ != nullptr; }
  // The disk tier's age bound applied now (PrefixDiskTier::ExpireOld); a
  // no-op without a tier.
  void ExpireDisk() {
    if (disk_) disk_->ExpireOld();
  }

  struct Hit {
    int64_t length = 0;  // tokens reused (a multiple of the block size)
    const std::vector<int>* blocks = nullptr;
    const std::vector<DeltaLayerState>* delta = nullptr;
  };
  // The longest cached prefix of `tokens` no longer than max_length, among
  // `partition`'s entries and the public ones no longer than public_length.
  // `images`: the prompt's image spans (model.md 14.6). Placeholder tokens
  // are the same ids for every image, so an entry whose prefix covers part
  // of an image matches only a lookup with the same image (content hash) at
  // the same place.
  Hit Lookup(const std::vector<int>& tokens, int64_t max_length, const std::string& partition = {},
             int64_t public_length = 0, std::span<const ImageSpan> images = {});
  // Lookup, then, with a disk tier, the tier's longest prefix when it is
  // longer than memory's: read back into new pool blocks (only when the
  // pool has them free), inserted as an entry, and returned. A file the tier
  // refuses is deleted and the memory hit stands (the rest is recomputed).
  // Prefixes covering an image are never on disk.
  Hit LookupOrRestore(KvPool& pool, const std::vector<int>& tokens, int64_t max_length, const std::string& partition = {},
                      int64_t public_length = 0, std::span<const ImageSpan> images = {});
  // Records tokens[0, length) with the cache's first length/block_tokens blocks
  // and the DeltaNet state at that point (length must be block-aligned), then
  // evicts to stay within the bounds. On an exception (allocation) the cache
  // is unchanged.
  // `partition` names who may reuse it; `is_public` lets every partition.
  // `images` as for Lookup: the entry keeps the hashes of those it covers.
  void Insert(KvPool& pool, const std::vector<int>& tokens, int64_t length, const SequenceCache& cache,
              const std::string& partition = {}, bool is_public = false, std::span<const ImageSpan> images = {});
  enum class Why { kBytes, kEntries, kPool };
  // Drops the least recently used entry; false when empty.
  bool EvictOne(KvPool& pool, Why why = Why::kPool);
  void Clear(KvPool& pool);
  // Pins the entries whose tokens begin `tokens` (and those inserted later)
  // until `expiry` (steady_clock seconds); an expiry <= now removes the pin.
  void SetPin(uint64_t key, const std::vector<int>& tokens, double expiry);
  size_t size() const { return entries_.size(); }

  int64_t bytes() const { return kv_bytes() + state_bytes(); }
  int64_t kv_bytes() const { return distinct_blocks_ * block_bytes_; }
  int64_t state_bytes() const;
  PrefixCacheStats Stats() const;

 private:
  // An image a cached prefix covers at least one placeholder of.
  struct ImageKey {
    int64_t offset = 0;
    std::string content_hash;
    bool operator==(const ImageKey&) const = default;
  };
  // The keys of the images whose placeholders begin before `length`.
  static std::vector<ImageKey> ImageKeys(std::span<const ImageSpan> images, int64_t length);
  static bool SameImages(const std::vector<ImageKey>& keys, std::span<const ImageSpan> images, int64_t length);
  struct Entry {
    std::vector<int> tokens;
    std::vector<ImageKey> images;
    std::string partition;
    bool is_public = false;
    std::vector<int> blocks;
    std::vector<DeltaLayerState> delta;
    int64_t heap_bytes = 0;  // this entry's allocations, its list node included
    uint64_t pin = 0;        // the key of the last pin that covered it (0: none)
  };
  struct Pin {
    std::vector<int> tokens;
    double expiry = 0;
  };
  static int64_t HeapBytes(const Entry& e);
  void Drop(KvPool& pool, std::list<Entry>::iterator victim);  // unreferences its blocks and frees it
  // Writes the entry to the disk tier (when attached and it covers no image).
  void Spill(const KvPool& pool, const Entry& e);
  void DropLru(KvPool& pool) { Drop(pool, std::prev(entries_.end())); }
  bool Pinned(const Entry& e, double now) const;
  int64_t EntryBytes(const Entry& e) const { return e.heap_bytes + static_cast<int64_t>(e.blocks.size()) * block_bytes_; }
  int64_t TableBytes() const { return static_cast<int64_t>(cache_refs_.capacity() * sizeof(uint32_t)); }

  std::list<Entry> entries_;  // front: most recently used
  int64_t max_bytes_;
  size_t max_entries_;
  double pin_share_;
  std::map<uint64_t, Pin> pins_;
  // References the cache's entries hold on each pool block (sized to the one
  // pool the cache is used with at the first insert): a block's bytes count once while any entry holds it.
  std::vector<uint32_t> cache_refs_;
  int64_t distinct_blocks_ = 0;
  int64_t block_bytes_ = 0;
  int64_t entry_heap_bytes_ = 0;  // sum of Entry::heap_bytes
  PrefixCacheStats counters_;     // eviction and too-large counts
  std::unique_ptr<PrefixDiskTier> disk_;
  KvPool* disk_pool_ = nullptr;   // the pool given with the tier
};

}  // namespace moeserve::engine
