// A rate-limited work queue with client-go's guarantees:
//  - a key is in the queue at most once however often it is added;
//  - a key is never handed to two workers at once: a key added while it is
//    being processed is queued again only when Done() is called for it;
//  - AddRateLimited delays by the default controller rate limiter, the larger
//    of a per-key exponential backoff (5 ms doubling up to 1000 s, reset by
//    Forget) and an overall token bucket (10 per second, burst 100).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

namespace moeserve::op {

using Clock = std::chrono::steady_clock;

// Per-key exponential backoff: base * 2^failures, capped.
class ItemExponentialRateLimiter {
 public:
  ItemExponentialRateLimiter(std::chrono::nanoseconds base, std::chrono::nanoseconds max) : base_(base), max_(max) {}
  std::chrono::nanoseconds When(const std::string& key);
  void Forget(const std::string& key);
  int NumRequeues(const std::string& key);

 private:
  std::mutex mu_;
  std::chrono::nanoseconds base_, max_;
  std::map<std::string, int> failures_;
};

// Token bucket with reservations (golang.org/x/time/rate's Reserve().Delay()).
class BucketRateLimiter {
 public:
  BucketRateLimiter(double qps, int burst) : qps_(qps), burst_(burst), tokens_(burst), last_(Clock::now()) {}
  std::chrono::nanoseconds When();

 private:
  std::mutex mu_;
  double qps_;
  int burst_;
  double tokens_;
  Clock::time_point last_;
};

struct RateLimiterOptions {
  std::chrono::nanoseconds item_base = std::chrono::milliseconds(5);
  std::chrono::nanoseconds item_max = std::chrono::seconds(1000);
  double qps = 10;
  int burst = 100;
};

class WorkQueue {
 public:
  explicit WorkQueue(RateLimiterOptions options = {});
  ~WorkQueue();

  void Add(const std::string& key);
  void AddAfter(const std::string& key, std::chrono::nanoseconds delay);
  void AddRateLimited(const std::string& key);
  void Forget(const std::string& key);
  int NumRequeues(const std::string& key);
  // Blocks for the next key; nullopt once ShutDown() was called and nothing is left.
  std::optional<std::string> Get();
  void Done(const std::string& key);
  void ShutDown();
  size_t Len();

 private:
  void DelayLoop();

  ItemExponentialRateLimiter item_limiter_;
  BucketRateLimiter bucket_limiter_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;       // queued or waiting to be re-queued
  std::set<std::string> processing_;  // handed out, Done() not yet called
  bool shutting_down_ = false;
  std::multimap<Clock::time_point, std::string> waiting_;
  std::condition_variable delay_cv_;
  std::thread delay_thread_;
};

}  // namespace moeserve::op
