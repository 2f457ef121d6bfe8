#include "moeserve/daemon/responses/response_store.hpp"

#include <sqlite3.h>

#include <algorithm>

#include "image/image_table.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS responses(
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL, status TEXT NOT NULL,
  response TEXT NOT NULL, conversation TEXT NOT NULL, bytes INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS responses_tenant ON responses(tenant);
)sql";

// One prepared statement, finalized when it goes out of scope.
struct Statement {
  Statement(sqlite3* db, const char* sql) { rc = sqlite3_prepare_v2(db, sql, -1, &s, nullptr); }
  ~Statement() { sqlite3_finalize(s); }
  void Text(int i, const std::string& v) { sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT); }
  std::string Column(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s, col))) : std::string();
  }
  sqlite3_stmt* s = nullptr;
  int rc = SQLITE_ERROR;
};

Error Sql(sqlite3* db, const std::string& what) { return Error::Io("response store: " + what + ": " + sqlite3_errmsg(db)); }

std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

}  // namespace

Result<std::unique_ptr<ResponseStore>> ResponseStore::Open(SessionStore& sessions, int64_t tenant_quota_bytes,
                                                            int64_t total_quota_bytes) {
  std::unique_ptr<ResponseStore> store(new ResponseStore(sessions, tenant_quota_bytes, total_quota_bytes));
  MOE_TRY(sessions.Wait([&](SessionStore::Done done) {
    sessions.Write(
        [](sqlite3* db) -> Status {
          char* err = nullptr;
          if (sqlite3_exec(db, kSchema, nullptr, nullptr, &err) != SQLITE_OK) {
            std::string msg = err ? err : "unknown error";
            sqlite3_free(err);
            return Fail(Error::Io("response store: creating the table: " + msg));
          }
          return Ok();
        },
        std::move(done));
  }));
  return store;
}

namespace {

// What `tenant`'s stored responses take: their rows, and each image file any
// of them names once (image_table.hpp ResponseImageBytes).
Result<int64_t> TenantUsage(sqlite3* db, const std::string& tenant) {
  Statement rows(db, "SELECT coalesce(sum(bytes), 0) FROM responses WHERE tenant = ?");
  if (rows.rc != SQLITE_OK) return Fail(Sql(db, "reading the tenant's usage"));
  rows.Text(1, tenant);
  if (sqlite3_step(rows.s) != SQLITE_ROW) return Fail(Sql(db, "reading the tenant's usage"));
  MOE_ASSIGN_OR_RETURN(int64_t images, ResponseImageBytes(db, &tenant));
  return sqlite3_column_int64(rows.s, 0) + images;
}

// Every tenant's sessions and responses together, images included.
Result<int64_t> EveryonesUsage(sqlite3* db) {
  Statement all(db,
                "SELECT (SELECT coalesce(sum(bytes), 0) FROM sessions) + "
                "(SELECT coalesce(sum(bytes), 0) FROM responses)");
  if (all.rc != SQLITE_OK) return Fail(Sql(db, "reading the stored total"));
  if (sqlite3_step(all.s) != SQLITE_ROW) return Fail(Sql(db, "reading the stored total"));
  MOE_ASSIGN_OR_RETURN(int64_t images, ResponseImageBytes(db, nullptr));
  return sqlite3_column_int64(all.s, 0) + images;
}

Status WriteRow(sqlite3* db, const StoredResponse& r) {
  const std::string response = Dump(r.response), conversation = Dump(r.conversation);
  // The row's own text; its images are counted as files (TenantUsage).
  const int64_t bytes = static_cast<int64_t>(response.size() + conversation.size());
  Statement s(db,
              "INSERT OR REPLACE INTO responses(id, tenant, created_at, status, response, conversation, bytes) "
              "VALUES(?,?,?,?,?,?,?)");
  if (s.rc != SQLITE_OK) return Fail(Sql(db, "storing " + r.id));
  s.Text(1, r.id);
  s.Text(2, r.tenant);
  sqlite3_bind_double(s.s, 3, r.created_at);
  s.Text(4, r.status);
  s.Text(5, response);
  s.Text(6, conversation);
  sqlite3_bind_int64(s.s, 7, bytes);
  if (sqlite3_step(s.s) != SQLITE_DONE) return Fail(Sql(db, "storing " + r.id));
  Statement drop(db, "DELETE FROM image_refs WHERE owner = ?");
  if (drop.rc != SQLITE_OK) return Fail(Sql(db, "replacing the image references of " + r.id));
  drop.Text(1, r.id);
  if (sqlite3_step(drop.s) != SQLITE_DONE) return Fail(Sql(db, "replacing the image references of " + r.id));
  // The files the conversation names, again (a file an earlier response kept
  // may have been deleted with it meanwhile), then this row's references; a
  // file it does not name is not kept (it could not be replayed from it).
  std::vector<StoredImageFile> named;
  std::vector<ImageRef> refs;
  for (const std::string& hash : StoredImageHashesIn(r.conversation)) {
    auto f = std::find_if(r.images.begin(), r.images.end(), [&](const StoredImageFile& x) { return x.hash == hash; });
    if (f == r.images.end()) continue;
    named.push_back(*f);
    refs.push_back({0, static_cast<int64_t>(refs.size()), 0, hash, f->width, f->height, f->span_tokens});
  }
  MOE_TRY(PutImageFiles(db, r.tenant, named));
  MOE_TRY(AddImageRefs(db, r.id, r.tenant, refs));
  // A replaced row may have named files no row names now.
  return CollectUnreferencedImages(db);
}

}  // namespace

void ResponseStore::Put(StoredResponse r, Done done) {
  sessions_.Write(
      [r = std::move(r), quota = quota_, total = total_](sqlite3* db) -> Status {
        // Written first, then measured: what the tenant and everyone store
        // afterwards, each file once, is what the quotas bound. Past one, the
        // job fails and its savepoint (session_store.hpp) undoes the write.
        // A write that adds nothing (a row replaced by a smaller one) is
        // never refused.
        MOE_ASSIGN_OR_RETURN(const int64_t tenant_before, TenantUsage(db, r.tenant));
        MOE_ASSIGN_OR_RETURN(const int64_t everyone_before, EveryonesUsage(db));
        MOE_TRY(WriteRow(db, r));
        MOE_ASSIGN_OR_RETURN(const int64_t tenant_after, TenantUsage(db, r.tenant));
        if (tenant_after > quota && tenant_after > tenant_before) {
          return Fail(Error::ResourceExhausted(
              "tenant '" + r.tenant + "' stores " + std::to_string(tenant_before) +
              " bytes of responses and the images they keep; with this one it would store " +
              std::to_string(tenant_after) + " and the quota is " + std::to_string(quota) + " bytes"));
        }
        MOE_ASSIGN_OR_RETURN(const int64_t everyone_after, EveryonesUsage(db));
        if (everyone_after > total && everyone_after > everyone_before) {
          return Fail(Error::OutOfRange("every tenant's sessions and responses (images included) take " +
                                         std::to_string(everyone_before) + " bytes; with this response they would take " +
                                         std::to_string(everyone_after) +
                                         " and the global cap (session_total_quota_bytes) is " + std::to_string(total)));
        }
        return Ok();
      },
      std::move(done));
}

void ResponseStore::Delete(std::string tenant, std::string id, Done done) {
  sessions_.Write(
      [tenant = std::move(tenant), id = std::move(id)](sqlite3* db) -> Status {
        Statement s(db, "DELETE FROM responses WHERE id = ? AND tenant = ?");
        if (s.rc != SQLITE_OK) return Fail(Sql(db, "deleting " + id));
        s.Text(1, id);
        s.Text(2, tenant);
        if (sqlite3_step(s.s) != SQLITE_DONE) return Fail(Sql(db, "deleting " + id));
        if (sqlite3_changes(db) == 0) return Fail(Error::NotFound("response " + id + " does not exist"));
        return DropImageRefs(db, id);
      },
      std::move(done));
}

Result<std::optional<StoredResponse>> ResponseStore::Get(const std::string& tenant, const std::string& id) const {
  std::optional<StoredResponse> out;
  MOE_TRY(sessions_.Read([&](sqlite3* db) -> Status {
    Statement s(db, "SELECT created_at, status, response, conversation FROM responses WHERE id = ? AND tenant = ?");
    if (s.rc != SQLITE_OK) return Fail(Sql(db, "reading " + id));
    s.Text(1, id);
    s.Text(2, tenant);
    const int rc = sqlite3_step(s.s);
    if (rc == SQLITE_DONE) return Ok();
    if (rc != SQLITE_ROW) return Fail(Sql(db, "reading " + id));
    StoredResponse r;
    r.id = id;
    r.tenant = tenant;
    r.created_at = sqlite3_column_double(s.s, 0);
    r.status = s.Column(1);
    r.response = ojson::parse(s.Column(2), nullptr, false);
    r.conversation = ojson::parse(s.Column(3), nullptr, false);
    if (r.response.is_discarded() || r.conversation.is_discarded())
      return Fail(Error::Io("response store: the row of " + id + " is not JSON"));
    out = std::move(r);
    return Ok();
  }));
  return out;
}

}  // namespace moeserve::daemon
