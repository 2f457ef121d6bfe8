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

// Ready keys reach the queue on the delay thread; the fake clock's sleeper
// check says that thread has acted on the latest Advance.
void Settle(FakeQueueClock& clock) { ASSERT_TRUE(clock.WaitForSleeper()) << "the delay thread never went to sleep"; }

TEST(WorkQueue, AddAfterDelaysByTheClock) {
  auto clock = std::make_shared<FakeQueueClock>();
  WorkQueue q({}, clock);
  q.AddAfter("x", 30ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.Waiting(), 1u);
  clock->Advance(29ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 0u) << "ready 1 ms early";
  clock->Advance(1ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.Waiting(), 0u);
  EXPECT_EQ(*q.Get(), "x");
}

TEST(WorkQueue, AnEarlierAddAfterOvertakesALaterOne) {
  auto clock = std::make_shared<FakeQueueClock>();
  WorkQueue q({}, clock);
  q.AddAfter("late", 100ms);
  q.AddAfter("early", 10ms);
  clock->Advance(10ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(*q.Get(), "early");
  clock->Advance(90ms);
  Settle(*clock);
  EXPECT_EQ(*q.Get(), "late");
}

TEST(WorkQueue, AWaitingKeyWaitsOnceAtTheEarlierTime) {
  auto clock = std::make_shared<FakeQueueClock>();
  WorkQueue q({}, clock);
  q.AddAfter("k", 50ms);
  q.AddAfter("k", 20ms);   // earlier: moves the one entry forward
  q.AddAfter("k", 500ms);  // later: ignored
  EXPECT_EQ(q.Waiting(), 1u);
  clock->Advance(20ms);
  Settle(*clock);
  EXPECT_EQ(q.Waiting(), 0u);
  ASSERT_EQ(q.Len(), 1u);
  EXPECT_EQ(*q.Get(), "k");
  q.Done("k");
  // Nothing of the dropped entries is left to fire later.
  clock->Advance(1000ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.Waiting(), 0u);
}

TEST(WorkQueue, AKeyWaitsAgainAfterItsEntryFired) {
  auto clock = std::make_shared<FakeQueueClock>();
  WorkQueue q({}, clock);
  q.AddAfter("k", 10ms);
  clock->Advance(10ms);
  Settle(*clock);
  EXPECT_EQ(*q.Get(), "k");
  q.Done("k");
  q.AddAfter("k", 10ms);  // a fresh wait, not merged with the one that fired
  EXPECT_EQ(q.Waiting(), 1u);
  clock->Advance(10ms);
  Settle(*clock);
  EXPECT_EQ(*q.Get(), "k");
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
  auto clock = std::make_shared<FakeQueueClock>();
  BucketRateLimiter bucket(10, 100, clock);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(bucket.When(), std::chrono::nanoseconds(0)) << i;
  // The 101st waits 1/10 s, the 110th a second.
  EXPECT_EQ(bucket.When(), std::chrono::nanoseconds(100ms));
  for (int i = 0; i < 8; ++i) bucket.When();
  EXPECT_EQ(bucket.When(), std::chrono::nanoseconds(1000ms));
  // Time refills the bucket: 2 s later the debt of 10 is paid and 10 more are free.
  clock->Advance(2s);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bucket.When(), std::chrono::nanoseconds(0)) << i;
  EXPECT_EQ(bucket.When(), std::chrono::nanoseconds(100ms));
}

TEST(WorkQueue, AddRateLimitedUsesTheLargerOfBothLimiters) {
  auto clock = std::make_shared<FakeQueueClock>();
  WorkQueue q(RateLimiterOptions{.item_base = 20ms, .item_max = 1s, .qps = 10, .burst = 1}, clock);
  q.AddRateLimited("k");  // item 20 ms, bucket 0 (the burst of 1)
  clock->Advance(19ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 0u);
  clock->Advance(1ms);
  Settle(*clock);
  EXPECT_EQ(*q.Get(), "k");
  q.Done("k");
  EXPECT_EQ(q.NumRequeues("k"), 1);
  // Item 40 ms, bucket: 20 ms refilled 0.2 of a token, so the next waits 80 ms.
  q.AddRateLimited("k");
  clock->Advance(79ms);
  Settle(*clock);
  EXPECT_EQ(q.Len(), 0u) << "the bucket's wait was not applied";
  clock->Advance(1ms);
  Settle(*clock);
  EXPECT_EQ(*q.Get(), "k");
  q.Forget("k");
  EXPECT_EQ(q.NumRequeues("k"), 0);
}

}  // namespace
}  // namespace moeserve::op
