// What the daemon's two durable stores (SessionStore, UsageLedger) share:
// opening their SQLite database for durable commits, and the group commit
// that writes to it.
//
// OpenDurableDatabase: one connection (the caller serialises its use), a 5 s
// busy timeout, and for a file WAL with synchronous=FULL: a commit appends
// to the log and fsyncs it, so what was committed survives a crash of the
// process and of the machine. An empty path is an in-memory database.
//
// SqliteBatchWriter<Item>: callers queue items from any thread; one writer
// thread takes everything queued so far as one batch and hands it to the
// commit function (which runs one transaction for the whole batch and
// answers each item's callback). Under load a commit, and so an fsync,
// serves many items; alone, an item is committed at once. Stop() commits
// what is queued, then ends the thread; items queued after it are refused.
//
// Thread safety: Push from any thread; Start and Stop from the owner.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moeserve/common/status.hpp"

struct sqlite3;

namespace moeserve::daemon {

// `what` names the store in messages ("usage ledger", "session store").
Result<sqlite3*> OpenDurableDatabase(const std::string& path, const std::string& what);

template <typename Item>
class SqliteBatchWriter {
 public:
  using Commit = std::function<void(std::vector<Item>& batch)>;

  SqliteBatchWriter() = default;
  SqliteBatchWriter(const SqliteBatchWriter&) = delete;
  SqliteBatchWriter& operator=(const SqliteBatchWriter&) = delete;
  ~SqliteBatchWriter() { Stop(); }

  // Starts the writer thread; `commit` runs on it, one batch at a time.
  void Start(Commit commit) {
    commit_ = std::move(commit);
    thread_ = std::thread([this] { Loop(); });
  }

  // Queues `item` and returns true; once Stop has begun, returns false and
  // leaves `item` as it was (the caller answers it).
  bool Push(Item&& item) {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(item));
    cv_.notify_one();
    return true;
  }

  // Commits everything queued, then joins the writer thread. Idempotent.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    for (;;) {
      std::vector<Item> batch;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued is committed
        batch.swap(queue_);
      }
      commit_(batch);
    }
  }

  Commit commit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace moeserve::daemon
