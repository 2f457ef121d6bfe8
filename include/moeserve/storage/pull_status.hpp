// What a pull is doing, for people and for the daemon: /readyz reports it
// (503 until state == kReady), log lines and the terminal bar read it.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace moeserve::storage {

enum class PullState {
  kIdle,
  kWaitingForLock,   // another process pulls the same model into this cache
  kFetchingManifest,
  kDownloading,
  kVerifying,
  kReady,            // verified and in place; the daemon may load it
  kFailed,
};
std::string_view PullStateName(PullState state);

struct PullProgress {
  PullState state = PullState::kIdle;
  std::string uri;
  std::string revision;
  uint64_t bytes_total = 0;    // model size (from the manifest)
  uint64_t bytes_done = 0;     // present in the cache, resumed bytes included
  uint64_t bytes_fetched = 0;  // moved over the network by this pull
  double rate_bytes_per_s = 0; // recent download rate
  double eta_s = -1;           // -1: unknown
  std::string message;         // the error when kFailed
  // {"state":"downloading","uri":...,"bytes_total":...,...}
  std::string ToJson() const;
  // "pull: 45.2 MiB / 90.1 MiB (50%), 12.3 MiB/s, ETA 4s"
  std::string ToLogLine() const;
};

class PullStatus {
 public:
  void Begin(const std::string& uri, const std::string& revision);
  void SetState(PullState state);
  void SetTotal(uint64_t bytes_total, uint64_t bytes_done);
  void AddDone(uint64_t bytes) { done_.fetch_add(bytes, std::memory_order_relaxed); }
  void SubDone(uint64_t bytes) { done_.fetch_sub(bytes, std::memory_order_relaxed); }
  void AddFetched(uint64_t bytes) { fetched_.fetch_add(bytes, std::memory_order_relaxed); }
  void Fail(const std::string& message);
  bool Ready() const { return Snapshot().state == PullState::kReady; }
  // Also updates the rate estimate (an exponential moving average between calls).
  PullProgress Snapshot() const;

 private:
  mutable std::mutex mu_;
  PullProgress base_;  // state, uri, revision, total, message
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> fetched_{0};
  mutable std::chrono::steady_clock::time_point last_sample_{};
  mutable uint64_t last_fetched_ = 0;
  mutable double rate_ = 0;
};

// Human sizes: "90.1 MiB".
std::string FormatBytes(double bytes);

}  // namespace moeserve::storage
