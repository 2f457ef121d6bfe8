// The audit log: one JSON line per API request (audit_exchange.hpp writes
// them), on the state volume, for who asked what and when.
//
// Durability, by group commit: Append queues a line and returns; a writer
// thread writes every queued line, fdatasyncs the file once for the batch,
// and only then runs each line's `done` callback, which is what sends the
// answer to the client. So no answer is acknowledged before its line is on
// disk, and a crash loses only lines whose answers were never sent. A line
// torn by a crash mid-write (never acknowledged) is cut off at the next
// Open.
//
// Files: <dir>/audit.log, rotated by size: when it passes max_file_bytes
// after a batch it becomes audit.log.1 (the older ones move up by one, the
// oldest past max_files is deleted), and a new audit.log starts.
//
// Settings (audit_*; the daemon's YAML keys and flags):
//   audit_dir: ""               # default <state_dir>/audit; neither: no audit log
//   audit_log_content: false    # also log the request's messages and the answer's text
//   audit_max_file_bytes: 16777216   # rotate audit.log past this size
//   audit_max_files: 4          # rotated files kept besides audit.log
//
// The defaults bound the log at 80 MiB: it shares the state volume (1 GiB
// by default under the operator) with the usage ledger and the sessions.
//
// Thread safety: Append may be called from any thread. ReadAuditLog reads
// files only and may run beside a writer (it ignores a partial last line).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

struct AuditSettings {
  std::string dir;
  bool log_content = false;
  int64_t max_file_bytes = int64_t{16} << 20;
  int max_files = 4;
};

class AuditLog {
 public:
  using Done = std::function<void(const Status&)>;

  static Result<std::unique_ptr<AuditLog>> Open(AuditSettings settings);
  ~AuditLog();  // writes what is queued, then stops

  // Queues `line` (one JSON object, no newline); `done` (may be empty) runs
  // on the writer thread once the line is on disk, or with the error.
  void Append(std::string line, Done done);

  const AuditSettings& settings() const { return settings_; }

 private:
  explicit AuditLog(AuditSettings settings) : settings_(std::move(settings)) {}
  void Run();
  Status WriteBatch(const std::string& bytes);
  Status RotateIfFull();
  std::string Path(int index) const;

  AuditSettings settings_;
  int fd_ = -1;
  int64_t size_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, Done>> queue_;
  bool stop_ = false;
  std::thread writer_;
};

struct AuditFilter {
  std::string tenant;      // empty: every tenant
  std::string since;       // RFC 3339 UTC ("2026-12-05T06:00:00Z"); lines at or after it
  size_t limit = 1000;     // the newest `limit` lines that match
};

// The lines under `dir` that match, oldest first.
Result<std::vector<nlohmann::json>> ReadAuditLog(const std::string& dir, const AuditFilter& filter);

}  // namespace moeserve::daemon
