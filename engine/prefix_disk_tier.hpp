// The prefix cache's tier on the node's disk: entries the memory cache
// evicts (their full KV blocks and the DeltaNet state at the entry's end)
// are written to a local directory, and a later prompt that shares a longer
// prefix than memory holds reads them back instead of recomputing them. The
// files outlive the process: a restarted engine over the same directory
// finds them (docs/operations.md, "Prefix cache on disk").
//
// Layout: <dir>/<model id>/<key>.mpc, one file per entry. The model id (32
// hex digits) hashes everything that makes a cached row valid: the model's
// config, the pool row size and block size, the recurrent state's shape, and
// the options that change the computed values (kernels, activations,
// deterministic mode). Models never read each other's folder. <key> hashes
// the partition (tenant, or public) and the entry's tokens, block by block,
// so a lookup walks the prompt's block-aligned prefixes once, longest first,
// against an in-memory index rebuilt from the files' headers at start.
//
// File (little-endian, fixed-width fields; kFormatVersion):
//   "MOEPFXC1", u32 version, u32 block_tokens, u64 floats_per_token,
//   u8[16] model id, u8 is_public, u32 partition bytes, u64 tokens,
//   u32 delta layers, per layer u64 conv floats, u64 S floats, then the
//   partition, the tokens (i32), the cache blocks in the pool's one-stripe
//   layout, whatever the pool's stripes (f32, tokens x floats_per_token,
//   KvPool::CopyBlockOut; version 2: each cache part's rows of a block
//   together, KvPool::PartRow; version 1 files held token rows and are
//   refused, then recomputed), each layer's conv tail and S (f32), and last
//   the SHA-256 of every byte before it.
// Every length is checked against fixed caps and against the file's size
// before anything is allocated; a file whose header, size, model,
// partition, tokens or checksum is not what the lookup expects is refused,
// deleted and counted (refused), and the prefix is recomputed.
//
// Writes go to a temporary name and are renamed into place, so a reader
// never sees a half-written file under its real name. No fsync: the tier is
// a cache, and a file torn by a power loss fails its size or checksum check
// and is deleted on first read.
//
// Bounded in bytes (file sizes): past the bound, the least recently used
// files go (access times kept in memory, starting from the files' mtimes).
// Bounded in age too (max_age_seconds, 0: none): a file unused for longer is
// deleted, at start (by its mtime) and as the tier runs (ExpireOld, before
// each lookup and write, and from an idle engine's MaintainIdle). A file's mtime is its last use: a hit or a write
// of an entry already stored sets it, so a restarted engine ages it from
// there.
//
// Thread safety: none; the engine's step thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/kv_pool.hpp"

namespace moeserve::engine {

class PrefixDiskTier {
 public:
  static constexpr uint32_t kFormatVersion = 2;

  struct Options {
    std::string dir;         // the tier's root; the model's folder is made under it
    int64_t max_bytes = 0;   // bound on the files' bytes
    std::string model_identity;  // hashed into the model id (see the top)
    int block_tokens = 16;
    size_t floats_per_token = 1;
    // Per layer, the floats of a fresh sequence's conv tail and S (0, 0 for
    // attention layers): restored states must have exactly this shape.
    std::vector<std::pair<uint64_t, uint64_t>> delta_shape;
    // Files unused for longer than this are deleted; 0: no bound by age.
    double max_age_seconds = 0;
    // Wall-clock seconds since the epoch (the files' mtimes are on it);
    // empty: the system clock. Tests pass their own.
    std::function<int64_t()> clock;
  };

  // Makes the folder and indexes the files already there (headers only);
  // files that cannot be this model's entries are deleted.
  static Result<std::unique_ptr<PrefixDiskTier>> Open(Options options);

  // The model's folder (where the files are).
  const std::string& folder() const { return folder_; }
  // The file name an entry of these tokens gets.
  std::string FileName(const std::string& partition, bool is_public, std::span<const int> tokens) const;
  // The same for the model whose folder is named `model_id` (32 hex digits):
  // what a file planted in that folder must be called to be looked up.
  static std::string FileNameIn(const std::string& model_id, int block_tokens, const std::string& partition,
                                bool is_public, std::span<const int> tokens);

  // Stores an entry: tokens (a multiple of block_tokens), the pool blocks
  // holding their rows, and the recurrent state at their end. An entry
  // already stored is only marked used. Errors are logged by the caller;
  // the memory cache is not affected either way.
  Status Write(const KvPool& pool, std::span<const int> tokens, std::span<const int> blocks,
               const std::vector<DeltaLayerState>& delta, const std::string& partition, bool is_public);

  struct Found {
    int64_t length = 0;
    bool is_public = false;
    std::string key;
  };
  // The longest stored prefix of `tokens` longer than `longer_than` and no
  // longer than `max_length`: the partition's entries, and public ones no
  // longer than public_length.
  std::optional<Found> Find(std::span<const int> tokens, int64_t max_length, const std::string& partition,
                            int64_t public_length, int64_t longer_than) const;

  struct Restored {
    std::vector<int> blocks;  // newly allocated pool blocks (refcount 1) holding the rows
    std::vector<DeltaLayerState> delta;
  };
  // Reads what Find found back into new pool blocks. A file that fails any
  // check is deleted and the error returned (kCorruption); kResourceExhausted
  // when the pool has no room.
  Result<Restored> Read(KvPool& pool, const Found& found, std::span<const int> tokens, const std::string& partition);

  // Deletes the files unused for longer than max_age_seconds (counted in
  // disk_expired). Cheap when nothing is due: it keeps the earliest time a
  // file can expire and returns until then.
  void ExpireOld();

  // Counters and sizes for PrefixCacheStats (its disk_* fields).
  void FillStats(PrefixCacheStats& s) const;

 private:
  struct File {
    int64_t bytes = 0;
    int64_t length = 0;
    bool is_public = false;
    uint64_t last_use = 0;  // a counter: larger is more recent
    int64_t last_use_seconds = 0;  // the clock's time of that use (the file's mtime)
  };
  explicit PrefixDiskTier(Options options);
  std::string PathOf(const std::string& key) const;
  // The chained per-block hashes of the partition and the tokens: element k
  // is the key of tokens[0, (k + 1) * block_tokens).
  std::vector<uint64_t> ChainKeys(const std::string& partition, bool is_public, std::span<const int> tokens,
                                  int64_t max_length) const;
  static std::vector<uint64_t> ChainKeysFor(const uint8_t (&model_id)[16], int block_tokens, const std::string& partition,
                                            bool is_public, std::span<const int> tokens, int64_t max_length);
  void Scan();
  void Remove(const std::string& name);
  void Refuse(const std::string& key, const std::string& why);
  void MakeRoom(int64_t incoming);
  int64_t Now() const;
  // Records a use of `key`'s file now, in memory and in its mtime.
  void Touch(const std::string& key, File& file);

  Options options_;
  std::string model_id_;  // 32 hex digits: model_id_bytes_
  uint8_t model_id_bytes_[16] = {};
  std::string folder_;
  std::unordered_map<std::string, File> files_;  // by key
  int64_t bytes_ = 0;
  uint64_t clock_ = 0;
  int64_t next_expiry_ = 0;  // no file can be past max_age before this clock time
  PrefixCacheStats counters_;  // the disk_* counters
};

}  // namespace moeserve::engine
