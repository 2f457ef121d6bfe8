#include "moeserve/daemon/sqlite_batch_writer.hpp"

#include <sqlite3.h>

namespace moeserve::daemon {

namespace {

Status Pragma(sqlite3* db, const char* sql, const std::string& what, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) == SQLITE_OK) return Ok();
  std::string msg = err ? err : "unknown error";
  sqlite3_free(err);
  return Fail(Error::Io(what + " " + path + ": " + msg));
}

}  // namespace

Result<sqlite3*> OpenDurableDatabase(const std::string& path, const std::string& what) {
  const std::string name = path.empty() ? ":memory:" : path;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(name.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK) {
    Error e = Error::Io(what + ": cannot open " + name + ": " + (db ? sqlite3_errmsg(db) : "no memory"));
    sqlite3_close_v2(db);
    return Fail(std::move(e));
  }
  sqlite3_busy_timeout(db, 5000);
  if (!path.empty()) {
    for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
      if (Status st = Pragma(db, pragma, what, path); !st) {
        sqlite3_close_v2(db);
        return Fail(st.error());
      }
    }
  }
  return db;
}

}  // namespace moeserve::daemon
