// A prepared SQLite statement that finalizes itself: what the daemon's
// durable stores (SessionStore, UsageLedger) bind and step through.
// `store` names the store in Run's errors ("session store: <what>: ...").
//
// Thread safety: one statement, one thread; the caller holds the store's
// connection lock.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

class SqliteStatement {
 public:
  SqliteStatement(sqlite3* db, const char* sql, const char* store = "database") : db_(db), store_(store) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr);
  }
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;
  ~SqliteStatement() { sqlite3_finalize(s_); }

  bool ok() const { return rc_ == SQLITE_OK; }
  SqliteStatement& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  SqliteStatement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  SqliteStatement& Bind(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  SqliteStatement& BindNull(int i) {
    sqlite3_bind_null(s_, i);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  void Reset() { sqlite3_reset(s_); }
  bool Null(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  double Real(int col) const { return sqlite3_column_double(s_, col); }
  std::string Text(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, col))) : std::string();
  }
  // Steps once and expects SQLITE_DONE; else an error naming the store and `what`.
  Status Run(const std::string& what) {
    if (!ok() || Step() != SQLITE_DONE) return Fail(Error::Io(std::string(store_) + ": " + what + ": " + sqlite3_errmsg(db_)));
    return Ok();
  }

 private:
  sqlite3* db_;
  const char* store_;
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

}  // namespace moeserve::daemon
