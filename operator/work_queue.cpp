#include "moeserve/operator/work_queue.hpp"

#include <algorithm>
#include <cmath>

namespace moeserve::op {

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
  auto now = Clock::now();
  double elapsed = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  tokens_ = std::min<double>(burst_, tokens_ + elapsed * qps_);
  tokens_ -= 1;  // reserve, possibly going into debt
  if (tokens_ >= 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(static_cast<int64_t>(-tokens_ / qps_ * 1e9));
}

WorkQueue::WorkQueue(RateLimiterOptions options)
    : item_limiter_(options.item_base, options.item_max), bucket_limiter_(options.qps, options.burst) {
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
  waiting_.emplace(Clock::now() + delay, key);
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

void WorkQueue::DelayLoop() {
  std::unique_lock lock(mu_);
  while (!shutting_down_) {
    if (waiting_.empty()) {
      delay_cv_.wait(lock);
      continue;
    }
    auto first = waiting_.begin();
    if (first->first > Clock::now()) {
      delay_cv_.wait_until(lock, first->first);
      continue;
    }
    std::string key = first->second;
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
