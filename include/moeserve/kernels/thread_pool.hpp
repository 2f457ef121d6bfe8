// A small fixed thread pool for the CPU kernels: a parallel-for over task
// indices, the calling thread taking part. Sized to the cores at start-up
// (MOESERVE_CPU_THREADS overrides).
//
// Thread safety: ParallelFor may be called from any thread. Only one
// parallel-for runs on the pool at a time; a call made while the pool is busy
// (another thread's call, or a nested call from inside a task) runs its tasks
// serially on the calling thread instead of waiting, so it never deadlocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve::kernels {

class ThreadPool {
 public:
  // threads counts the caller: threads - 1 workers are started (at least 1 total).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Parallel regions run on the pool so far (calls that ran inline are not
  // counted) and the wall time spent in them: what a caller's elapsed time
  // minus this leaves is work only the calling thread did.
  struct Stats {
    uint64_t regions = 0;
    double seconds = 0;
  };
  Stats stats() const;

  // Runs fn(i) for every i in [0, n), each exactly once, and returns when all
  // are done. Tasks are handed out dynamically.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // held for the whole of one ParallelFor
  // Decode issues hundreds of short parallel-fors per token: workers and the
  // caller spin briefly on these atomics before sleeping on the condition
  // variables, so most hand-offs cost no system call.
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};  // workers blocked on cv_start_
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> pending_{0};  // tasks of the current call not yet finished
  // The call's door: its generation (bits 33 up), open (bit 32) and the
  // workers inside it (the low 32 bits). A worker enters only an open door
  // of the generation it woke for; the caller returns once every task is
  // done and it has closed the door with nobody inside. A worker the
  // machine has not scheduled yet is not waited for: it finds the door
  // closed when it runs (on a loaded machine, waiting for it cost a
  // scheduler time slice per call).
  std::atomic<uint64_t> door_{0};
  std::atomic<uint64_t> regions_{0};
  std::atomic<uint64_t> region_ns_{0};
};

// The process-wide pool the kernels use.
ThreadPool& DefaultThreadPool();
// Sizes the process-wide pool before its first use (MOESERVE_CPU_THREADS
// still wins when set). Returns false when the pool already exists with
// another size: the request then has no effect.
bool RequestDefaultThreadPoolSize(int threads);

}  // namespace moeserve::kernels
