#include "moeserve/operator/work_queue.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moeserve::op {

void SteadyQueueClock::WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                                 std::optional<Clock::time_point> deadline) {
  if (deadline)
    cv.wait_until(lock, *deadline);
  else
    cv.wait(lock);
}

std::shared_ptr<QueueClock> DefaultQueueClock() {
  static const auto clock = std::make_shared<SteadyQueueClock>();
  return clock;
}

Clock::time_point FakeQueueClock::Now() {
  std::lock_guard lock(mu_);
  return now_;
}

void FakeQueueClock::WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                               std::optional<Clock::time_point> deadline) {
  uint64_t id;
  {
    std::lock_guard guard(mu_);
    if (deadline && *deadline <= now_) return;
    id = next_id_++;
    waiters_[id] = Waiter{lock.mutex(), &cv, now_};
    changed_.notify_all();
  }
  // Fake time moves only in Advance, which notifies `cv` under `lock`'s
  // mutex: an untimed wait cannot sleep through a step.
  cv.wait(lock);
  std::lock_guard guard(mu_);
  waiters_.erase(id);
}

void FakeQueueClock::Advance(std::chrono::nanoseconds step) {
  std::vector<Waiter> wake;
  {
    std::lock_guard guard(mu_);
    now_ += step;
    for (auto& [id, w] : waiters_) wake.push_back(w);
  }
  for (auto& w : wake) {
    std::lock_guard guard(*w.mu);
    w.cv->notify_all();
  }
}

bool FakeQueueClock::WaitForSleeper(std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, limit, [&] {
    return std::any_of(waiters_.begin(), waiters_.end(), [&](const auto& w) { return w.second.since == now_; });
  });
}

std::chrono::nanoseconds ItemExponentialRateLimiter::When(const std::string& key) {
  std::lock_guard lock(mu_);
  int exp = failures_[key]++;
  // base * 2^exp overflows long before exp reaches 64; cap in floating point.
  double delay = static_cast<double>(base_.count()) * std::pow(2.0, exp);
  if (delay > static_cast<double>(max_.count())) return max_;
  return std::chrono::nanoseconds(static_cast<int64_t>(delay));
}

void ItemExponentialRateLimiter::Forget(const std::string& key) {
  std::lock_guard lock(mu_);
  failures_.erase(key);
}

int ItemExponentialRateLimiter::NumRequeues(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

std::chrono::nanoseconds BucketRateLimiter::When() {
  std::lock_guard lock(mu_);
  auto now = clock_->Now();
  double elapsed = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  tokens_ = std::min<double>(burst_, tokens_ + elapsed * qps_);
  tokens_ -= 1;  // reserve, possibly going into debt
  if (tokens_ >= 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(static_cast<int64_t>(-tokens_ / qps_ * 1e9));
}

WorkQueue::WorkQueue(RateLimiterOptions options, std::shared_ptr<QueueClock> clock)
    : clock_(std::move(clock)),
      item_limiter_(options.item_base, options.item_max),
      bucket_limiter_(options.qps, options.burst, clock_) {
  delay_thread_ = std::thread([this] { DelayLoop(); });
}

WorkQueue::~WorkQueue() {
  ShutDown();
  if (delay_thread_.joinable()) delay_thread_.join();
}

void WorkQueue::Add(const std::string& key) {
  std::lock_guard lock(mu_);
  if (shutting_down_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (processing_.count(key)) return;  // Done() re-queues it
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::AddAfter(const std::string& key, std::chrono::nanoseconds delay) {
  if (delay <= std::chrono::nanoseconds(0)) return Add(key);
  std::lock_guard lock(mu_);
  if (shutting_down_) return;
  const auto ready = clock_->Now() + delay;
  if (auto it = ready_at_.find(key); it != ready_at_.end()) {
    // Already waiting: one entry, at the earlier time. A later time would
    // postpone work someone already asked for; two entries would run it twice.
    if (it->second->first <= ready) return;
    waiting_.erase(it->second);
    ready_at_.erase(it);
  }
  ready_at_[key] = waiting_.emplace(ready, key);
  delay_cv_.notify_one();
}

void WorkQueue::AddRateLimited(const std::string& key) {
  AddAfter(key, std::max(item_limiter_.When(key), bucket_limiter_.When()));
}

void WorkQueue::Forget(const std::string& key) { item_limiter_.Forget(key); }

int WorkQueue::NumRequeues(const std::string& key) { return item_limiter_.NumRequeues(key); }

std::optional<std::string> WorkQueue::Get() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || shutting_down_; });
  if (queue_.empty()) return std::nullopt;
  std::string key = queue_.front();
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  return key;
}

void WorkQueue::Done(const std::string& key) {
  std::lock_guard lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key)) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::ShutDown() {
  std::lock_guard lock(mu_);
  shutting_down_ = true;
  cv_.notify_all();
  delay_cv_.notify_all();
}

size_t WorkQueue::Len() {
  std::lock_guard lock(mu_);
  return queue_.size();
}

size_t WorkQueue::Waiting() {
  std::lock_guard lock(mu_);
  return waiting_.size();
}

void WorkQueue::DelayLoop() {
  std::unique_lock lock(mu_);
  while (!shutting_down_) {
    if (waiting_.empty()) {
      clock_->WaitUntil(lock, delay_cv_, std::nullopt);
      continue;
    }
    auto first = waiting_.begin();
    if (first->first > clock_->Now()) {
      clock_->WaitUntil(lock, delay_cv_, first->first);
      continue;
    }
    std::string key = first->second;
    ready_at_.erase(key);
    waiting_.erase(first);
    if (!dirty_.count(key)) {
      dirty_.insert(key);
      if (!processing_.count(key)) {
        queue_.push_back(key);
        cv_.notify_one();
      }
    }
  }
}

}  // namespace moeserve::op
