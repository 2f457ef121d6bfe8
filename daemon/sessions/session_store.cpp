#include "moeserve/daemon/sessions/session_store.hpp"

#include <sqlite3.h>

#include <future>

#include "moeserve/common/log.hpp"
#include "image/image_table.hpp"
#include "sqlite_statement.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS sessions(
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL, last_active REAL NOT NULL,
  model TEXT NOT NULL, tools TEXT NOT NULL, reasoning_effort TEXT NOT NULL, context_policy TEXT NOT NULL,
  metadata TEXT NOT NULL, next_seq INTEGER NOT NULL, bytes INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions(tenant);
CREATE INDEX IF NOT EXISTS sessions_idle ON sessions(last_active);
CREATE TABLE IF NOT EXISTS entries(
  session_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, kind TEXT NOT NULL,
  created_at REAL NOT NULL, tokens INTEGER NOT NULL, message_seq INTEGER NOT NULL, content TEXT NOT NULL,
  call_id TEXT NOT NULL, call_name TEXT NOT NULL, arguments TEXT NOT NULL,
  replaces_first INTEGER, replaces_last INTEGER, author TEXT NOT NULL, replaced_by INTEGER,
  PRIMARY KEY(session_id, seq)) WITHOUT ROWID;
)sql";

// This store's statements name it in their errors.
class Stmt : public SqliteStatement {
 public:
  Stmt(sqlite3* db, const char* sql) : SqliteStatement(db, sql, "session store") {}
};

Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Fail(Error::Io(std::string("session store: ") + msg));
  }
  return Ok();
}

std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson Load(const std::string& text, ojson fallback) {
  auto j = ojson::parse(text, nullptr, false);
  return j.is_discarded() ? fallback : j;
}

Status InsertEntry(sqlite3* db, const std::string& session, const std::string& tenant, const SessionEntry& e) {
  if (!e.images.empty()) {
    std::vector<ImageRef> refs;
    for (size_t k = 0; k < e.images.size(); ++k) {
      const EntryImage& image = e.images[k];
      refs.push_back({e.seq, static_cast<int64_t>(k), image.at, image.hash, image.width, image.height,
                      image.span_tokens});
    }
    MOE_TRY(AddImageRefs(db, session, tenant, refs));
  }
  Stmt s(db,
         "INSERT INTO entries(session_id, seq, role, kind, created_at, "
         "tokens, message_seq, content, call_id, call_name, "
         "arguments, replaces_first, replaces_last, author, replaced_by) "
         "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  s.Bind(1, session).Bind(2, e.seq).Bind(3, std::string(engine::ChatRoleName(e.role)));
  s.Bind(4, std::string(EntryKindName(e.kind))).Bind(5, e.created_at).Bind(6, e.tokens).Bind(7, e.message_seq);
  s.Bind(8, e.content).Bind(9, e.call_id).Bind(10, e.call_name);
  s.Bind(11, e.kind == EntryKind::kToolCall ? Dump(e.arguments) : std::string());
  if (e.replaces)
    s.Bind(12, e.replaces->first).Bind(13, e.replaces->second);
  else
    s.BindNull(12).BindNull(13);
  s.Bind(14, e.summary_author);
  if (e.replaced_by)
    s.Bind(15, *e.replaced_by);
  else
    s.BindNull(15);
  return s.Run("inserting entry " + std::to_string(e.seq) + " of " + session);
}

}  // namespace

Result<std::unique_ptr<SessionStore>> SessionStore::Open(const std::string& path) {
  std::unique_ptr<SessionStore> s(new SessionStore(path));
  MOE_TRY(s->Init());
  s->writer_.Start([p = s.get()](std::vector<Pending>& batch) { p->CommitBatch(batch); });
  return s;
}

Status SessionStore::Init() {
  // Durable commits: an acknowledged turn survives a crash of the process or the machine.
  MOE_ASSIGN_OR_RETURN(db_, OpenDurableDatabase(path_, "session store"));
  MOE_TRY(Exec(db_, kSchema));
  return Exec(db_, kImageSchema);
}

SessionStore::~SessionStore() {
  writer_.Stop();  // commits what is queued while the database is still open
  if (db_) sqlite3_close_v2(db_);
}

void SessionStore::Enqueue(Job job, Done done) {
  Pending p{std::move(job), std::move(done)};
  if (writer_.Push(std::move(p))) return;
  if (p.done) p.done(Fail(Error::Unavailable("session store: closed")));  // refused: Push left it whole
}

void SessionStore::CommitBatch(std::vector<Pending>& batch) {
  std::vector<Status> results(batch.size(), Ok());
  Status commit = Ok();
  {
    std::lock_guard lock(db_mu_);
    commit = Exec(db_, "BEGIN IMMEDIATE");
    if (commit) {
      for (size_t i = 0; i < batch.size(); ++i) {
        // Each write in its own savepoint: one that fails leaves no trace
        // and does not take the others with it.
        if (auto st = Exec(db_, "SAVEPOINT w"); !st) {
          results[i] = st;
          continue;
        }
        try {
          results[i] = batch[i].job(db_);
        } catch (const std::exception& e) {
          results[i] = Fail(Error::Internal(std::string("session store: ") + e.what()));
        }
        if (!results[i]) (void)Exec(db_, "ROLLBACK TO w");
        (void)Exec(db_, "RELEASE w");
      }
      commit = Exec(db_, "COMMIT");
      if (!commit) (void)Exec(db_, "ROLLBACK");
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].done) continue;
    batch[i].done(commit ? results[i] : commit);
  }
}

Status SessionStore::Wait(const std::function<void(Done)>& write) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  write([promise](const Status& st) { promise->set_value(st); });
  return future.get();
}

void SessionStore::Create(SessionRecord r, std::vector<SessionEntry> entries, Done done) {
  Enqueue(
      [r = std::move(r), entries = std::move(entries)](sqlite3* db) -> Status {
        Stmt s(db,
               "INSERT INTO sessions(id, tenant, created_at, last_active, "
               "model, tools, reasoning_effort, context_policy, "
               "metadata, next_seq, bytes) VALUES(?,?,?,?,?,?,?,?,?,?,?)");
        s.Bind(1, r.id).Bind(2, r.tenant).Bind(3, r.created_at).Bind(4, r.last_active).Bind(5, r.model);
        s.Bind(6, Dump(r.tools)).Bind(7, r.reasoning_effort).Bind(8, Dump(r.context_policy)).Bind(9, Dump(r.metadata));
        s.Bind(10, r.next_seq).Bind(11, r.bytes);
        MOE_TRY(s.Run("creating session " + r.id));
        for (const auto& e : entries) MOE_TRY(InsertEntry(db, r.id, r.tenant, e));
        return Ok();
      },
      std::move(done));
}

void SessionStore::CommitTurn(TurnWrite w, Done done) {
  Enqueue(
      [w = std::move(w)](sqlite3* db) -> Status {
        int64_t next = 0, added = 0;
        for (const auto& e : w.entries) {
          next = std::max(next, e.seq + 1);
          added += e.StoredBytes();
        }
        if (w.summary) {
          next = std::max(next, w.summary->seq + 1);
          added += w.summary->StoredBytes();
        }
        // The files the session names for the first time (each counted once a session).
        for (const auto& f : w.images) added += static_cast<int64_t>(f.bytes.size());
        Stmt u(db,
               "UPDATE sessions SET last_active = ?, next_seq = "
               "max(next_seq, ?), bytes = bytes + ? WHERE id = ?");
        u.Bind(1, w.now).Bind(2, next).Bind(3, added).Bind(4, w.session_id);
        MOE_TRY(u.Run("updating session " + w.session_id));
        if (sqlite3_changes(db) == 0) return Fail(Error::NotFound("session " + w.session_id + " is gone"));
        MOE_TRY(PutImageFiles(db, w.tenant, w.images));
        if (w.summary) {
          MOE_TRY(InsertEntry(db, w.session_id, w.tenant, *w.summary));
          for (int64_t seq : w.replaced) {
            Stmt r(db,
                   "UPDATE entries SET replaced_by = ? WHERE session_id = "
                   "? AND seq = ? AND replaced_by IS NULL");
            r.Bind(1, w.summary->seq).Bind(2, w.session_id).Bind(3, seq);
            MOE_TRY(r.Run("marking entry " + std::to_string(seq) + " replaced"));
          }
        }
        for (const auto& e : w.entries) MOE_TRY(InsertEntry(db, w.session_id, w.tenant, e));
        return Ok();
      },
      std::move(done));
}

void SessionStore::ReplaceSummary(std::string session_id, int64_t seq, std::string text, int64_t tokens, Done done) {
  Enqueue(
      [session_id = std::move(session_id), seq, text = std::move(text), tokens](sqlite3* db) -> Status {
        Stmt s(db,
               "UPDATE entries SET content = ?, tokens = ?, author = "
               "'model' WHERE session_id = ? AND seq = ? AND "
               "kind = 'summary' AND replaced_by IS NULL");
        s.Bind(1, text).Bind(2, tokens).Bind(3, session_id).Bind(4, seq);
        MOE_TRY(s.Run("replacing summary " + std::to_string(seq) + " of " + session_id));
        if (sqlite3_changes(db) == 0) return Fail(Error::NotFound("summary no longer active"));
        return Ok();
      },
      std::move(done));
}

void SessionStore::Delete(std::string session_id, Done done) {
  Enqueue(
      [session_id = std::move(session_id)](sqlite3* db) -> Status {
        Stmt e(db, "DELETE FROM entries WHERE session_id = ?");
        e.Bind(1, session_id);
        MOE_TRY(e.Run("deleting the entries of " + session_id));
        MOE_TRY(DropImageRefs(db, session_id));
        Stmt s(db, "DELETE FROM sessions WHERE id = ?");
        s.Bind(1, session_id);
        MOE_TRY(s.Run("deleting session " + session_id));
        if (sqlite3_changes(db) == 0) return Fail(Error::NotFound("session " + session_id + " does not exist"));
        return Ok();
      },
      std::move(done));
}

void SessionStore::DeleteIdle(double cutoff, Done done) {
  Enqueue(
      [cutoff](sqlite3* db) -> Status {
        Stmt e(db,
               "DELETE FROM entries WHERE session_id IN (SELECT id FROM "
               "sessions WHERE last_active < ?)");
        e.Bind(1, cutoff);
        MOE_TRY(e.Run("deleting idle sessions' entries"));
        Stmt i(db,
               "DELETE FROM image_refs WHERE owner IN (SELECT id FROM "
               "sessions WHERE last_active < ?)");
        i.Bind(1, cutoff);
        MOE_TRY(i.Run("deleting idle sessions' image references"));
        const bool dropped = sqlite3_changes(db) > 0;
        Stmt s(db, "DELETE FROM sessions WHERE last_active < ?");
        s.Bind(1, cutoff);
        MOE_TRY(s.Run("deleting idle sessions"));
        return dropped ? CollectUnreferencedImages(db) : Ok();
      },
      std::move(done));
}

Status SessionStore::Read(const std::function<Status(sqlite3*)>& read) const {
  std::lock_guard lock(db_mu_);
  return read(db_);
}

Result<std::optional<SessionRecord>> SessionStore::Get(const std::string& id) const {
  std::lock_guard lock(db_mu_);
  Stmt s(db_,
         "SELECT id, tenant, created_at, last_active, model, tools, "
         "reasoning_effort, context_policy, metadata, next_seq, "
         "bytes FROM sessions WHERE id = ?");
  if (!s.ok()) return Fail(Error::Io(std::string("session store: ") + sqlite3_errmsg(db_)));
  s.Bind(1, id);
  if (s.Step() != SQLITE_ROW) return std::optional<SessionRecord>();
  SessionRecord r;
  r.id = s.Text(0);
  r.tenant = s.Text(1);
  r.created_at = s.Real(2);
  r.last_active = s.Real(3);
  r.model = s.Text(4);
  r.tools = Load(s.Text(5), nullptr);
  r.reasoning_effort = s.Text(6);
  r.context_policy = Load(s.Text(7), ojson::object());
  r.metadata = Load(s.Text(8), ojson::object());
  r.next_seq = s.Int(9);
  r.bytes = s.Int(10);
  return std::optional<SessionRecord>(std::move(r));
}

Result<std::vector<SessionEntry>> SessionStore::Entries(const std::string& id) const {
  std::lock_guard lock(db_mu_);
  Stmt s(db_,
         "SELECT seq, role, kind, created_at, tokens, message_seq, "
         "content, call_id, call_name, arguments, replaces_first, "
         "replaces_last, author, replaced_by FROM entries WHERE "
         "session_id = ? ORDER BY seq");
  if (!s.ok()) return Fail(Error::Io(std::string("session store: ") + sqlite3_errmsg(db_)));
  s.Bind(1, id);
  std::vector<SessionEntry> out;
  while (s.Step() == SQLITE_ROW) {
    SessionEntry e;
    e.seq = s.Int(0);
    e.role = engine::ParseChatRole(s.Text(1)).value_or(engine::ChatRole::kSystem);
    e.kind = ParseEntryKind(s.Text(2)).value_or(EntryKind::kText);
    e.created_at = s.Real(3);
    e.tokens = s.Int(4);
    e.message_seq = s.Int(5);
    e.content = s.Text(6);
    e.call_id = s.Text(7);
    e.call_name = s.Text(8);
    if (e.kind == EntryKind::kToolCall) e.arguments = Load(s.Text(9), ojson::object());
    if (!s.Null(10)) e.replaces = std::pair<int64_t, int64_t>(s.Int(10), s.Int(11));
    e.summary_author = s.Text(12);
    if (!s.Null(13)) e.replaced_by = s.Int(13);
    out.push_back(std::move(e));
  }
  MOE_ASSIGN_OR_RETURN(std::vector<ImageRef> refs, ImageRefsOf(db_, id));
  for (ImageRef& r : refs) {
    auto entry = std::lower_bound(out.begin(), out.end(), r.seq,
                                  [](const SessionEntry& e, int64_t seq) { return e.seq < seq; });
    if (entry == out.end() || entry->seq != r.seq) continue;
    entry->images.push_back({r.at, std::move(r.hash), r.width, r.height, r.span_tokens});
  }
  return out;
}

Result<int64_t> SessionStore::SessionImageBytes(const std::string& session_id) const {
  std::lock_guard lock(db_mu_);
  return OwnerImageBytes(db_, session_id);
}

Result<std::vector<StoredImageFile>> SessionStore::ImageFiles(const std::string& tenant,
                                                              const std::vector<std::string>& hashes) const {
  std::lock_guard lock(db_mu_);
  return LoadImageFiles(db_, tenant, hashes);
}

Result<int64_t> SessionStore::ImageFileCount() const {
  std::lock_guard lock(db_mu_);
  return daemon::ImageFileCount(db_);
}

Result<int64_t> SessionStore::TenantBytes(const std::string& tenant) const {
  std::lock_guard lock(db_mu_);
  Stmt s(db_, "SELECT coalesce(sum(bytes), 0) FROM sessions WHERE tenant = ?");
  if (!s.ok()) return Fail(Error::Io(std::string("session store: ") + sqlite3_errmsg(db_)));
  s.Bind(1, tenant);
  if (s.Step() != SQLITE_ROW) return Fail(Error::Io(std::string("session store: ") + sqlite3_errmsg(db_)));
  return s.Int(0);
}

Result<int64_t> SessionStore::TotalBytes() const {
  std::lock_guard lock(db_mu_);
  Stmt s(db_, "SELECT coalesce(sum(bytes), 0) FROM sessions");
  if (!s.ok() || s.Step() != SQLITE_ROW) return Fail(Error::Io(std::string("session store: ") + sqlite3_errmsg(db_)));
  int64_t total = s.Int(0);
  // Stored responses (responses/response_store.hpp) share the database and
  // its volume, so the global cap counts them too; no table, nothing stored.
  Stmt r(db_, "SELECT coalesce(sum(bytes), 0) FROM responses");
  if (r.ok() && r.Step() == SQLITE_ROW) total += r.Int(0);
  // Their image files count once each while a response names them (a
  // session's bytes already count the files it names).
  MOE_ASSIGN_OR_RETURN(int64_t images, ResponseImageBytes(db_, nullptr));
  return total + images;
}

Result<int64_t> SessionStore::Count() const {
  std::lock_guard lock(db_mu_);
  Stmt s(db_, "SELECT count(*) FROM sessions");
  if (!s.ok() || s.Step() != SQLITE_ROW) return Fail(Error::Io(std::string("session store: ") + sqlite3_errmsg(db_)));
  return s.Int(0);
}

}  // namespace moeserve::daemon
