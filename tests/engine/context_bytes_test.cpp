// What a context costs (context_bytes.hpp) against a hand count for the tiny
// preset, and the refusal at Submit of a request the pool cannot hold even
// when empty: an error that names the limit in tokens and bytes and the
// setting that raises it, never a sequence left waiting.
#include "moeserve/engine/context_bytes.hpp"

#include <gtest/gtest.h>

#include "moeserve/engine/engine.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

// The tiny preset (model.md 2): layers mla, mla, delta, dsa, delta, dsa.
// mla/dsa rows: kv_lora_rank 64 + qk_rope_head_dim 16; dsa adds the indexer
// key, index_head_dim 32. DeltaNet: 4 heads, head_k_dim 32, head_v_dim 64,
// conv_size 4.
constexpr int64_t kRowFloats = 2 * (64 + 16) + 2 * (64 + 16 + 32);  // 384
constexpr int64_t kChannels = 2 * 4 * 32 + 4 * 64;                   // q, k, v channels: 512
constexpr int64_t kDeltaFloats = 2 * ((4 - 1) * kChannels + 4 * 32 * 64);  // two layers' conv tails and S

std::unique_ptr<Engine> Make(EngineOptions o) {
  auto d = OpenModelDir(TinyModel(1));
  EXPECT_TRUE(d);
  if (!d) return nullptr;
  auto e = Engine::Create(*d, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

TEST(ContextBytes, MatchesAHandCountForMlaDsaAndDeltaLayers) {
  auto e = Make(EngineOptions{});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->family_model().cache_floats_per_token(), static_cast<size_t>(kRowFloats));
  const ContextBytes c = ContextCost(e->family_model(), 16, 100);
  EXPECT_EQ(c.tokens, 100);
  EXPECT_EQ(c.blocks, 7);  // whole blocks: 100 tokens take 7 of 16
  EXPECT_EQ(c.pool_bytes, 7 * 16 * kRowFloats * 4);
  EXPECT_EQ(c.state_bytes, kDeltaFloats * 4);
  EXPECT_EQ(c.total(), 7 * 16 * kRowFloats * 4 + kDeltaFloats * 4);
  // The state does not grow with the context; the rows do, by whole blocks.
  const ContextBytes longer = ContextCost(e->family_model(), 16, 1000);
  EXPECT_EQ(longer.state_bytes, c.state_bytes);
  EXPECT_EQ(longer.pool_bytes, 63 * 16 * kRowFloats * 4);
}

TEST(ContextBytes, PoolTokensForABudgetSetsTheStateAside) {
  // 64 sequences' state, then 62 blocks and change.
  const int64_t budget = 64 * kDeltaFloats * 4 + 62 * 16 * kRowFloats * 4 + 1000;
  EXPECT_EQ(PoolTokensFor(budget, kRowFloats, 16, kDeltaFloats * 4, 64), 62 * 16);
  EXPECT_EQ(PoolTokensFor(0, kRowFloats, 16, kDeltaFloats * 4, 64), 16);  // never below one block
}

TEST(ContextBytes, EngineSizesItsPoolFromAMemoryBudget) {
  EngineOptions o;
  o.cache_tokens = 0;
  o.max_running = 64;
  o.cache_memory_bytes = 64 * kDeltaFloats * 4 + 62 * 16 * kRowFloats * 4 + 1000;
  auto e = Make(o);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->max_context(), 62 * 16);  // the pool bounds the context window (the model has 1M positions)
}

TEST(ContextBytes, ZeroCacheTokensWithoutABudgetIsRefused) {
  EngineOptions o;
  o.cache_tokens = 0;
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  auto e = Engine::Create(*d, o);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), ErrorCode::kInvalidArgument);
}

TEST(ContextRefusal, APromptThePoolCannotHoldIsRefusedAtSubmitNamingTheLimit) {
  EngineOptions o;
  o.cache_tokens = 256;
  auto e = Make(o);
  ASSERT_TRUE(e);
  GenerationRequest r;
  r.prompt = TestPrompt(200, 3);
  r.max_tokens = 100;
  r.sampling.temperature = 0;
  auto id = e->Submit(r);
  ASSERT_FALSE(id);
  EXPECT_EQ(id.error().code(), ErrorCode::kOutOfRange);
  const std::string m = id.error().message();
  EXPECT_NE(m.find("300 tokens together"), std::string::npos) << m;
  EXPECT_NE(m.find("holds 256 tokens (384.0 KiB)"), std::string::npos) << m;  // 256 * 1536 bytes
  EXPECT_NE(m.find("1536 bytes per token"), std::string::npos) << m;
  EXPECT_NE(m.find("cache_tokens"), std::string::npos) << m;
  EXPECT_FALSE(e->HasWork());  // nothing waits

  // What fits the empty pool exactly is served.
  r.max_tokens = 56;
  auto ok = e->Submit(r);
  ASSERT_TRUE(ok) << ok.error().ToString();
  int finished = 0;
  for (int guard = 0; e->HasWork() && guard < 1000; ++guard)
    for (const TokenEvent& ev : e->Step())
      if (ev.finish != FinishReason::kNone) {
        ++finished;
        EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
      }
  EXPECT_EQ(finished, 1);
}

TEST(ContextRefusal, MaxContextBelowThePoolNamesMaxContext) {
  EngineOptions o;
  o.cache_tokens = 4096;
  o.max_context = 128;
  auto e = Make(o);
  ASSERT_TRUE(e);
  GenerationRequest r;
  r.prompt = TestPrompt(100, 3);
  r.max_tokens = 100;
  auto id = e->Submit(r);
  ASSERT_FALSE(id);
  EXPECT_EQ(id.error().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(id.error().message().find("max_context"), std::string::npos) << id.error().message();
  EXPECT_EQ(id.error().message().find("cache_tokens"), std::string::npos) << id.error().message();
}

}  // namespace
}  // namespace moeserve::engine
