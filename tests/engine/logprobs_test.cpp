// engine.logprobs: the log-probabilities the engine reports for sampled tokens
// against a softmax computed here from the model's own logits (a whole-prefix
// forward pass over the same tokens), and that nothing is reported or computed
// for requests that do not ask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/sampler.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

std::vector<TokenEvent> Generate(Engine& engine, GenerationRequest req) {
  auto id = engine.Submit(std::move(req));
  EXPECT_TRUE(id) << id.error().ToString();
  std::vector<TokenEvent> events;
  for (int i = 0; i < 1000 && engine.HasWork(); ++i)
    for (auto& e : engine.Step()) events.push_back(std::move(e));
  return events;
}

// log_softmax over the tokenizer's ids of one row of logits, in double.
std::vector<double> LogSoftmax(const float* row) {
  const int n = tok::kFirstPadding;
  double mx = *std::max_element(row, row + n), sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = row[i] - mx - std::log(sum);
  return out;
}

TEST(EngineLogprobs, MatchASoftmaxOverTheModelsLogits) {
  auto dir = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(dir);
  EngineOptions o;
  o.cache_tokens = 1024;
  auto engine = Engine::Create(*dir, o);
  ASSERT_TRUE(engine) << engine.error().ToString();
  GenerationRequest req;
  req.prompt = TestPrompt(24);
  req.max_tokens = 16;
  req.starts_in_reasoning = false;
  req.stop_tokens = {-2};  // nothing stops it: every step is sampled
  // Temperature and top-p change what is sampled, never the reported values.
  req.sampling = {.temperature = 1.5f, .top_k = 0, .top_p = 0.7f, .seed = 3};
  req.logprobs = 5;
  const auto prompt = req.prompt;
  auto events = Generate(**engine, req);
  ASSERT_EQ(events.size(), 16u);

  // The same tokens through the model in one pass, logits at every position.
  auto model = Model::Load(*dir);
  ASSERT_TRUE(model);
  std::vector<int> tokens = prompt;
  for (const auto& e : events) tokens.push_back(e.token);
  KvPool pool(16, 16, (*model)->cache_floats_per_token());
  SequenceCache cache = (*model)->NewSequence();
  ASSERT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(tokens.size())));
  ForwardSegment seg{&cache, std::span<const int>(tokens), true};
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &logits));
  const int V = dir->config.vocab_size;

  int outside_top = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const TokenEvent& e = events[i];
    ASSERT_TRUE(e.logprob.has_value()) << i;
    auto expected = LogSoftmax(logits.data() + (prompt.size() - 1 + i) * static_cast<size_t>(V));
    EXPECT_NEAR(*e.logprob, expected[e.token], 2e-3) << "token " << i;
    ASSERT_EQ(e.top_logprobs.size(), 5u);
    std::vector<double> sorted = expected;
    std::sort(sorted.rbegin(), sorted.rend());
    for (size_t k = 0; k < 5; ++k) {
      const auto& t = e.top_logprobs[k];
      EXPECT_NEAR(t.logprob, expected[t.token], 2e-3) << "token " << i << " alternative " << k;
      EXPECT_NEAR(t.logprob, sorted[k], 2e-3) << "token " << i << " alternative " << k << " is not the k-th most likely";
      if (k > 0) {
        EXPECT_LE(t.logprob, e.top_logprobs[k - 1].logprob);
      }
    }
    outside_top += *e.logprob < e.top_logprobs.back().logprob;
  }
  // At temperature 1.5 some sampled tokens are not among the five most likely
  // (this is what makes the check above cover more than the argmax).
  std::printf("sampled tokens outside the top 5: %d of %zu\n", outside_top, events.size());
}

TEST(EngineLogprobs, NothingReportedUnlessAskedAndBoundsChecked) {
  auto dir = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(dir);
  EngineOptions o;
  o.cache_tokens = 1024;
  auto engine = Engine::Create(*dir, o);
  ASSERT_TRUE(engine);
  GenerationRequest req;
  req.prompt = TestPrompt(10);
  req.max_tokens = 4;
  req.starts_in_reasoning = false;
  for (const auto& e : Generate(**engine, req)) {
    EXPECT_FALSE(e.logprob.has_value());
    EXPECT_TRUE(e.top_logprobs.empty());
  }
  req.logprobs = 0;  // the sampled token's only
  for (const auto& e : Generate(**engine, req)) {
    EXPECT_TRUE(e.logprob.has_value());
    EXPECT_TRUE(e.top_logprobs.empty());
  }
  req.logprobs = 21;
  EXPECT_FALSE((*engine)->Submit(req).has_value());
}

TEST(EngineLogprobs, TokenLogprobsIgnorePaddingAndMasks) {
  std::vector<float> row(tok::kFirstPadding + 4, 0.0f);
  row[tok::kFirstPadding] = 50.0f;  // padding, never a token
  row[7] = 1.0f;
  TokenLogprobs lp(row);
  const double z = std::log((tok::kFirstPadding - 1) + std::exp(1.0));
  EXPECT_NEAR(lp.Of(7), 1.0 - z, 1e-6);
  EXPECT_NEAR(lp.Of(0), -z, 1e-6);
  EXPECT_TRUE(std::isinf(lp.Of(tok::kFirstPadding)));
  auto top = lp.Top(3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 7);
  EXPECT_EQ(top[1].token, 0);  // ties: lower id first
  EXPECT_EQ(top[2].token, 1);
}

}  // namespace
}  // namespace moeserve::engine
