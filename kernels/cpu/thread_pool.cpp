#include "moeserve/kernels/thread_pool.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

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
    stop_.store(true);
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
    if (pending_.fetch_sub(1) == 1) {  // the call's last task: wake a sleeping caller
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
  }
  tl_in_pool_task = was;
}

namespace {
// About 20-50 microseconds of polling: longer than the gap between two
// parallel-fors of one decode step, far shorter than a scheduler quantum.
constexpr int kSpinIterations = 4000;
inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
constexpr uint64_t kDoorOpen = uint64_t{1} << 32;
constexpr uint64_t kDoorInside = kDoorOpen - 1;
uint64_t DoorOf(uint64_t generation) { return generation << 33; }
}  // namespace

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    bool woke = false;
    for (int spin = 0; spin < kSpinIterations; ++spin) {
      if (generation_.load() != seen || stop_.load()) {
        woke = true;
        break;
      }
      CpuRelax();
    }
    if (!woke) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_start_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load();
    // Enter the call of generation `seen` if its door is still open; fn_ and
    // n_ stay valid while this worker is inside.
    const uint64_t mine = DoorOf(seen) | kDoorOpen;
    uint64_t door = door_.load();
    bool inside = false;
    while ((door & ~kDoorInside) == mine && !inside) inside = door_.compare_exchange_weak(door, door + 1);
    if (!inside) continue;
    RunTasks();
    door_.fetch_sub(1);
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  std::unique_lock<std::mutex> run(run_mu_, std::defer_lock);
  if (n == 1 || workers_.empty() || tl_in_pool_task || !run.try_lock()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  fn_ = &fn;
  n_ = n;
  next_.store(0);
  pending_.store(n);
  // Opens the door, then publishes the generation (seq_cst, after fn_/n_).
  // A worker either sees the new generation before it sleeps, or is counted
  // in sleepers_ and is woken here.
  const uint64_t generation = generation_.load() + 1;
  door_.store(DoorOf(generation) | kDoorOpen);
  generation_.store(generation);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_start_.notify_all();
  }
  RunTasks();
  // Every task done: the caller took the rest, so only a worker still
  // running one of them is waited for.
  bool done = false;
  for (int spin = 0; spin < kSpinIterations && !done; ++spin) {
    done = pending_.load() == 0;
    if (!done) CpuRelax();
  }
  if (!done) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return pending_.load() == 0; });
  }
  // Close the door once nobody is inside: a worker inside has no task left
  // and is on its way out.
  for (int spin = 0;; ++spin) {
    uint64_t open_empty = DoorOf(generation) | kDoorOpen;
    if (door_.compare_exchange_weak(open_empty, DoorOf(generation))) break;
    if (spin < kSpinIterations) CpuRelax();
    else std::this_thread::yield();
  }
  fn_ = nullptr;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  region_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  regions_.fetch_add(1, std::memory_order_relaxed);
}

ThreadPool::Stats ThreadPool::stats() const {
  return {regions_.load(std::memory_order_relaxed), static_cast<double>(region_ns_.load(std::memory_order_relaxed)) * 1e-9};
}

namespace {
std::atomic<int> g_requested_threads{0};
std::atomic<int> g_created_threads{0};
}  // namespace

bool RequestDefaultThreadPoolSize(int threads) {
  if (threads <= 0) return true;
  g_requested_threads.store(threads);
  const int created = g_created_threads.load();
  return created == 0 || created == threads;
}

ThreadPool& DefaultThreadPool() {
  static ThreadPool pool([] {
    int n = 0;
    if (const char* env = std::getenv("MOESERVE_CPU_THREADS")) n = std::atoi(env);
    if (n <= 0) n = g_requested_threads.load();
    if (n <= 0) {
      unsigned hc = std::thread::hardware_concurrency();
      n = hc == 0 ? 1 : static_cast<int>(hc);
    }
    g_created_threads.store(n);
    return n;
  }());
  return pool;
}

}  // namespace moeserve::kernels
