// A rate-limited work queue with client-go's guarantees:
//  - a key is in the queue at most once however often it is added;
//  - a key is never handed to two workers at once: a key added while it is
//    being processed is queued again only when Done() is called for it;
//  - AddRateLimited delays by the default controller rate limiter, the larger
//    of a per-key exponential backoff (5 ms doubling up to 1000 s, reset by
//    Forget) and an overall token bucket (10 per second, burst 100);
//  - a key waiting in AddAfter is waiting once: adding it again keeps the
//    earlier of the two ready times (client-go's delaying queue).
//
// Time comes from a QueueClock (client-go's clock.Clock): the steady clock in
// production, a FakeQueueClock in tests, which the test advances by hand so
// that delays are checked exactly instead of by sleeping.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

namespace moeserve::op {

using Clock = std::chrono::steady_clock;

// The time source of the queue and its rate limiters.
class QueueClock {
 public:
  virtual ~QueueClock() = default;
  virtual Clock::time_point Now() = 0;
  // Blocks on `cv` (with `lock` held on entry and on return) until notified
  // or until Now() reaches `deadline` (nullopt: no deadline). May return
  // early; callers re-check their condition.
  virtual void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                         std::optional<Clock::time_point> deadline) = 0;
};

class SteadyQueueClock final : public QueueClock {
 public:
  Clock::time_point Now() override { return Clock::now(); }
  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 std::optional<Clock::time_point> deadline) override;
};

// The shared production clock.
std::shared_ptr<QueueClock> DefaultQueueClock();

// A clock that moves only when Advance is called. A waiter registers its
// mutex and condition variable; Advance takes that mutex before notifying,
// so a waiter that read Now() and is about to wait cannot miss the step.
// Waiters must outlive concurrent Advance calls (destroy the queue after the
// test stops advancing).
class FakeQueueClock final : public QueueClock {
 public:
  FakeQueueClock() : now_(Clock::time_point{} + std::chrono::hours(1)) {}
  Clock::time_point Now() override;
  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 std::optional<Clock::time_point> deadline) override;
  void Advance(std::chrono::nanoseconds step);
  // Blocks until some waiter has gone to sleep at the current fake time,
  // i.e. a background loop has seen the latest Advance and has nothing more
  // to do before time moves again (client-go's fake clock HasWaiters). False
  // after `limit` of real time.
  bool WaitForSleeper(std::chrono::milliseconds limit = std::chrono::seconds(10));

 private:
  struct Waiter {
    std::mutex* mu;
    std::condition_variable* cv;
    Clock::time_point since;  // fake time when it went to sleep
  };
  std::mutex mu_;
  std::condition_variable changed_;
  Clock::time_point now_;
  std::map<uint64_t, Waiter> waiters_;
  uint64_t next_id_ = 0;
};

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
  BucketRateLimiter(double qps, int burst, std::shared_ptr<QueueClock> clock = DefaultQueueClock())
      : clock_(std::move(clock)), qps_(qps), burst_(burst), tokens_(burst), last_(clock_->Now()) {}
  std::chrono::nanoseconds When();

 private:
  std::shared_ptr<QueueClock> clock_;
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
  explicit WorkQueue(RateLimiterOptions options = {}, std::shared_ptr<QueueClock> clock = DefaultQueueClock());
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
  // Keys waiting for their AddAfter delay.
  size_t Waiting();

 private:
  void DelayLoop();

  std::shared_ptr<QueueClock> clock_;
  ItemExponentialRateLimiter item_limiter_;
  BucketRateLimiter bucket_limiter_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;       // queued or waiting to be re-queued
  std::set<std::string> processing_;  // handed out, Done() not yet called
  bool shutting_down_ = false;
  // Ordered by ready time, with each key's entry found through ready_at_.
  std::multimap<Clock::time_point, std::string> waiting_;
  std::map<std::string, std::multimap<Clock::time_point, std::string>::iterator> ready_at_;
  std::condition_variable delay_cv_;
  std::thread delay_thread_;
};

}  // namespace moeserve::op
