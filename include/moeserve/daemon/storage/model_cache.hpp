// The node-local model cache, shared by every daemon on the node.
//
// Layout under root:
//   models/<key>/     complete, verified models; a directory appears here only
//                     by rename(2) from partial/, so a reader never sees half a model
//   partial/<key>/    downloads in progress, with their resume record
//   meta/<key>.json   uri, revision and size; its mtime is the last use (LRU)
//   locks/<key>.pull  flock(LOCK_EX) while one process pulls <key>; others wait
//   locks/<key>.use   flock(LOCK_SH) while a process uses models/<key>
// <key> = first 32 hex digits of sha256(uri + "\n" + revision).
//
// Eviction removes least-recently-used complete models whose use lock it can
// take exclusively without waiting, so a model some process holds is never
// evicted. Locks are flock(2): they vanish with the process (kill -9 included).
//
// Thread safety: ModelCache is immutable after Open; locks are per object.
#pragma once

#include <cstdint>
#include <string>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon::storage {

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
Result<FileLock> LockFile(const std::string& path, LockMode mode, bool try_only = false);

struct CacheConfig {
  std::string root;
  uint64_t size_limit_bytes = 0;  // 0: no limit
};

class ModelCache {
 public:
  static Result<ModelCache> Open(const CacheConfig& config);

  static std::string Key(const std::string& uri, const std::string& revision);
  const std::string& root() const { return config_.root; }
  uint64_t size_limit() const { return config_.size_limit_bytes; }
  std::string ModelPath(const std::string& key) const;
  std::string PartialPath(const std::string& key) const;

  // Exclusive per-key pull lock; blocks while another process pulls the same key.
  Result<FileLock> LockForPull(const std::string& key) const;
  // Shared use lock on a complete model, refreshing its LRU time; kNotFound
  // when models/<key> does not exist (for example, it was just evicted).
  Result<FileLock> Lease(const std::string& key) const;
  bool IsComplete(const std::string& key) const;

  // Renames partial/<key> to models/<key>, fsyncing both parents, then writes meta.
  Status Publish(const std::string& key, const std::string& uri, const std::string& revision,
                 uint64_t bytes) const;

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
  // Free bytes on the cache's filesystem must cover `needed`; otherwise kResourceExhausted.
  Status CheckFreeSpace(uint64_t needed) const;

 private:
  explicit ModelCache(CacheConfig config) : config_(std::move(config)) {}
  CacheConfig config_;
};

}  // namespace moeserve::daemon::storage
