#include "moeserve/kernels/thread_pool.hpp"

#include <cstdlib>

namespace moeserve::kernels {
namespace {
thread_local bool tl_in_pool_task = false;
}

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  const bool was = tl_in_pool_task;
  tl_in_pool_task = true;
  for (;;) {
    size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) break;
    (*fn_)(i);
  }
  tl_in_pool_task = was;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  std::unique_lock<std::mutex> run(run_mu_, std::defer_lock);
  if (n == 1 || workers_.empty() || tl_in_pool_task || !run.try_lock()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  RunTasks();
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return active_ == 0; });
  fn_ = nullptr;
}

ThreadPool& DefaultThreadPool() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("MOESERVE_CPU_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return v;
    }
    unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : static_cast<int>(hc);
  }());
  return pool;
}

}  // namespace moeserve::kernels
