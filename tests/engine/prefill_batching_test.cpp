// Several sequences' prompts share one forward pass: with nothing decoding,
// an engine step gives the waiting prompts, in order, rows up to
// prefill_chunk_tokens_idle in all, one segment each (engine.cpp Advance).
// The real tiny model runs the passes; a wrapper records each pass's
// segments so the layout is checked, not inferred from timings.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/model.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

// The family's model, unchanged, with the token count of every segment of
// every Forward call written down.
class SegmentRecorder final : public FamilyModel {
 public:
  SegmentRecorder(std::unique_ptr<FamilyModel> inner, std::vector<std::vector<int>>* passes)
      : inner_(std::move(inner)), passes_(passes) {}
  int vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_position() const override { return inner_->max_position(); }
  size_t cache_floats_per_token() const override { return inner_->cache_floats_per_token(); }
  SequenceCache NewSequence() const override { return inner_->NewSequence(); }
  Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits, ForwardTrace* trace,
                 std::vector<std::vector<uint64_t>>* expert_tokens) const override {
    std::vector<int> sizes;
    for (const ForwardSegment& s : segments) sizes.push_back(static_cast<int>(s.tokens.size()));
    passes_->push_back(std::move(sizes));
    return inner_->Forward(pool, segments, logits, trace, expert_tokens);
  }
  std::vector<int> ExpertCounts() const override { return inner_->ExpertCounts(); }
  int idle_prefill_rows() const override { return inner_->idle_prefill_rows(); }
  void Retire(const SequenceCache& cache) const override { inner_->Retire(cache); }

 private:
  std::unique_ptr<FamilyModel> inner_;
  std::vector<std::vector<int>>* passes_;
};

std::unique_ptr<Engine> RecordingEngine(const std::string& dir, const EngineOptions& o,
                                        std::vector<std::vector<int>>* passes) {
  auto family = FindFamily(dir);
  EXPECT_TRUE(family) << family.error().ToString();
  auto parts = (*family)->load(dir, ModelOptions{});
  EXPECT_TRUE(parts) << parts.error().ToString();
  parts->model = std::make_unique<SegmentRecorder>(std::move(parts->model), passes);
  auto e = Engine::Create(std::move(*parts), o);
  EXPECT_TRUE(e) << e.error().ToString();
  return std::move(*e);
}

GenerationRequest Greedy(std::vector<int> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.stop_tokens = {-1};  // every sequence runs to max_tokens
  return r;
}

EngineOptions Options() {
  EngineOptions o;
  o.prefix_cache = false;  // (its snapshots would end chunks at block boundaries)
  o.prefill_chunk_tokens = 16;
  o.prefill_chunk_tokens_idle = 128;
  return o;
}

TEST(PrefillBatching, PromptsSubmittedTogetherShareTheFirstPass) {
  const std::string& dir = TinyModel(1, 16);
  std::vector<std::vector<int>> passes;
  auto e = RecordingEngine(dir, Options(), &passes);
  const std::vector<std::vector<int>> prompts = {TestPrompt(40, 1), TestPrompt(50, 2), TestPrompt(30, 3)};
  std::vector<SequenceId> ids;
  for (const auto& p : prompts) ids.push_back(*e->Submit(Greedy(p, 4)));
  std::set<SequenceId> first_tokens;
  for (const TokenEvent& ev : e->Step())
    if (ev.token >= 0) first_tokens.insert(ev.id);
  // One pass, one segment per prompt, each prompt whole: 120 rows within the
  // idle budget of 128. Served one after another, the first step would hold
  // one segment and the other prompts would wait for later steps.
  ASSERT_EQ(passes.size(), 1u);
  EXPECT_EQ(passes[0], (std::vector<int>{40, 50, 30}));
  EXPECT_EQ(first_tokens, std::set<SequenceId>(ids.begin(), ids.end()));
  // Every later step decodes all three together: one row each.
  while (e->HasWork()) e->Step();
  ASSERT_EQ(passes.size(), 4u);  // the prefill, then decode steps for tokens 2, 3 and 4
  for (size_t k = 1; k < passes.size(); ++k) EXPECT_EQ(passes[k], (std::vector<int>{1, 1, 1})) << "pass " << k;
}

TEST(PrefillBatching, BatchedPrefillGivesTheTokensOfEachAlone) {
  const std::string& dir = TinyModel(1, 16);
  const std::vector<std::vector<int>> prompts = {TestPrompt(40, 1), TestPrompt(50, 2), TestPrompt(30, 3)};
  auto run = [&](const std::vector<size_t>& which) {
    std::vector<std::vector<int>> passes;
    auto e = RecordingEngine(dir, Options(), &passes);
    std::map<SequenceId, size_t> index;
    for (size_t i : which) index[*e->Submit(Greedy(prompts[i], 6))] = i;
    std::map<size_t, std::vector<int>> tokens;
    while (e->HasWork())
      for (const TokenEvent& ev : e->Step())
        if (ev.token >= 0) tokens[index.at(ev.id)].push_back(ev.token);
    return tokens;
  };
  const auto together = run({0, 1, 2});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = run({i});
    ASSERT_EQ(alone.at(i).size(), 6u);
    EXPECT_EQ(together.at(i), alone.at(i)) << "prompt " << i;
  }
}

TEST(PrefillBatching, TheBudgetSpillsIntoTheNextPrompt) {
  // 100 + 60 rows against a budget of 128: the first pass takes the first
  // prompt whole and 28 rows of the second, not the first prompt alone.
  const std::string& dir = TinyModel(1, 16);
  std::vector<std::vector<int>> passes;
  auto e = RecordingEngine(dir, Options(), &passes);
  const SequenceId a = *e->Submit(Greedy(TestPrompt(100, 4), 3));
  const SequenceId b = *e->Submit(Greedy(TestPrompt(60, 5), 3));
  std::map<SequenceId, int> first_token_step;
  for (int step = 1; e->HasWork() && step < 100; ++step)
    for (const TokenEvent& ev : e->Step())
      if (ev.token >= 0 && !first_token_step.count(ev.id)) first_token_step[ev.id] = step;
  ASSERT_GE(passes.size(), 2u);
  EXPECT_EQ(passes[0], (std::vector<int>{100, 28}));
  // Then the first decodes, so the second's remaining 32 rows go at
  // prefill_chunk_tokens (16) a step beside it.
  EXPECT_EQ(passes[1], (std::vector<int>{1, 16}));
  EXPECT_EQ(first_token_step.at(a), 1);
  EXPECT_EQ(first_token_step.at(b), 3);
}

}  // namespace
}  // namespace moeserve::engine
