// daemon.sqlite_batch_writer: the group commit SessionStore and UsageLedger
// share. Items pushed while a batch commits are taken together as the next
// batch, in order; Stop commits what is queued before it returns; a push
// after Stop is refused and leaves the item with the caller; a file database
// is opened in WAL mode with synchronous=FULL, an in-memory one without.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "moeserve/daemon/sqlite_batch_writer.hpp"

namespace moeserve::daemon {
namespace {

TEST(SqliteBatchWriter, ItemsQueuedDuringACommitFormTheNextBatchInOrder) {
  SqliteBatchWriter<int> writer;
  std::promise<void> first_started;
  std::promise<void> release_first;
  std::shared_future<void> release = release_first.get_future().share();
  std::vector<std::vector<int>> batches;
  std::atomic<int> calls{0};
  writer.Start([&](std::vector<int>& batch) {
    batches.push_back(batch);
    if (calls++ == 0) {
      first_started.set_value();
      release.wait();  // hold the writer inside the first commit
    }
  });
  ASSERT_TRUE(writer.Push(1));
  first_started.get_future().wait();
  for (int i = 2; i <= 5; ++i) ASSERT_TRUE(writer.Push(std::move(i)));
  release_first.set_value();
  writer.Stop();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0], std::vector<int>({1}));
  EXPECT_EQ(batches[1], std::vector<int>({2, 3, 4, 5}));
}

TEST(SqliteBatchWriter, StopCommitsWhatIsQueuedAndRefusesLaterItems) {
  SqliteBatchWriter<std::unique_ptr<int>> writer;
  int committed = 0;
  writer.Start([&](std::vector<std::unique_ptr<int>>& batch) { committed += static_cast<int>(batch.size()); });
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(writer.Push(std::make_unique<int>(i)));
  writer.Stop();
  EXPECT_EQ(committed, 100);
  auto late = std::make_unique<int>(7);
  EXPECT_FALSE(writer.Push(std::move(late)));
  ASSERT_NE(late, nullptr);  // refused: still the caller's to answer
  EXPECT_EQ(*late, 7);
  writer.Stop();  // again: nothing happens
}

std::string PragmaText(sqlite3* db, const char* sql) {
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &s, nullptr), SQLITE_OK);
  std::string out;
  if (sqlite3_step(s) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  return out;
}

TEST(SqliteBatchWriter, AFileDatabaseIsDurableAndAMissingFolderIsAClearError) {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / "sqlite_batch_writer";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto db = OpenDurableDatabase((dir / "store.db").string(), "test store");
  ASSERT_TRUE(db) << db.error().message();
  EXPECT_EQ(PragmaText(*db, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(PragmaText(*db, "PRAGMA synchronous"), "2");  // FULL
  sqlite3_close_v2(*db);

  auto memory = OpenDurableDatabase("", "test store");
  ASSERT_TRUE(memory) << memory.error().message();
  EXPECT_EQ(PragmaText(*memory, "PRAGMA journal_mode"), "memory");
  sqlite3_close_v2(*memory);

  auto missing = OpenDurableDatabase((dir / "no" / "such" / "store.db").string(), "test store");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("test store: cannot open"), std::string::npos) << missing.error().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::daemon
