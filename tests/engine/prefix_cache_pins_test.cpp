// Pinned prefixes (Engine::PinPrefix, what a server-kept session holds between
// turns): a pinned prefix outlives byte-bound evictions that take unpinned
// ones, only within its share of the bound, and gives way when the KV pool
// needs its blocks for a new request.
#include <map>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

GenerationRequest Greedy(std::vector<int> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// Runs one request to its end; its cached prompt tokens, or -1.
int CachedTokens(Engine& e, GenerationRequest r) {
  auto id = e.Submit(std::move(r));
  if (!id) return -1;
  int cached = -1;
  for (int guard = 0; e.HasWork() && guard < 10000; ++guard)
    for (const auto& ev : e.Step())
      if (ev.id == *id && ev.finish != FinishReason::kNone) cached = ev.usage.cached_tokens;
  return cached;
}

std::vector<int> Next(std::vector<int> prompt) {
  prompt.push_back(65);
  return prompt;
}

// One entry's bytes (a 32-token snapshot of a 40-token prompt).
int64_t OneEntry(const ModelDir& d, EngineOptions o) {
  auto e = Engine::Create(d, o);
  EXPECT_TRUE(e);
  CachedTokens(**e, Greedy(TestPrompt(40, 1), 1));
  return (*e)->Metrics().prefix_cache.bytes;
}

class PrefixPins : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = OpenModelDir(TinyModel(1));
    ASSERT_TRUE(d);
    dir_ = std::make_unique<ModelDir>(std::move(*d));
    o_.cache_tokens = 4096;
    one_ = OneEntry(*dir_, o_);
    ASSERT_GT(one_, 0);
    o_.prefix_cache_bytes = 4 * one_ + one_ / 2;  // four entries
  }
  // Puts the session's prompt in the cache, pins it if asked, then runs
  // `others` distinct prompts through; the cached tokens of its next turn.
  int NextTurnCached(Engine& e, bool pin, int others) {
    const auto session = TestPrompt(40, 7);
    if (pin) e.PinPrefix(42, session, 60);
    EXPECT_EQ(CachedTokens(e, Greedy(session, 1)), 0);
    for (int i = 0; i < others; ++i) CachedTokens(e, Greedy(TestPrompt(40, 200 + i), 1));
    return CachedTokens(e, Greedy(Next(session), 1));
  }
  std::unique_ptr<ModelDir> dir_;
  EngineOptions o_;
  int64_t one_ = 0;
};

TEST_F(PrefixPins, APinnedPrefixOutlivesEvictionsThatTakeUnpinnedOnes) {
  auto unpinned = Engine::Create(*dir_, o_);
  ASSERT_TRUE(unpinned);
  EXPECT_EQ(NextTurnCached(**unpinned, /*pin=*/false, 10), 0) << "ten other prompts evict an unpinned prefix";
  auto pinned = Engine::Create(*dir_, o_);
  ASSERT_TRUE(pinned);
  EXPECT_EQ(NextTurnCached(**pinned, /*pin=*/true, 10), 32) << "the pinned prefix stays";
  const auto s = (*pinned)->Metrics().prefix_cache;
  EXPECT_GE(s.pinned_entries, 1);
  EXPECT_LE(s.bytes, o_.prefix_cache_bytes) << "pins never lift the bound";
  // Unpinned (seconds 0): it is evictable again.
  (*pinned)->PinPrefix(42, {}, 0);
  for (int i = 0; i < 10; ++i) CachedTokens(**pinned, Greedy(TestPrompt(40, 400 + i), 1));
  EXPECT_EQ(CachedTokens(**pinned, Greedy(Next(Next(TestPrompt(40, 7))), 1)), 0);
}

TEST_F(PrefixPins, PinsHoldOnlyTheirShareOfTheBound) {
  o_.prefix_pin_share = 0.1;  // less than one entry: a pin protects nothing
  auto e = Engine::Create(*dir_, o_);
  ASSERT_TRUE(e);
  EXPECT_EQ(NextTurnCached(**e, /*pin=*/true, 10), 0);
}

TEST_F(PrefixPins, PinsGiveWayWhenTheKvPoolNeedsTheirBlocks) {
  o_.cache_tokens = 128;  // 8 blocks
  o_.prefix_cache_bytes = 1 << 30;
  auto e = Engine::Create(*dir_, o_);
  ASSERT_TRUE(e);
  const auto session = TestPrompt(40, 7);
  (*e)->PinPrefix(42, session, 60);
  EXPECT_EQ(CachedTokens(**e, Greedy(session, 1)), 0);
  EXPECT_GE((*e)->Metrics().prefix_cache.pinned_entries, 1);
  // A request that needs every block of the pool still runs.
  EXPECT_EQ(CachedTokens(**e, Greedy(TestPrompt(100, 9), 28)), 0);
  EXPECT_EQ((*e)->Metrics().prefix_cache.evicted_for_pool, 1u);
}

}  // namespace
}  // namespace moeserve::engine
