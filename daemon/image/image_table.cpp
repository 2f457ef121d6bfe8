#include "image/image_table.hpp"

#include "sqlite_statement.hpp"

namespace moeserve::daemon {

const char* const kImageSchema = R"sql(
CREATE TABLE IF NOT EXISTS images(
  tenant TEXT NOT NULL, hash TEXT NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL,
  span_tokens INTEGER NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL, UNIQUE(tenant, hash));
CREATE TABLE IF NOT EXISTS image_refs(
  owner TEXT NOT NULL, seq INTEGER NOT NULL, ord INTEGER NOT NULL, tenant TEXT NOT NULL, hash TEXT NOT NULL,
  at INTEGER NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL, span_tokens INTEGER NOT NULL,
  PRIMARY KEY(owner, seq, ord)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS image_refs_file ON image_refs(tenant, hash);
)sql";

namespace {

class Stmt : public SqliteStatement {
 public:
  Stmt(sqlite3* db, const char* sql) : SqliteStatement(db, sql, "image store") {}
};

Status IoError(sqlite3* db, const std::string& what) {
  return Fail(Error::Io("image store: " + what + ": " + sqlite3_errmsg(db)));
}

}  // namespace

Status PutImageFiles(sqlite3* db, const std::string& tenant, const std::vector<StoredImageFile>& files) {
  for (const StoredImageFile& f : files) {
    // The blob is bound through the C API: SqliteStatement binds text only.
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db,
                           "INSERT OR IGNORE INTO images(tenant, hash, width, height, span_tokens, size, data) "
                           "VALUES(?,?,?,?,?,?,?)",
                           -1, &s, nullptr) != SQLITE_OK)
      return IoError(db, "preparing an image insert");
    sqlite3_bind_text(s, 1, tenant.data(), static_cast<int>(tenant.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, f.hash.data(), static_cast<int>(f.hash.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 3, f.width);
    sqlite3_bind_int64(s, 4, f.height);
    sqlite3_bind_int64(s, 5, f.span_tokens);
    sqlite3_bind_int64(s, 6, static_cast<int64_t>(f.bytes.size()));
    sqlite3_bind_blob64(s, 7, f.bytes.data(), f.bytes.size(), SQLITE_STATIC);
    const int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return IoError(db, "storing image " + f.hash.substr(0, 16));
  }
  return Ok();
}

Status AddImageRefs(sqlite3* db, const std::string& owner, const std::string& tenant,
                    const std::vector<ImageRef>& refs) {
  for (const ImageRef& r : refs) {
    Stmt s(db,
           "INSERT OR REPLACE INTO image_refs(owner, seq, ord, tenant, hash, at, width, height, span_tokens) "
           "VALUES(?,?,?,?,?,?,?,?,?)");
    s.Bind(1, owner).Bind(2, r.seq).Bind(3, r.ord).Bind(4, tenant).Bind(5, r.hash).Bind(6, r.at);
    s.Bind(7, static_cast<int64_t>(r.width)).Bind(8, static_cast<int64_t>(r.height)).Bind(9, r.span_tokens);
    MOE_TRY(s.Run("referring to image " + r.hash.substr(0, 16) + " from " + owner));
  }
  return Ok();
}

Status CollectUnreferencedImages(sqlite3* db) {
  Stmt s(db,
         "DELETE FROM images WHERE NOT EXISTS (SELECT 1 FROM image_refs r WHERE r.tenant = images.tenant "
         "AND r.hash = images.hash)");
  return s.Run("deleting images no conversation refers to");
}

Status DropImageRefs(sqlite3* db, const std::string& owner) {
  Stmt s(db, "DELETE FROM image_refs WHERE owner = ?");
  s.Bind(1, owner);
  MOE_TRY(s.Run("dropping the image references of " + owner));
  if (sqlite3_changes(db) == 0) return Ok();
  return CollectUnreferencedImages(db);
}

Result<std::vector<ImageRef>> ImageRefsOf(sqlite3* db, const std::string& owner) {
  Stmt s(db,
         "SELECT seq, ord, at, hash, width, height, span_tokens FROM image_refs WHERE owner = ? ORDER BY seq, ord");
  if (!s.ok()) return std::unexpected(IoError(db, "reading image references").error());
  s.Bind(1, owner);
  std::vector<ImageRef> out;
  while (s.Step() == SQLITE_ROW) {
    ImageRef r;
    r.seq = s.Int(0);
    r.ord = s.Int(1);
    r.at = s.Int(2);
    r.hash = s.Text(3);
    r.width = static_cast<uint32_t>(s.Int(4));
    r.height = static_cast<uint32_t>(s.Int(5));
    r.span_tokens = s.Int(6);
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<StoredImageFile>> LoadImageFiles(sqlite3* db, const std::string& tenant,
                                                    const std::vector<std::string>& hashes) {
  std::vector<StoredImageFile> out;
  for (const std::string& hash : hashes) {
    Stmt s(db, "SELECT width, height, span_tokens, data FROM images WHERE tenant = ? AND hash = ?");
    if (!s.ok()) return std::unexpected(IoError(db, "reading an image").error());
    s.Bind(1, tenant).Bind(2, hash);
    if (s.Step() != SQLITE_ROW) continue;
    StoredImageFile f;
    f.hash = hash;
    f.width = static_cast<uint32_t>(s.Int(0));
    f.height = static_cast<uint32_t>(s.Int(1));
    f.span_tokens = s.Int(2);
    f.bytes = s.Text(3);  // the blob's bytes as they are (Text copies by length)
    out.push_back(std::move(f));
  }
  return out;
}

Result<int64_t> OwnerImageBytes(sqlite3* db, const std::string& owner) {
  Stmt s(db,
         "SELECT coalesce(sum(size), 0) FROM images WHERE (tenant, hash) IN "
         "(SELECT tenant, hash FROM image_refs WHERE owner = ?)");
  if (!s.ok()) return std::unexpected(IoError(db, "summing image bytes").error());
  s.Bind(1, owner);
  if (s.Step() != SQLITE_ROW) return std::unexpected(IoError(db, "summing image bytes").error());
  return s.Int(0);
}

Result<int64_t> ResponseImageBytes(sqlite3* db, const std::string* tenant) {
  // Owners are told apart by the table their id is a key of.
  const char* by_tenant =
      "SELECT coalesce(sum(i.size), 0) FROM images i WHERE i.tenant = ? AND EXISTS "
      "(SELECT 1 FROM image_refs r JOIN responses p ON p.id = r.owner WHERE r.tenant = i.tenant AND r.hash = i.hash)";
  const char* everyone =
      "SELECT coalesce(sum(i.size), 0) FROM images i WHERE EXISTS "
      "(SELECT 1 FROM image_refs r JOIN responses p ON p.id = r.owner WHERE r.tenant = i.tenant AND r.hash = i.hash) "
      "AND NOT EXISTS "
      "(SELECT 1 FROM image_refs r JOIN sessions s ON s.id = r.owner WHERE r.tenant = i.tenant AND r.hash = i.hash)";
  Stmt s(db, tenant ? by_tenant : everyone);
  if (!s.ok()) return 0;  // no responses table: no response keeps anything
  if (tenant) s.Bind(1, *tenant);
  if (s.Step() != SQLITE_ROW) return std::unexpected(IoError(db, "summing the stored responses' image bytes").error());
  return s.Int(0);
}

Result<int64_t> ImageFileCount(sqlite3* db) {
  Stmt s(db, "SELECT count(*) FROM images");
  if (!s.ok() || s.Step() != SQLITE_ROW) return std::unexpected(IoError(db, "counting images").error());
  return s.Int(0);
}

}  // namespace moeserve::daemon
