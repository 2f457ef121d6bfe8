// Images through the serving engine (model.md 14.5, 14.6): the tower's rows
// reach the prompt positions however prefill is chunked (chunks that split an
// image span included), the prefix cache reuses a cached image only for the
// same image, and requests that lie about their images are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

struct Outcome {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  SequenceUsage usage;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

Outcome RunOne(Engine& e, GenerationRequest r) {
  auto id = e.Submit(std::move(r));
  EXPECT_TRUE(id) << id.error().ToString();
  Outcome o;
  if (!id) return o;
  for (int guard = 0; e.HasWork() && guard < 100000; ++guard)
    for (const TokenEvent& ev : e.Step()) {
      if (ev.id != *id) continue;
      if (ev.token >= 0) {
        o.tokens.push_back(ev.token);
        if (ev.logprob) o.logprobs.push_back(*ev.logprob);
      }
      if (ev.finish != FinishReason::kNone) {
        o.finish = ev.finish;
        o.usage = ev.usage;
        o.error = ev.error;
      }
    }
  return o;
}

std::unique_ptr<Engine> Make(EngineOptions o) {
  auto dir = OpenModelDir(TinyVisionModel());
  EXPECT_TRUE(dir) << dir.error().ToString();
  auto e = Engine::Create(*dir, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

const VisionConfig& Vision() {
  static const VisionConfig v = *OpenModelDir(TinyVisionModel())->config.vision;
  return v;
}

// <|bos|><|user|> "look" [image] "and" [image] <|end|><|assistant|><|think|>
GenerationRequest TwoImages(const ImageInput& a, const ImageInput& b) {
  GenerationRequest r;
  r.prompt = {256, 259, 108, 111, 111, 107};
  EXPECT_TRUE(AppendImage(Vision(), a, r.prompt, r.images));
  for (int t : {97, 110, 100}) r.prompt.push_back(t);
  EXPECT_TRUE(AppendImage(Vision(), b, r.prompt, r.images));
  for (int t : {262, 260, 263}) r.prompt.push_back(t);
  r.max_tokens = 6;
  r.sampling.temperature = 0;
  r.logprobs = 0;
  return r;
}

// The engine's first logits against the model's own forward over the whole
// prompt with the tower's rows: the placeholders really read the image.
TEST(VisionEngine, PromptReadsTheTowerRows) {
  EngineOptions o;
  o.prefix_cache = false;
  auto e = Make(o);
  ASSERT_TRUE(e);
  const ImageInput a = Pattern(40, 30, 1), b = Pattern(90, 60, 2);
  GenerationRequest r = TwoImages(a, b);
  const std::vector<int> prompt = r.prompt;
  const std::vector<ImageSpan> spans = r.images;
  Outcome got = RunOne(*e, r);
  ASSERT_EQ(got.finish, FinishReason::kLength) << got.error;
  EXPECT_EQ(got.usage.prompt_tokens, static_cast<int>(prompt.size()));

  ASSERT_NE(e->model(), nullptr);
  const Model& m = *e->model();
  const int D = m.config().hidden_size;
  std::vector<std::vector<float>> rows;
  std::vector<RowEmbedding> emb;
  for (const ImageSpan& s : spans) rows.push_back(*m.EmbedImage(s.image));
  for (size_t k = 0; k < spans.size(); ++k)
    for (int64_t j = 0; j < spans[k].tokens; ++j)
      emb.push_back({static_cast<int>(spans[k].offset + j), &rows[k][static_cast<size_t>(j) * D]});
  KvPool pool(64, 16, m.cache_floats_per_token());
  SequenceCache cache = m.NewSequence();
  ASSERT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(prompt.size())));
  ForwardSegment seg{&cache, prompt, false, emb};
  std::vector<float> logits;
  ASSERT_TRUE(m.Forward(pool, std::span(&seg, 1), &logits));
  const int best = static_cast<int>(std::max_element(logits.begin(), logits.begin() + 268) - logits.begin());
  EXPECT_EQ(got.tokens[0], best);
}

// Prefill in chunks of 7 tokens splits both image spans (and the 16-token
// cache blocks); the tokens and log-probabilities are those of one chunk
// (model.md 10: 1e-4 of max|ref|; the log-probabilities are within that of
// the logits).
TEST(VisionEngine, ChunkedPrefillSplittingAnImageMatches) {
  const ImageInput a = Pattern(40, 30, 1), b = Pattern(90, 60, 2);
  EngineOptions whole;
  whole.prefix_cache = false;
  EngineOptions chunked = whole;
  chunked.prefill_chunk_tokens = 7;
  chunked.prefill_chunk_tokens_idle = 7;
  auto e1 = Make(whole), e2 = Make(chunked);
  ASSERT_TRUE(e1 && e2);
  GenerationRequest r = TwoImages(a, b);
  ASSERT_GT(r.images[1].tokens, 7);  // a chunk boundary falls inside the span
  const Outcome one = RunOne(*e1, r), many = RunOne(*e2, r);
  ASSERT_EQ(one.finish, FinishReason::kLength) << one.error;
  ASSERT_EQ(many.finish, FinishReason::kLength) << many.error;
  EXPECT_EQ(one.tokens, many.tokens);
  ASSERT_EQ(one.logprobs.size(), many.logprobs.size());
  for (size_t i = 0; i < one.logprobs.size(); ++i) EXPECT_NEAR(one.logprobs[i], many.logprobs[i], 1e-4) << i;
}

// A later turn with the same image reuses the blocks that hold it; the same
// prompt with another image of the same size (the same token ids, so a cache
// keyed by tokens alone would hit) reuses nothing, and answers as an engine
// that never saw the first image.
TEST(VisionEngine, PrefixCacheKeysImagesByContent) {
  EngineOptions o;
  o.block_tokens = 16;
  auto e = Make(o);
  ASSERT_TRUE(e);
  const ImageInput a = Pattern(64, 64, 5), b = Pattern(64, 64, 6);  // 16 tokens each
  auto turn = [&](const ImageInput& image, std::vector<int> more) {
    GenerationRequest r;
    r.prompt = {256, 259};
    for (int i = 0; i < 20; ++i) r.prompt.push_back(97 + i % 26);  // text before the image: one full block
    EXPECT_TRUE(AppendImage(Vision(), image, r.prompt, r.images));
    for (int i = 0; i < 30; ++i) r.prompt.push_back(65 + i % 26);
    r.prompt.insert(r.prompt.end(), more.begin(), more.end());
    for (int t : {262, 260, 263}) r.prompt.push_back(t);
    r.max_tokens = 4;
    r.sampling.temperature = 0;
    r.logprobs = 0;
    r.tenant = "t";
    return r;
  };
  const Outcome first = RunOne(*e, turn(a, {}));
  ASSERT_EQ(first.finish, FinishReason::kLength) << first.error;
  // The image's placeholders run from 23 to 38; the prompt's 73 tokens leave
  // a snapshot of the first 64, image included.
  const Outcome again = RunOne(*e, turn(a, {120, 121}));
  EXPECT_EQ(again.usage.cached_tokens, 64) << "the same image in a later turn hits";
  const Outcome other = RunOne(*e, turn(b, {}));
  EXPECT_EQ(other.usage.cached_tokens, 0) << "a cached prefix holding another image is not reused";

  EngineOptions fresh_o = o;
  fresh_o.prefix_cache = false;
  auto fresh = Make(fresh_o);
  ASSERT_TRUE(fresh);
  const Outcome want = RunOne(*fresh, turn(b, {}));
  EXPECT_EQ(other.tokens, want.tokens);
  ASSERT_EQ(other.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < want.logprobs.size(); ++i) EXPECT_NEAR(other.logprobs[i], want.logprobs[i], 1e-4) << i;
  // The hit itself is right: the later turn answers as it does uncached.
  const Outcome again_fresh = RunOne(*fresh, turn(a, {120, 121}));
  EXPECT_EQ(again.tokens, again_fresh.tokens);
  ASSERT_EQ(again.logprobs.size(), again_fresh.logprobs.size());
  for (size_t i = 0; i < again.logprobs.size(); ++i) EXPECT_NEAR(again.logprobs[i], again_fresh.logprobs[i], 1e-4) << i;
  // And the image really matters: a and b answer differently.
  EXPECT_NE(first.logprobs, want.logprobs);
}

TEST(VisionEngine, LyingRequestsAreRefused) {
  EngineOptions o;
  auto e = Make(o);
  ASSERT_TRUE(e);
  const ImageInput a = Pattern(40, 30, 1);
  auto refused = [&](GenerationRequest r) {
    auto id = e->Submit(std::move(r));
    return id ? std::string() : id.error().message();
  };
  GenerationRequest typed;  // placeholder ids with no pixels behind them
  typed.prompt = {256, 259, 269, 268, 268, 270, 262};
  EXPECT_NE(refused(typed).find("prompt token 2: image token 269 outside an image span"), std::string::npos) << refused(typed);
  GenerationRequest wrong_hash = TwoImages(a, a);
  wrong_hash.images[1].image.content_hash = Pattern(40, 30, 9).content_hash;
  EXPECT_NE(refused(wrong_hash).find("image 1: content_hash does not match its pixels"), std::string::npos);
  GenerationRequest short_span = TwoImages(a, a);
  short_span.images[0].tokens -= 1;
  EXPECT_NE(refused(short_span).find("image 0: spans"), std::string::npos) << refused(short_span);
  GenerationRequest padding;
  padding.prompt = {256, 300};
  EXPECT_NE(refused(padding).find("padding id 300"), std::string::npos);

  // A text-only model refuses images outright.
  auto text_dir = OpenModelDir(TinyModel());
  ASSERT_TRUE(text_dir);
  auto text = Engine::Create(*text_dir, o);
  ASSERT_TRUE(text);
  GenerationRequest with_image = TwoImages(a, a);
  auto id = (*text)->Submit(with_image);
  ASSERT_FALSE(id);
  EXPECT_NE(id.error().message().find("this model has no vision tower"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::engine
