// The work queue's client-go guarantees and the default controller rate limiter.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "moeserve/operator/work_queue.hpp"

namespace moeserve::op {
namespace {

using namespace std::chrono_literals;

TEST(WorkQueue, DeduplicatesQueuedKeys) {
  WorkQueue q;
  q.Add("a");
  q.Add("a");
  q.Add("b");
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(*q.Get(), "a");
  EXPECT_EQ(*q.Get(), "b");
}

TEST(WorkQueue, NeverHandsOneKeyToTwoWorkersAtOnce) {
  WorkQueue q;
  q.Add("a");
  auto first = q.Get();
  ASSERT_TRUE(first);
  q.Add("a");  // while processing: held back until Done
  EXPECT_EQ(q.Len(), 0u);
  q.Done("a");
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(*q.Get(), "a");
  q.Done("a");

  // Many workers, a few keys added over and over: no key is ever processed twice concurrently.
  std::atomic<int> in_flight[4] = {0, 0, 0, 0};
  std::atomic<bool> overlap{false};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 6; ++w)
    workers.emplace_back([&] {
      while (auto key = q.Get()) {
        int k = (*key)[0] - 'a';
        if (in_flight[k]++ > 0) overlap = true;
        std::this_thread::sleep_for(100us);
        in_flight[k]--;
        processed++;
        q.Done(*key);
      }
    });
  for (int i = 0; i < 2000; ++i) q.Add(std::string(1, static_cast<char>('a' + i % 4)));
  std::this_thread::sleep_for(50ms);
  q.ShutDown();
  for (auto& t : workers) t.join();
  EXPECT_FALSE(overlap);
  EXPECT_GE(processed.load(), 4);  // adds collapse while a key waits: 4 is enough
}

TEST(WorkQueue, AddAfterDelays) {
  WorkQueue q;
  auto start = Clock::now();
  q.AddAfter("x", 30ms);
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(*q.Get(), "x");
  EXPECT_GE(Clock::now() - start, 30ms);
}

TEST(RateLimiter, PerItemExponentialFrom5msTo1000s) {
  ItemExponentialRateLimiter limiter(5ms, 1000s);
  EXPECT_EQ(limiter.When("k"), std::chrono::nanoseconds(5ms));
  EXPECT_EQ(limiter.When("k"), std::chrono::nanoseconds(10ms));
  EXPECT_EQ(limiter.When("k"), std::chrono::nanoseconds(20ms));
  EXPECT_EQ(limiter.When("other"), std::chrono::nanoseconds(5ms));
  for (int i = 0; i < 100; ++i) limiter.When("k");
  EXPECT_EQ(limiter.When("k"), std::chrono::nanoseconds(1000s));
  EXPECT_EQ(limiter.NumRequeues("k"), 104);
  limiter.Forget("k");
  EXPECT_EQ(limiter.When("k"), std::chrono::nanoseconds(5ms));
}

TEST(RateLimiter, BucketTenPerSecondBurstHundred) {
  BucketRateLimiter bucket(10, 100);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(bucket.When(), std::chrono::nanoseconds(0)) << i;
  // The 101st waits about 1/10 s, the 110th about a second.
  auto d101 = bucket.When();
  EXPECT_GT(d101, 50ms);  // less only if the test itself was descheduled for long
  EXPECT_LT(d101, 110ms);
  for (int i = 0; i < 8; ++i) bucket.When();
  auto d110 = bucket.When();
  EXPECT_GT(d110, 500ms);
  EXPECT_LT(d110, 1100ms);
}

TEST(WorkQueue, AddRateLimitedUsesTheLargerOfBothLimiters) {
  WorkQueue q(RateLimiterOptions{.item_base = 20ms, .item_max = 1s, .qps = 10, .burst = 100});
  auto start = Clock::now();
  q.AddRateLimited("k");
  EXPECT_EQ(*q.Get(), "k");
  EXPECT_GE(Clock::now() - start, 20ms);
  EXPECT_EQ(q.NumRequeues("k"), 1);
  q.Forget("k");
  EXPECT_EQ(q.NumRequeues("k"), 0);
}

}  // namespace
}  // namespace moeserve::op
