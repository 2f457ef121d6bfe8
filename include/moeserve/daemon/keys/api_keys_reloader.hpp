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
// A changed file that does not load (missing, half-written, not YAML, a bad
// entry, `keys: []`) fails closed: from that check on every key is refused
// (401), admin keys included, until a version loads. Keeping the previous
// keys would keep a key alive that the broken version was meant to revoke
// (a removal saved together with a typo); taking only the removals from a
// file that does not parse would mean guessing what it says. Meanwhile
// State() says why (for /readyz, which answers 503 with the reason, and for
// /metrics), the parser's message is logged once per bad version (it names
// entries by position and never prints a key), and the next change is tried.
// The metrics token lives in its own file and is not affected.
//
// Thread safety: Current() and State() may be called from any thread; the
// ApiKeys Current() returns is immutable and stays valid while held.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "moeserve/daemon/keys/api_keys.hpp"

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

  struct KeysState {
    bool refusing = false;     // the file stopped loading: every key is refused
    std::string problem;       // why, while refusing (the parser's message, no key)
    std::string file_sha256;   // SHA-256 of the file's bytes as last loaded
    uint64_t reloads = 0;      // successful reloads since Open
    uint64_t failures = 0;     // changed versions that did not load
  };
  // As of the last check (call Current() first to check now).
  KeysState State() const;
  uint64_t reloads() const { return State().reloads; }
  uint64_t failures() const { return State().failures; }

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
  KeysState status_;
};

}  // namespace moeserve::daemon
