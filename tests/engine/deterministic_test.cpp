// EngineOptions::deterministic (ModelOptions::deterministic): a sequence's
// logits are the same bits whatever else shares its forward passes (1, 7, 8
// and 20 other sequences: the batch crosses the kernels' switch from
// matrix-vector products to the GEMM at 8 rows), however its prompt is split
// into prefill chunks, and after a prefix-cache hit. A control shows that
// without the option the same comparisons do differ, so these tests can fail.
#include <cstring>
#include <map>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int Argmax(const float* row, int V) {
  int best = 0;
  for (int v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

std::unique_ptr<Model> LoadModel(bool deterministic, ExpertFormat experts = ExpertFormat::kMxfp4) {
  auto d = OpenModelDir(TinyModel(1, 16, experts));  // sparse DSA selection past 16 tokens
  EXPECT_TRUE(d) << d.error().ToString();
  ModelOptions o;
  o.deterministic = deterministic;
  auto m = Model::Load(*d, o);
  EXPECT_TRUE(m) << m.error().ToString();
  return std::move(*m);
}

// The target's logits at its last prompt position, then at each of `decode`
// greedy steps. `others` sequences (prompts of 3 to 98 tokens) share every
// pass: prefilled together with the target's first piece, then decoding one
// greedy token per pass beside it. The target sits in the middle of the batch.
std::vector<float> TargetLogits(const Model& m, const std::vector<int>& prompt, const std::vector<int>& pieces,
                                int others, int decode) {
  const int V = m.config().vocab_size;
  KvPool pool(512, 16, m.cache_floats_per_token());
  SequenceCache target = m.NewSequence();
  std::vector<SequenceCache> other;
  std::vector<std::vector<int>> feed(static_cast<size_t>(others));
  for (int i = 0; i < others; ++i) {
    other.push_back(m.NewSequence());
    feed[static_cast<size_t>(i)] = TestPrompt(3 + 5 * i, 100 + static_cast<uint64_t>(i));
  }
  std::vector<int> order;  // segment order: other sequences' indices, -1 the target
  for (int i = 0; i < others; ++i) order.push_back(i);
  order.insert(order.begin() + others / 2, -1);
  std::vector<int> target_feed;
  std::vector<float> out, logits;
  size_t at = 0;
  const int passes = static_cast<int>(pieces.size()) + decode;
  for (int p = 0; p < passes; ++p) {
    if (p < static_cast<int>(pieces.size())) {
      target_feed.assign(prompt.begin() + static_cast<std::ptrdiff_t>(at),
                         prompt.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(pieces[p])));
      at += static_cast<size_t>(pieces[p]);
    }
    std::vector<ForwardSegment> segs;
    for (const int i : order) {
      SequenceCache* cache = i < 0 ? &target : &other[static_cast<size_t>(i)];
      const std::vector<int>& tokens = i < 0 ? target_feed : feed[static_cast<size_t>(i)];
      if (!EnsureBlocks(pool, *cache, cache->length + static_cast<int64_t>(tokens.size()))) {
        ADD_FAILURE() << "pool too small";
        return {};
      }
      segs.push_back({cache, std::span<const int>(tokens), false});
    }
    auto st = m.Forward(pool, segs, &logits);
    if (!st) {
      ADD_FAILURE() << st.error().ToString();
      return {};
    }
    for (size_t s = 0; s < order.size(); ++s) {
      const float* row = &logits[s * static_cast<size_t>(V)];
      if (order[s] >= 0) {
        feed[static_cast<size_t>(order[s])].assign(1, Argmax(row, V));
        continue;
      }
      if (p >= static_cast<int>(pieces.size()) - 1) out.insert(out.end(), row, row + V);
      target_feed.assign(1, Argmax(row, V));
    }
  }
  return out;
}

constexpr int kPrompt = 40, kDecode = 6;

TEST(DeterministicModel, LogitsDoNotDependOnTheBatchOrTheChunks) {
  auto m = LoadModel(true);
  const auto prompt = TestPrompt(kPrompt, 9);
  const auto alone = TargetLogits(*m, prompt, {kPrompt}, 0, kDecode);
  ASSERT_EQ(alone.size(), static_cast<size_t>(kDecode + 1) * m->config().vocab_size);
  for (int others : {1, 7, 8, 20})
    EXPECT_TRUE(SameBits(TargetLogits(*m, prompt, {kPrompt}, others, kDecode), alone)) << others << " others";
  EXPECT_TRUE(SameBits(TargetLogits(*m, prompt, {5, 11, 1, 23}, 0, kDecode), alone)) << "chunked prompt";
  EXPECT_TRUE(SameBits(TargetLogits(*m, prompt, {17, 23}, 8, kDecode), alone)) << "chunked prompt, 8 others";
  EXPECT_TRUE(SameBits(TargetLogits(*m, prompt, {1, 1, 38}, 20, kDecode), alone)) << "chunked prompt, 20 others";
}

// BF16 experts take the BF16 matrix-vector kernels instead of the MXFP4 ones.
TEST(DeterministicModel, Bf16ExpertsToo) {
  auto m = LoadModel(true, ExpertFormat::kBf16);
  const auto prompt = TestPrompt(kPrompt, 9);
  const auto alone = TargetLogits(*m, prompt, {kPrompt}, 0, kDecode);
  ASSERT_FALSE(alone.empty());
  EXPECT_TRUE(SameBits(TargetLogits(*m, prompt, {kPrompt}, 8, kDecode), alone)) << "8 others";
  EXPECT_TRUE(SameBits(TargetLogits(*m, prompt, {1, 1, 38}, 20, kDecode), alone)) << "chunked prompt, 20 others";
}

// The control: without the option, the batch and the chunks change the last
// bits (the GEMM from 8 rows, the chunked DeltaNet form for several tokens).
TEST(DeterministicModel, WithoutTheOptionTheSameComparisonsDiffer) {
  auto m = LoadModel(false);
  const auto prompt = TestPrompt(kPrompt, 9);
  const auto alone = TargetLogits(*m, prompt, {kPrompt}, 0, kDecode);
  EXPECT_FALSE(SameBits(TargetLogits(*m, prompt, {kPrompt}, 20, kDecode), alone)) << "20 others";
  EXPECT_FALSE(SameBits(TargetLogits(*m, prompt, {5, 11, 1, 23}, 0, kDecode), alone)) << "chunked prompt";
}

// Through the engine: greedy tokens and their log-probabilities (the
// sampled token's and the 20 most likely, from the full logits).
struct Trace {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  SequenceUsage usage;
};

GenerationRequest Target() {
  GenerationRequest r;
  r.prompt = TestPrompt(70, 9);
  r.max_tokens = 10;
  r.sampling.temperature = 0.0f;
  r.logprobs = 20;
  return r;
}

std::map<SequenceId, Trace> Drain(Engine& e) {
  std::map<SequenceId, Trace> out;
  for (int guard = 0; e.HasWork() && guard < 100000; ++guard)
    for (const TokenEvent& ev : e.Step()) {
      Trace& t = out[ev.id];
      if (ev.token >= 0) t.tokens.push_back(ev.token);
      if (ev.logprob) t.logprobs.push_back(*ev.logprob);
      for (const TokenLogprob& l : ev.top_logprobs) t.logprobs.push_back(l.logprob);
      if (ev.finish != FinishReason::kNone) t.usage = ev.usage;
    }
  return out;
}

std::unique_ptr<Engine> MakeEngine(int chunk, bool deterministic = true) {
  auto d = OpenModelDir(TinyModel(1, 16));
  EXPECT_TRUE(d);
  EngineOptions o;
  o.deterministic = deterministic;
  o.prefill_chunk_tokens = chunk;
  o.cache_tokens = 1 << 13;
  auto e = Engine::Create(*d, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return std::move(*e);
}

Trace RunWith(int others, int chunk, bool deterministic = true) {
  auto e = MakeEngine(chunk, deterministic);
  std::vector<SequenceId> ids;
  for (int i = 0; i < others; ++i) {
    GenerationRequest r;
    r.prompt = TestPrompt(4 + 7 * i, 200 + static_cast<uint64_t>(i));
    r.max_tokens = 6 + i % 9;
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.sampling.seed = static_cast<uint64_t>(i);
    if (i == others / 2) ids.push_back(*e->Submit(Target()));
    ids.push_back(*e->Submit(r));
  }
  if (others == 0) ids.push_back(*e->Submit(Target()));
  const SequenceId target = ids[static_cast<size_t>(others / 2)];
  return Drain(*e)[target];
}

TEST(DeterministicEngine, SameTokensAndLogprobsInAnyBatchChunkingAndAfterAPrefixHit) {
  const Trace alone = RunWith(0, 512);
  ASSERT_FALSE(alone.tokens.empty());
  ASSERT_EQ(alone.logprobs.size(), alone.tokens.size() * 21);
  for (int others : {1, 7, 8, 20}) {
    const Trace t = RunWith(others, 512);
    EXPECT_EQ(t.tokens, alone.tokens) << others << " others";
    EXPECT_TRUE(SameBits(t.logprobs, alone.logprobs)) << others << " others";
  }
  // A prompt budget of 16 tokens a step: the target's 70 arrive in 5 chunks
  // (with 20 others, in pieces of whatever the others leave).
  for (int others : {0, 20}) {
    const Trace t = RunWith(others, 16);
    EXPECT_EQ(t.tokens, alone.tokens) << "chunks of 16, " << others << " others";
    EXPECT_TRUE(SameBits(t.logprobs, alone.logprobs)) << "chunks of 16, " << others << " others";
  }
  // A prefix-cache hit: an earlier request with the same first 48 tokens.
  auto e = MakeEngine(512);
  GenerationRequest warm = Target();
  warm.prompt.resize(48);
  warm.prompt.push_back(Target().prompt[48] == 40 ? 41 : 40);
  ASSERT_TRUE(e->Submit(warm));
  Drain(*e);
  const SequenceId id = *e->Submit(Target());
  const Trace hit = Drain(*e)[id];
  EXPECT_GT(hit.usage.cached_tokens, 0);
  EXPECT_EQ(hit.tokens, alone.tokens);
  EXPECT_TRUE(SameBits(hit.logprobs, alone.logprobs)) << "prefix-cache hit";
}

// The control: without the option the batch changes the log-probabilities'
// last bits (the greedy tokens usually survive).
TEST(DeterministicEngine, WithoutTheOptionTheBatchChangesTheLogprobs) {
  const Trace alone = RunWith(0, 512, false);
  const Trace batched = RunWith(20, 512, false);
  ASSERT_FALSE(alone.logprobs.empty());
  EXPECT_FALSE(SameBits(batched.logprobs, alone.logprobs));
}

TEST(DeterministicEngine, RefusedWithExpertParallelism) {
  auto d = OpenModelDir(TinyModel(1, 16));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.deterministic = true;
  o.ep_world = 2;
  auto e = Engine::Create(*d, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().ToString().find("deterministic"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::engine
