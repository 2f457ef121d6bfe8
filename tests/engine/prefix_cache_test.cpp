// The prefix cache's byte bound: it holds under many distinct prompts (each
// entry keeps a DeltaNet state copy, which once grew the heap without limit),
// and the bytes it counts are the bytes really held, in the KV pool (blocks
// in use) and on the heap (malloc's own totals).
#include "../../engine/prefix_cache.hpp"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model.hpp"
#include "test_models.hpp"
#include "../support/sanitized_build.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

// Bytes malloc has handed out (small chunks and mmapped large ones).
int64_t HeapInUse() {
  struct mallinfo2 mi = ::mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

GenerationRequest Greedy(std::vector<int> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

void DrainChecking(Engine& e, const std::function<void(const EngineMetrics&)>& check) {
  for (int guard = 0; e.HasWork() && guard < 100000; ++guard) {
    e.Step();
    check(e.Metrics());
  }
}

std::unique_ptr<Engine> Make(const ModelDir& dir, EngineOptions o) {
  auto e = Engine::Create(dir, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

int64_t UsedPoolBlocks(const EngineMetrics& m, const EngineOptions& o) {
  const double blocks = static_cast<double>(o.cache_tokens / o.block_tokens);
  return static_cast<int64_t>(std::llround(m.cache_usage_ratio * blocks));
}

TEST(PrefixCacheBound, ManyDistinctPromptsStayWithinTheBound) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.cache_tokens = 4096;

  // One entry's size, as counted, from a cache with room to spare.
  int64_t one = 0, block_bytes = 0;
  {
    auto e = Make(*d, o);
    ASSERT_TRUE(e);
    ASSERT_TRUE(e->Submit(Greedy(TestPrompt(40, 1), 1)));
    DrainChecking(*e, [](const EngineMetrics&) {});
    const PrefixCacheStats s = e->Metrics().prefix_cache;
    ASSERT_EQ(s.entries, 1);  // the 32-token snapshot of a 40-token prompt
    one = s.bytes;
    block_bytes = s.kv_bytes / 2;
    std::printf("one entry of 32 tokens: %lld bytes (KV %lld, state and bookkeeping %lld)\n",
                static_cast<long long>(s.bytes), static_cast<long long>(s.kv_bytes), static_cast<long long>(s.state_bytes));
  }
  o.prefix_cache_bytes = 4 * one + one / 2;  // room for four entries, not five
  auto e = Make(*d, o);
  ASSERT_TRUE(e);
  const int kPrompts = 60;
  int64_t worst = 0;
  int64_t heap_after_warmup = 0;
  for (int i = 0; i < kPrompts; ++i) {
    ASSERT_TRUE(e->Submit(Greedy(TestPrompt(40, 100 + i), 1)));
    DrainChecking(*e, [&](const EngineMetrics& m) {
      worst = std::max(worst, m.prefix_cache.bytes);
      ASSERT_LE(m.prefix_cache.bytes, o.prefix_cache_bytes);
    });
    if (i == 9) heap_after_warmup = HeapInUse();
  }
  const int64_t heap_growth = HeapInUse() - heap_after_warmup;
  const EngineMetrics m = e->Metrics();
  std::printf("%d distinct prompts: %lld entries, %lld bytes held (worst %lld, bound %lld), %llu evicted; heap +%lld bytes over the last %d\n",
              kPrompts, static_cast<long long>(m.prefix_cache.entries), static_cast<long long>(m.prefix_cache.bytes),
              static_cast<long long>(worst), static_cast<long long>(o.prefix_cache_bytes),
              static_cast<unsigned long long>(m.prefix_cache.evicted_for_bytes), static_cast<long long>(heap_growth), kPrompts - 10);
  EXPECT_EQ(m.prefix_cache.entries, 4);
  EXPECT_EQ(m.prefix_cache.evicted_for_bytes, static_cast<uint64_t>(kPrompts - 4));
  EXPECT_EQ(m.prefix_cache.limit_bytes, o.prefix_cache_bytes);
  // Independent of the cache's own count: the heap did not grow with the
  // prompts (50 more state copies would be 50 entries' worth) ...
  EXPECT_LT(heap_growth, one) << "the heap grows with every distinct prompt";
  // ... and the pool holds exactly the cache's blocks once nothing runs.
  EXPECT_EQ(UsedPoolBlocks(m, o), 4 * 2);  // four entries of two distinct blocks
  EXPECT_EQ(UsedPoolBlocks(m, o) * block_bytes, m.prefix_cache.kv_bytes);

  // Still a cache, and a least recently used one: the newest prompt's next
  // turn reuses its prefix, the oldest's does not.
  auto newest = TestPrompt(40, 100 + kPrompts - 1);
  newest.push_back(65);
  auto oldest = TestPrompt(40, 100);
  oldest.push_back(65);
  auto a = e->Submit(Greedy(newest, 1));
  auto b = e->Submit(Greedy(oldest, 1));
  ASSERT_TRUE(a && b);
  std::map<SequenceId, int> cached;
  for (int guard = 0; e->HasWork() && guard < 1000; ++guard)
    for (const auto& ev : e->Step())
      if (ev.finish != FinishReason::kNone) cached[ev.id] = ev.usage.cached_tokens;
  EXPECT_EQ(cached[*a], 32);
  EXPECT_EQ(cached[*b], 0);
}

TEST(PrefixCacheBound, ZeroCachesNothing) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.cache_tokens = 1024;
  o.prefix_cache_bytes = 0;
  auto e = Make(*d, o);
  ASSERT_TRUE(e);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(e->Submit(Greedy(TestPrompt(40, 7), 1)));
    DrainChecking(*e, [](const EngineMetrics&) {});
  }
  const PrefixCacheStats s = e->Metrics().prefix_cache;
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(s.too_large, 2u);
  EXPECT_EQ(e->Metrics().prefix_hit_tokens, 0u);
  EXPECT_EQ(UsedPoolBlocks(e->Metrics(), o), 0);
}

TEST(PrefixCacheAccounting, CountedBytesAreTheBytesHeld) {
  if (test_support::kSanitizedBuild) GTEST_SKIP() << "compares with malloc's accounting, which the sanitizer's allocator replaces";
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  auto model = Model::Load(*d);
  ASSERT_TRUE(model) << model.error().ToString();
  const int bt = 16;
  KvPool pool(256, bt, (*model)->cache_floats_per_token());
  const int64_t block_bytes = static_cast<int64_t>(bt * pool.floats_per_token() * sizeof(float));
  PrefixCache cache(int64_t{1} << 40);

  // Sequences with their state and blocks, as the engine holds them: the
  // cache copies the state and references the blocks.
  const int kSequences = 12;
  std::vector<SequenceCache> seqs;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < kSequences; ++i) {
    seqs.push_back((*model)->NewSequence());
    prompts.push_back(TestPrompt(96, 200 + i));
    ASSERT_TRUE(EnsureBlocks(pool, seqs.back(), 96));
  }
  const int64_t pool_used_by_sequences = pool.num_blocks() - pool.free_blocks();
  const int64_t heap_before = HeapInUse();
  for (int i = 0; i < kSequences; ++i) {
    // Two snapshots of each prompt (32 and 64 tokens) share their first two blocks.
    cache.Insert(pool, prompts[i], 32, seqs[i]);
    cache.Insert(pool, prompts[i], 64, seqs[i]);
  }
  const int64_t heap_held = HeapInUse() - heap_before;
  ASSERT_EQ(cache.size(), static_cast<size_t>(2 * kSequences));
  std::printf("%zu entries: counted %lld heap bytes, malloc says %lld; KV %lld bytes (%lld blocks)\n", cache.size(),
              static_cast<long long>(cache.state_bytes()), static_cast<long long>(heap_held),
              static_cast<long long>(cache.kv_bytes()), static_cast<long long>(cache.kv_bytes() / block_bytes));
  // Heap: within 2 % (and a page) of what malloc reports.
  EXPECT_NEAR(static_cast<double>(cache.state_bytes()), static_cast<double>(heap_held), 0.02 * heap_held + 4096);
  // KV: each shared block once, 4 per prompt (blocks 0-3 cover 64 tokens).
  EXPECT_EQ(cache.kv_bytes(), 4 * kSequences * block_bytes);

  // Once the sequences let go, the pool holds exactly the cache's blocks.
  for (auto& s : seqs) ReleaseBlocks(pool, s);
  EXPECT_EQ((pool.num_blocks() - pool.free_blocks()) * block_bytes, cache.kv_bytes());
  EXPECT_GT(pool_used_by_sequences, 0);

  // Evicting gives back what was counted, on the heap and in the pool.
  const int64_t heap_full = HeapInUse();
  const int64_t counted_full = cache.state_bytes();
  for (int i = 0; i < kSequences; ++i) ASSERT_TRUE(cache.EvictOne(pool));
  EXPECT_NEAR(static_cast<double>(counted_full - cache.state_bytes()), static_cast<double>(heap_full - HeapInUse()),
              0.02 * (heap_full - HeapInUse()) + 4096);
  EXPECT_EQ((pool.num_blocks() - pool.free_blocks()) * block_bytes, cache.kv_bytes());
  cache.Clear(pool);
  EXPECT_EQ(cache.kv_bytes(), 0);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
  EXPECT_EQ(cache.Stats().evicted_for_pool, static_cast<uint64_t>(kSequences));
}

}  // namespace
}  // namespace moeserve::engine
