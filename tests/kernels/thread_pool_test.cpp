// The process-wide kernel pool: sized once; a later request for another size
// is reported as ignored, never silently taken.
#include "moeserve/kernels/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace moeserve::kernels
