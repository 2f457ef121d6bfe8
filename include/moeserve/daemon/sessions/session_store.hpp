// The durable store of server-kept sessions: one SQLite database (WAL,
// synchronous=FULL) on the daemon's volume, kept the way the usage ledger
// keeps charges (usage_ledger.hpp).
//
// Writes are a group commit: each write is queued; one writer thread takes
// everything queued, applies each in a savepoint of one transaction (a write
// that fails is rolled back alone) and commits with one WAL fsync, then runs
// each write's `done`. The daemon answers a turn only from `done`, so a turn
// the client saw acknowledged is on disk, and a turn is one write, so a
// crash leaves it whole or absent, never half-written.
//
// Images of user messages and tool results are kept apart, once per tenant
// and content hash (image_table.hpp): an entry names its images; deleting a
// session (or expiring it) deletes the files no other conversation names.
//
// An empty path keeps the database in memory (nothing survives a restart).
//
// Thread safety: every method may be called from any thread; `done`
// callbacks run on the writer thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/sessions/session_history.hpp"
#include "moeserve/daemon/sqlite_batch_writer.hpp"
#include "moeserve/daemon/image/stored_images.hpp"

struct sqlite3;

namespace moeserve::daemon {

struct SessionRecord {
  std::string id;
  std::string tenant;
  double created_at = 0;
  double last_active = 0;
  std::string model;             // "" : the served model
  nlohmann::ordered_json tools;  // the tools array as sent, or null
  std::string reasoning_effort;  // "" : the daemon's default
  nlohmann::ordered_json context_policy = nlohmann::ordered_json::object();
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  int64_t next_seq = 1;
  int64_t bytes = 0;  // what the session takes in storage (the quota counts it)
};

// One acknowledged turn: the new entries (seqs assigned), and the summary
// the context policy made for it, if any.
struct TurnWrite {
  std::string session_id;
  std::string tenant;                    // whose image files `images` are
  std::vector<StoredImageFile> images;   // files the entries' images name (stored once per tenant and hash)
  std::vector<SessionEntry> entries;
  std::optional<SessionEntry> summary;  // its seq assigned
  std::vector<int64_t> replaced;        // seqs the summary replaces
  double now = 0;
};

class SessionStore {
 public:
  static Result<std::unique_ptr<SessionStore>> Open(const std::string& path);
  // Commits what is queued, then stops the writer.
  ~SessionStore();

  using Done = std::function<void(const Status& committed)>;
  void Create(SessionRecord record, std::vector<SessionEntry> entries, Done done);
  // Fails (NotFound) when the session is gone (deleted or expired meanwhile).
  void CommitTurn(TurnWrite write, Done done);
  // The model's summary in place of the extractive one, while the summary is
  // still active.
  void ReplaceSummary(std::string session_id, int64_t seq, std::string text, int64_t tokens, Done done);
  void Delete(std::string session_id, Done done);
  // Deletes sessions idle since before `cutoff` (unix seconds).
  void DeleteIdle(double cutoff, Done done);
  // Write and wait (create, delete, tests).
  Status Wait(const std::function<void(Done)>& write);

  // Other tables of the same database (the stored responses:
  // responses/response_store.hpp) write through this writer, so their writes
  // share its group commit and its guarantees; `job` runs on the writer
  // thread inside the batch's transaction, in a savepoint of its own.
  using Job = std::function<Status(sqlite3*)>;
  void Write(Job job, Done done) { Enqueue(std::move(job), std::move(done)); }
  // Runs `read` on the connection with no writer in between (reads of those tables).
  Status Read(const std::function<Status(sqlite3*)>& read) const;

  Result<std::optional<SessionRecord>> Get(const std::string& id) const;
  Result<std::vector<SessionEntry>> Entries(const std::string& id) const;  // every entry, by seq
  Result<int64_t> TenantBytes(const std::string& tenant) const;
  // Encoded bytes of the distinct image files the session's entries name
  // (session_image_max_bytes bounds them).
  Result<int64_t> SessionImageBytes(const std::string& session_id) const;
  // The tenant's image files for `hashes` (image_table.hpp); a hash it does not hold is left out.
  Result<std::vector<StoredImageFile>> ImageFiles(const std::string& tenant, const std::vector<std::string>& hashes) const;
  // Image files stored, over every tenant.
  Result<int64_t> ImageFileCount() const;
  // Every tenant's sessions together, and the stored responses that share
  // the database (responses/response_store.hpp).
  Result<int64_t> TotalBytes() const;
  Result<int64_t> Count() const;

 private:
  struct Pending {
    Job job;
    Done done;
  };
  explicit SessionStore(std::string path) : path_(std::move(path)) {}
  Status Init();
  void Enqueue(Job job, Done done);
  void CommitBatch(std::vector<Pending>& batch);

  std::string path_;
  sqlite3* db_ = nullptr;
  mutable std::mutex db_mu_;  // one connection, one user at a time

  SqliteBatchWriter<Pending> writer_;
};

}  // namespace moeserve::daemon
