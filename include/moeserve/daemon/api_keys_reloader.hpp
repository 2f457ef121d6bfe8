// The API keys file followed on disk: when the file changes (a Kubernetes
// Secret mount swaps its `..data` symlink to a new timestamped directory),
// the next request is checked against the new keys, without a restart.
//
// How a change is seen: a stat() of the path, following symlinks, at most
// once per check interval, from the request path itself (as the TLS context
// does for its certificate). A swap always gives the file a new inode, and an
// edit in place a new size or mtime. No watcher thread: inotify would have
// to watch the directory for the symlink swap and re-arm after each one, and
// a stat a second costs nothing next to a request; a change is in force at
// most one interval after it lands.
//
// A file that does not load (half-written, not YAML, no keys) keeps the
// previous keys and is logged with the parser's message, which names entries
// by position and never prints a key; the stamp stays old, so the next check
// tries again and a completed write is picked up.
//
// Thread safety: Current() may be called from any thread; the ApiKeys it
// returns is immutable and stays valid while held.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "moeserve/daemon/api_keys.hpp"

namespace moeserve::daemon {

class ReloadingApiKeys {
 public:
  // Loads `path` now; fails when it does not load (a start-up error).
  static Result<std::unique_ptr<ReloadingApiKeys>> Open(std::string path, std::chrono::milliseconds check_interval =
                                                                                std::chrono::seconds(1));
  // Keys that never change (no file: ApiKeys::Open()).
  static std::unique_ptr<ReloadingApiKeys> Fixed(ApiKeys keys);

  // The keys in force; reloads first when the file changed.
  std::shared_ptr<const ApiKeys> Current();
  uint64_t reloads() const;   // successful reloads since Open
  uint64_t failures() const;  // changes that did not load

 private:
  struct FileStamp {
    uint64_t device = 0, inode = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  ReloadingApiKeys(std::string path, std::chrono::milliseconds check_interval)
      : path_(std::move(path)), check_interval_(check_interval) {}
  static FileStamp Stamp(const std::string& path);

  const std::string path_;  // empty: fixed keys
  const std::chrono::milliseconds check_interval_;
  mutable std::mutex mu_;
  std::shared_ptr<const ApiKeys> current_;
  FileStamp stamp_, failed_stamp_;
  std::chrono::steady_clock::time_point last_check_;
  uint64_t reloads_ = 0, failures_ = 0;
};

}  // namespace moeserve::daemon
