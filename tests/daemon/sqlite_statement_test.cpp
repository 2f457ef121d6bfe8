// daemon.sqlite_statement: the prepared-statement wrapper the durable stores
// share. Values round-trip exactly (text with NUL bytes and UTF-8, the int64
// extremes, doubles, NULL), a bound text outlives the caller's string, Run
// names the store and the step in every failure (bad SQL, a constraint, a
// statement that returns rows), Reset allows a second execution, and the
// destructor finalizes (the connection then closes without SQLITE_BUSY).
#include "../../daemon/sqlite_statement.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace moeserve::daemon {
namespace {

struct Db {
  Db() { EXPECT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK); }
  ~Db() {
    if (db) sqlite3_close_v2(db);
  }
  sqlite3* db = nullptr;
};

TEST(SqliteStatement, ValuesRoundTripExactly) {
  Db d;
  ASSERT_TRUE(SqliteStatement(d.db, "CREATE TABLE t(s TEXT, i INTEGER, r REAL, n TEXT)").Run("create"));
  const std::string text("a\0b \xc3\xa9\xe2\x82\xac", 9);
  {
    SqliteStatement insert(d.db, "INSERT INTO t VALUES(?, ?, ?, ?)", "test store");
    ASSERT_TRUE(insert.ok());
    {
      std::string temporary = text;  // gone before the step: the bind must have copied it
      insert.Bind(1, temporary);
    }
    insert.Bind(2, std::numeric_limits<int64_t>::min()).Bind(3, 0.1).BindNull(4);
    ASSERT_TRUE(insert.Run("insert"));
    insert.Reset();
    insert.Bind(1, std::string()).Bind(2, std::numeric_limits<int64_t>::max()).Bind(3, -2.5e300).Bind(4, "x");
    ASSERT_TRUE(insert.Run("insert again")) << "Reset makes the statement runnable again";
  }
  SqliteStatement select(d.db, "SELECT s, i, r, n FROM t ORDER BY i");
  ASSERT_EQ(select.Step(), SQLITE_ROW);
  EXPECT_EQ(select.Text(0), text);
  EXPECT_EQ(select.Text(0).size(), 9u);
  EXPECT_EQ(select.Int(1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(select.Real(2), 0.1);
  EXPECT_TRUE(select.Null(3));
  EXPECT_EQ(select.Text(3), "") << "NULL reads as empty text";
  ASSERT_EQ(select.Step(), SQLITE_ROW);
  EXPECT_EQ(select.Text(0), "");
  EXPECT_FALSE(select.Null(0)) << "an empty text is not NULL";
  EXPECT_EQ(select.Int(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(select.Real(2), -2.5e300);
  EXPECT_FALSE(select.Null(3));
  EXPECT_EQ(select.Step(), SQLITE_DONE);
}

TEST(SqliteStatement, FailuresNameTheStoreTheStepAndSqlitesReason) {
  Db d;
  SqliteStatement bad(d.db, "SELEKT 1", "usage ledger");
  EXPECT_FALSE(bad.ok());
  const Status st = bad.Run("read totals");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kIo);
  EXPECT_EQ(st.error().message().rfind("usage ledger: read totals: ", 0), 0u) << st.error().message();
  EXPECT_NE(st.error().message().find("syntax error"), std::string::npos) << st.error().message();

  ASSERT_TRUE(SqliteStatement(d.db, "CREATE TABLE k(id TEXT PRIMARY KEY)").Run("create"));
  ASSERT_TRUE(SqliteStatement(d.db, "INSERT INTO k VALUES('a')").Run("insert"));
  const Status dup = SqliteStatement(d.db, "INSERT INTO k VALUES('a')", "session store").Run("insert key");
  ASSERT_FALSE(dup);
  EXPECT_NE(dup.error().message().find("session store: insert key: "), std::string::npos) << dup.error().message();
  EXPECT_NE(dup.error().message().find("UNIQUE"), std::string::npos) << dup.error().message();

  // Run expects a statement that finishes in one step: rows are a failure.
  const Status rows = SqliteStatement(d.db, "SELECT id FROM k", "session store").Run("not a write");
  EXPECT_FALSE(rows);
}

TEST(SqliteStatement, TheDestructorFinalizes) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK);
  {
    SqliteStatement s(db, "SELECT 1");
    ASSERT_EQ(s.Step(), SQLITE_ROW);  // left mid-result on purpose
  }
  // sqlite3_close (not _v2) refuses with SQLITE_BUSY while a statement lives.
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
}

}  // namespace
}  // namespace moeserve::daemon
