// The node-local model cache, shared by every daemon on the node.
//
// Layout under root:
//   models/<key>/     complete models; a directory appears here only by
//                     rename(2) from partial/, so a reader never sees half a model
//   partial/<key>/    downloads in progress, with their resume record
//   meta/<key>.json   uri, revision, size and whether the content was verified
//                     against a manifest; its mtime is the last use (LRU)
//   locks/<key>.pull  flock(LOCK_EX) while one process pulls <key>; others wait
//   locks/<key>.use   flock(LOCK_SH) while a process uses models/<key>
// <key> = first 32 hex digits of sha256(uri + "\n" + revision) for verified
// pulls (a stable name: the operator points the serving container at it), and
// of sha256(uri + "\n" + revision + "\nunverified") for --no-verify pulls, so
// an unverified pull never lands where a verified request looks.
//
// The cache may be writable by others (a directory shared by several tenants'
// pods), so everything below root is reached through directory descriptors
// with openat(2) and O_NOFOLLOW (nofollow.hpp): a symbolic link planted at a
// lock, a meta file, a model or a partial download is an error, never followed.
//
// Eviction removes least-recently-used complete models whose use lock it can
// take exclusively without waiting, so a model some process holds is never
// evicted. Locks are flock(2): they vanish with the process (kill -9 included).
//
// Thread safety: ModelCache is immutable after Open (copies share its open
// directories); locks are per object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/nofollow.hpp"

namespace moeserve::storage {

// An flock held on a file; released on destruction.
class FileLock {
 public:
  FileLock() = default;
  explicit FileLock(int fd) : fd_(fd) {}
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();
  bool held() const { return fd_ >= 0; }
  void Release();

 private:
  int fd_ = -1;
};

enum class LockMode { kShared, kExclusive };
// Blocking unless try_only; with try_only an unavailable lock returns a FileLock that is not held.
// The lock file is created if missing; a link at path is refused, not followed.
Result<FileLock> LockFile(const std::string& path, LockMode mode, bool try_only = false);

struct CacheConfig {
  std::string root;
  uint64_t size_limit_bytes = 0;  // 0: no limit
};

// What meta/<key>.json records of a complete model.
struct CachedModelMeta {
  std::string uri;
  std::string revision;
  uint64_t bytes = 0;
  bool verified = false;  // every file's sha256 was checked against manifest.json
                          // (false too in meta files of pullers that did not record it)
};

class ModelCache {
 public:
  static Result<ModelCache> Open(const CacheConfig& config);

  static std::string Key(const std::string& uri, const std::string& revision, bool verified = true);
  const std::string& root() const { return config_.root; }
  uint64_t size_limit() const { return config_.size_limit_bytes; }
  std::string ModelPath(const std::string& key) const;
  std::string PartialPath(const std::string& key) const;

  // Exclusive per-key pull lock; blocks while another process pulls the same key.
  Result<FileLock> LockForPull(const std::string& key) const;
  // Shared use lock on a complete model, refreshing its LRU time; kNotFound
  // when models/<key> does not exist (for example, it was just evicted).
  Result<FileLock> Lease(const std::string& key) const;
  // models/<key> is a directory (a link there does not count).
  bool IsComplete(const std::string& key) const;
  // Like IsComplete, but a link or file planted at models/<key> is an error.
  Result<bool> FindModel(const std::string& key) const;
  // models/<key>, opened without following links.
  Result<UniqueFd> OpenModel(const std::string& key) const;
  // partial/<key>, made if missing, opened without following links.
  Result<UniqueFd> OpenPartial(const std::string& key) const;
  // meta/<key>.json; kNotFound when missing, kCorruption when unreadable.
  Result<CachedModelMeta> ReadMeta(const std::string& key) const;

  // Replaces meta/<key>.json.
  Status WriteMeta(const std::string& key, const CachedModelMeta& meta) const;
  // Renames partial/<key> to models/<key>, fsyncing both parents, after writing meta.
  Status Publish(const std::string& key, const CachedModelMeta& meta) const;

  // Size of one complete model from its meta file (0 when unknown).
  uint64_t ModelBytes(const std::string& key) const;
  // Bytes held by complete models (from meta files).
  uint64_t UsedBytes() const;
  // Frees room under the size limit for incoming bytes (keep_key aside):
  // first partial downloads nobody is pulling, then LRU models no process
  // uses. kResourceExhausted when the rest is in use. No-op without a limit.
  Status MakeRoom(uint64_t incoming_bytes, const std::string& keep_key) const;
  // Evicts one model if nobody uses or pulls it; false when it is in use.
  Result<bool> TryEvict(const std::string& key) const;
  // The same for a caller that holds key's pull lock itself.
  Result<bool> TryEvictWhilePulling(const std::string& key) const;
  // Free bytes on the cache's filesystem must cover `needed`; otherwise kResourceExhausted.
  Status CheckFreeSpace(uint64_t needed) const;

 private:
  struct Dirs;
  ModelCache(CacheConfig config, std::shared_ptr<const Dirs> dirs)
      : config_(std::move(config)), dirs_(std::move(dirs)) {}
  Result<FileLock> LockAt(const std::string& name, LockMode mode, bool try_only) const;
  Result<bool> EvictUnused(const std::string& key) const;
  CacheConfig config_;
  std::shared_ptr<const Dirs> dirs_;
};

}  // namespace moeserve::storage
