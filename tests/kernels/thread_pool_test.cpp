// The process-wide kernel pool: sized once; a later request for another size
// is reported as ignored, never silently taken.
#include "moeserve/kernels/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace moeserve::kernels {
namespace {

TEST(DefaultThreadPool, SizeIsFixedAtFirstUse) {
  EXPECT_TRUE(RequestDefaultThreadPoolSize(0));  // 0: no preference
  ThreadPool& pool = DefaultThreadPool();
  const int size = pool.size();
  EXPECT_GE(size, 1);
  EXPECT_TRUE(RequestDefaultThreadPoolSize(size));
  EXPECT_FALSE(RequestDefaultThreadPoolSize(size + 3));
  EXPECT_EQ(DefaultThreadPool().size(), size);
  std::atomic<int> ran{0};
  pool.ParallelFor(1000, [&](size_t) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 1000);
}

TEST(DefaultThreadPool, ManyShortParallelForsComplete) {
  // Decode issues hundreds of short parallel-fors per token; the spin-then-
  // sleep hand-off must never lose a wake-up.
  ThreadPool pool(3);
  std::atomic<long> sum{0};
  for (int round = 0; round < 2000; ++round) {
    pool.ParallelFor(static_cast<size_t>(1 + round % 7), [&](size_t i) { sum.fetch_add(static_cast<long>(i) + 1); });
    if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let workers fall asleep
  }
  long want = 0;
  for (int round = 0; round < 2000; ++round) {
    int n = 1 + round % 7;
    want += n * (n + 1) / 2;
  }
  EXPECT_EQ(sum.load(), want);
}

TEST(DefaultThreadPool, EveryIndexRunsExactlyOnceWhileWorkersArePreempted) {
  // More threads than cores, and spinning threads beside them, so that
  // workers are often descheduled between or inside calls: a call may
  // finish without a worker that wakes late, which must then run nothing of
  // it (its function is gone) and take part in a later call instead.
  ThreadPool pool(6);
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < 2; ++i)
    spinners.emplace_back([&] {
      while (!stop.load()) std::this_thread::yield();
    });
  long wrong = 0;
  for (int round = 0; round < 3000; ++round) {
    const size_t n = 1 + static_cast<size_t>(round % 37);
    std::vector<std::atomic<int>> ran(n);
    pool.ParallelFor(n, [&](size_t i) {
      ran[i].fetch_add(1);
      if (i % 5 == 0) std::this_thread::yield();
    });
    for (size_t i = 0; i < n; ++i) wrong += ran[i].load() != 1;
  }
  stop.store(true);
  for (auto& t : spinners) t.join();
  EXPECT_EQ(wrong, 0) << "indices run other than exactly once";
}

}  // namespace
}  // namespace moeserve::kernels
