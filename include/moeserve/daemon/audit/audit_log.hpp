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
// Who asked what cannot be flushed away by requests without a key:
//  - Requests refused before a key was accepted (no key, a wrong key) are
//    counted, and written only as a sample: at most
//    unauthenticated_lines_per_second lines, each saying how many such
//    refusals went unwritten since the previous one ("skipped_refusals").
//  - An authenticated line (a "tenant") is never deleted before it is
//    retention_hours old: rotation deletes the oldest file only when it holds
//    none younger. When it does, the log is full: lines of requests already
//    admitted are still written (audit.log grows past max_file_bytes by
//    at most what the requests in flight write), refusal lines are dropped,
//    and full() tells the daemon to refuse new audited requests (503
//    audit_log_full) until the oldest file's newest authenticated line has
//    aged past retention. A warning is logged when it fills and when it clears.
//  - One tenant cannot make the log full for everyone: each tenant's bytes
//    of lines younger than retention are kept (from the files at Open, then
//    as lines are written). While the log is full, only a tenant holding at
//    least tenant_max_share of the log's bound (max_file_bytes x
//    (max_files + 1)) is refused (RefusesTenant); the others are still
//    served, their lines going on in audit.log, until audit.log has grown a
//    reserve of max_file_bytes past its rotation size: then every tenant is
//    refused until the oldest file may go. A tenant flooding the log with
//    requests (refused ones count: a 400 is still an authenticated line)
//    so shuts out itself, not its neighbours.
//  - Every line not written or deleted is counted by reason (stats()).
//
// Settings (audit_*; the daemon's YAML keys and flags):
//   audit_dir: ""               # default <state_dir>/audit; neither: no audit log
//   audit_log_content: false    # also log the request's messages and the answer's text
//   audit_max_file_bytes: 16777216   # rotate audit.log past this size
//   audit_max_files: 4          # rotated files kept besides audit.log
//   audit_retention_hours: 1    # authenticated lines kept at least this long; 0: rotation deletes any
//   audit_unauthenticated_lines_per_second: 1   # sampled lines of keyless refusals; 0: none
//   audit_tenant_max_share: 0.5 # while full, a tenant holding this share of the bound is refused
//
// The defaults bound the log at 96 MiB (80 MiB, a reserve of one file for
// the tenants the full log still serves, plus the lines of requests in
// flight): it shares the state volume (1 GiB by default under the
// operator) with the usage ledger and the sessions.
//
// Thread safety: Append may be called from any thread. ReadAuditLog reads
// files only and may run beside a writer (it ignores a partial last line).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
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
  double retention_hours = 1;
  double unauthenticated_lines_per_second = 1;
  double tenant_max_share = 0.5;
};

// Running totals (the daemon's moe_audit_* metrics).
struct AuditStats {
  uint64_t unauthenticated_refusals = 0;  // refused before a key was accepted, written or not
  uint64_t dropped_sampled = 0;      // of those, not written (past the sampling rate)
  uint64_t dropped_full = 0;         // refusal lines not written while the log was full
  uint64_t dropped_rotated = 0;      // lines deleted with the oldest file by rotation
  uint64_t dropped_write_error = 0;  // lines whose write failed (their requests got an error)
  bool full = false;
  bool reserve_spent = false;        // full, and audit.log has grown its reserve: every tenant is refused
};

// What a line is: a request admitted (written even when the log is full:
// its answer waits for it) or a refusal from the request's head (dropped,
// and counted, while the log is full).
enum class AuditLineKind { kRequest, kRefusal };

class AuditLog {
 public:
  using Done = std::function<void(const Status&)>;

  static Result<std::unique_ptr<AuditLog>> Open(AuditSettings settings);
  ~AuditLog();  // writes what is queued, then stops

  // Queues `line` (one JSON object, no newline); `done` (may be empty) runs
  // on the writer thread once the line is on disk, or with the error.
  // `tenant` ("" for none) is whose line it is: its bytes count towards the
  // tenant's share of the log (RefusesTenant).
  void Append(std::string line, Done done, AuditLineKind kind = AuditLineKind::kRequest, std::string tenant = "");
  // A request refused before a key was accepted: counted; written, as
  // line(skipped) with the number of such refusals not written since the
  // previous sample, at most unauthenticated_lines_per_second.
  void AppendUnauthenticated(const std::function<std::string(uint64_t skipped)>& line);
  // Whether new audited requests must be refused: the oldest file holds
  // authenticated lines within retention and audit.log is past its size.
  bool full() const;
  // Whether a new audited request of `tenant` must be refused (503
  // audit_log_full): the log is full and either the tenant holds at least
  // tenant_max_share of its bound in lines within retention, or audit.log
  // has used up its reserve.
  bool RefusesTenant(const std::string& tenant) const;
  // The bytes of `tenant`'s lines younger than retention (what its share is judged by).
  int64_t RetainedBytes(const std::string& tenant) const;
  AuditStats stats() const;

  const AuditSettings& settings() const { return settings_; }

 private:
  explicit AuditLog(AuditSettings settings) : settings_(std::move(settings)) {}
  void Run();
  Status WriteBatch(const std::string& bytes);
  Status RotateIfFull();
  std::string Path(int index) const;
  void CountRetained(const std::string& tenant, double time, int64_t bytes);  // mu_ held
  int64_t RetainedLocked(const std::string& tenant, double now) const;       // mu_ held
  Status LoadRetained();  // the lines within retention of the files already there

  AuditSettings settings_;
  int fd_ = -1;
  int64_t size_ = 0;
  mutable std::mutex mu_;  // the queue, the stats and the full state
  AuditStats stats_;
  double full_until_ = 0;      // while full: when the oldest file's authenticated lines pass retention (unix s)
  double last_sample_ = -1e18;  // steady seconds of the last unauthenticated line written
  uint64_t skipped_ = 0;       // unauthenticated refusals not written since it
  std::condition_variable cv_;
  struct Queued {
    std::string line;
    Done done;
    std::string tenant;
  };
  std::deque<Queued> queue_;
  std::atomic<int64_t> audit_log_bytes_{0};  // audit.log's size, for RefusesTenant
  // tenant -> minute (unix s / 60) -> bytes of its lines written in it;
  // minutes older than retention are dropped as they are passed.
  std::map<std::string, std::map<int64_t, int64_t>> retained_;
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
