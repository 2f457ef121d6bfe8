// Engine invariants of model.md section 10 (two forms of one layer, cache
// consistency, batched vs alone, prefix-cached vs not: 1e-4 * max|ref|, same
// tokens) plus sampling, thinking budgets, cancellation and pool limits.
#include "moeserve/engine/engine.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "moeserve/engine/model.hpp"
#include "moeserve/engine/sampler.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b, int V) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t row = 0; row * V < a.size(); ++row) {
    double mx = 0, diff = 0;
    for (int v = 0; v < V; ++v) {
      mx = std::max(mx, std::fabs(static_cast<double>(b[row * V + v])));
      diff = std::max(diff, std::fabs(static_cast<double>(a[row * V + v]) - b[row * V + v]));
    }
    worst = std::max(worst, diff / mx);
  }
  return worst;
}

struct Fixture {
  ModelDir dir;
  std::unique_ptr<Model> model;
};

Fixture Load(const std::string& path) {
  auto d = OpenModelDir(path);
  EXPECT_TRUE(d) << d.error().ToString();
  auto m = Model::Load(*d);
  EXPECT_TRUE(m) << m.error().ToString();
  return {std::move(*d), std::move(*m)};
}

// Logits of every position of `tokens`, fed in pieces of the given sizes.
std::vector<float> RunPieces(Model& model, const std::vector<int>& tokens, const std::vector<int>& pieces, ForwardTrace* trace = nullptr) {
  KvPool pool(64, 16, model.cache_floats_per_token());
  SequenceCache cache = model.NewSequence();
  std::vector<float> all, logits;
  size_t at = 0;
  for (int n : pieces) {
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + n));
    ForwardSegment seg{&cache, std::span<const int>(tokens.data() + at, static_cast<size_t>(n)), true};
    auto st = model.Forward(pool, std::span(&seg, 1), &logits, trace);
    EXPECT_TRUE(st) << st.error().ToString();
    all.insert(all.end(), logits.begin(), logits.end());
    at += static_cast<size_t>(n);
  }
  return all;
}

TEST(EngineForms, PrefillThenDecodeEqualsLongerPrefill) {
  auto f = Load(TinyModel(1, 16));  // sparse DSA selection is active past 16 tokens
  const auto tokens = TestPrompt(80);
  const int V = f.dir.config.vocab_size;
  auto whole = RunPieces(*f.model, tokens, {80});
  std::vector<int> pieces = {60};
  for (int i = 0; i < 20; ++i) pieces.push_back(1);
  auto split = RunPieces(*f.model, tokens, pieces);
  double d = MaxRelDiff(split, whole, V);
  std::printf("prefill 60 + 20 decode vs prefill 80: %.3g\n", d);
  EXPECT_LE(d, 1e-4);
  auto odd = RunPieces(*f.model, tokens, {17, 1, 31, 2, 29});
  EXPECT_LE(MaxRelDiff(odd, whole, V), 1e-4);
}

TEST(EngineForms, AbsorbedEqualsExpandedAndChunkedEqualsRecurrent) {
  auto f = Load(TinyModel(1, 16));
  const auto tokens = TestPrompt(150);
  const int V = f.dir.config.vocab_size;
  ModelOptions o;
  o.mla_form = MlaForm::kExpanded;
  o.delta_form = DeltaForm::kRecurrent;
  f.model->set_options(o);
  auto ref = RunPieces(*f.model, tokens, {150});
  for (auto [mla, delta, chunk] : {std::tuple{MlaForm::kAbsorbed, DeltaForm::kRecurrent, 64},
                                   std::tuple{MlaForm::kExpanded, DeltaForm::kChunked, 64},
                                   std::tuple{MlaForm::kAbsorbed, DeltaForm::kChunked, 16},
                                   std::tuple{MlaForm::kExpanded, DeltaForm::kChunked, 1}}) {
    o.mla_form = mla;
    o.delta_form = delta;
    o.delta_chunk = chunk;
    f.model->set_options(o);
    double d = MaxRelDiff(RunPieces(*f.model, tokens, {150}), ref, V);
    std::printf("form mla=%d delta=%d chunk=%d vs expanded+recurrent: %.3g\n", static_cast<int>(mla), static_cast<int>(delta), chunk, d);
    EXPECT_LE(d, 1e-4);
  }
}

// The tiny preset with 16 attention heads: more than kMaxHeadsPerCall / 128,
// so an absorbed prefill runs causal blocks of 128 rows (attention_mla.cpp's
// kMinRowsPerBlock) and each block's per-head products as GEMMs, the path
// DeepSeek-V3.2's 128 heads take. Dense (index_topk 2048) and sparse (16).
TEST(EngineForms, AbsorbedEqualsExpandedWithManyHeads) {
  for (const int topk : {2048, 16}) {
    const std::string dir = TempPath("tiny_h16_k" + std::to_string(topk));
    std::filesystem::remove_all(dir);
    ModelGenOptions g;
    g.config = *PresetConfig("tiny");
    g.config.mla.num_heads = 16;
    g.config.dsa.index_topk = topk;
    g.seed = 5;
    auto st = GenerateModel(g, dir);
    ASSERT_TRUE(st) << st.error().ToString();
    auto f = Load(dir);
    ASSERT_EQ(f.dir.config.mla.num_heads, 16);
    const auto tokens = TestPrompt(300);
    const int V = f.dir.config.vocab_size;
    ModelOptions o;
    o.mla_form = MlaForm::kExpanded;
    f.model->set_options(o);
    const auto expanded = RunPieces(*f.model, tokens, {300});
    o.mla_form = MlaForm::kAbsorbed;
    f.model->set_options(o);
    // One prefill of 300 rows (blocks of 128, 128, 44), then 150 + 150.
    for (const std::vector<int>& pieces : {std::vector<int>{300}, std::vector<int>{150, 150}}) {
      const double d = MaxRelDiff(RunPieces(*f.model, tokens, pieces), expanded, V);
      std::printf("16 heads, topk %d, %zu pieces: absorbed vs expanded %.3g\n", topk, pieces.size(), d);
      EXPECT_LE(d, 1e-4) << "topk " << topk << ", " << pieces.size() << " pieces";
    }
    std::filesystem::remove_all(dir);
  }
}

// Per row of V logits: the largest difference over the row's largest |b|;
// the median over rows, and the share of rows whose argmax agrees.
std::pair<double, double> MedianRelDiffAndAgreement(const std::vector<float>& a, const std::vector<float>& b, int V) {
  EXPECT_EQ(a.size(), b.size());
  std::vector<double> rel;
  int agree = 0;
  for (size_t row = 0; (row + 1) * V <= a.size(); ++row) {
    const float* x = &a[row * V];
    const float* y = &b[row * V];
    double mx = 0, diff = 0;
    for (int v = 0; v < V; ++v) {
      mx = std::max(mx, std::fabs(static_cast<double>(y[v])));
      diff = std::max(diff, std::fabs(static_cast<double>(x[v]) - y[v]));
    }
    rel.push_back(diff / mx);
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  std::sort(rel.begin(), rel.end());
  return {rel[rel.size() / 2], static_cast<double>(agree) / static_cast<double>(rel.size())};
}

TEST(EngineForms, Bf16ActivationsStayNearTheFp32Products) {
  // The BF16-activation kernels (BF16 GEMMs and attention tiles where the
  // CPU has AVX-512 BF16) through the whole model: causal blocks, sparse
  // rows past 64 tokens, per-head GEMMs, experts side by side. No bound is
  // promised per logit on random weights (BF16 keeps 8 bits, and a rounded
  // activation can flip a router's or the indexer's choice, after which a
  // row differs wholly), but the typical row stays within a few percent of
  // the fp32 path's and most greedy tokens agree, whole or in pieces; a
  // misplaced column or head would put every row far off. (Measured: median
  // 1.4 %, 94 % agreement; the rounding-only AVX2 form 2.4 %, 90 %.)
  auto f = Load(TinyModel(1, 64));
  const auto tokens = TestPrompt(150);
  const int V = f.dir.config.vocab_size;
  const auto fp32 = RunPieces(*f.model, tokens, {150});
  ModelOptions o;
  o.bf16_activations = true;
  f.model->set_options(o);
  const auto whole = RunPieces(*f.model, tokens, {150});
  const auto [median, agree] = MedianRelDiffAndAgreement(whole, fp32, V);
  std::printf("bf16 activations vs fp32 products: median row %.3g, greedy agreement %.2f\n", median, agree);
  EXPECT_LE(median, 0.05);
  EXPECT_GT(median, 0.0);  // the BF16 path is what ran
  EXPECT_GE(agree, 0.85);
  const auto pieces = RunPieces(*f.model, tokens, {17, 1, 31, 2, 99});
  const auto [median_p, agree_p] = MedianRelDiffAndAgreement(pieces, whole, V);
  std::printf("bf16 activations, in pieces vs whole: median row %.3g, greedy agreement %.2f\n", median_p, agree_p);
  EXPECT_LE(median_p, 0.05);
  EXPECT_GE(agree_p, 0.85);
}

TEST(EngineForms, DsaShorterThanTopkEqualsDenseMlaExactly) {
  auto f = Load(TinyModel(1, 2048));
  ModelDir dense_dir = std::move(f.dir);
  auto sparse_logits = RunPieces(*f.model, TestPrompt(100), {100});
  for (auto& k : dense_dir.config.layer_types)
    if (k == LayerKind::kDsa) k = LayerKind::kMla;
  auto dense = Model::Load(dense_dir);
  ASSERT_TRUE(dense);
  auto dense_logits = RunPieces(**dense, TestPrompt(100), {100});
  ASSERT_EQ(sparse_logits.size(), dense_logits.size());
  EXPECT_EQ(std::memcmp(sparse_logits.data(), dense_logits.data(), sparse_logits.size() * 4), 0);
}

TEST(EngineForms, SparseSelectionDropsTokens) {
  auto f = Load(TinyModel(1, 16));
  ForwardTrace trace;
  RunPieces(*f.model, TestPrompt(64), {64}, &trace);
  ASSERT_EQ(trace.dsa_selected.size(), 2u);
  for (auto& [layer, sets] : trace.dsa_selected) {
    ASSERT_EQ(sets.size(), 64u);
    EXPECT_EQ(sets[10].size(), 11u);  // short context: everything
    EXPECT_EQ(sets[63].size(), 16u);  // long context: top 16 only
  }
}

// Runs requests to completion; returns each one's tokens and final usage.
struct Outcome {
  std::vector<int> tokens;
  SequenceUsage usage;
  FinishReason finish = FinishReason::kNone;
};
std::map<SequenceId, Outcome> Drain(Engine& engine) {
  std::map<SequenceId, Outcome> out;
  for (int guard = 0; engine.HasWork() && guard < 100000; ++guard)
    for (const TokenEvent& e : engine.Step()) {
      if (e.token >= 0) out[e.id].tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) {
        out[e.id].finish = e.finish;
        out[e.id].usage = e.usage;
      }
    }
  return out;
}

std::unique_ptr<Engine> MakeEngine(const ModelDir& dir, EngineOptions o = {}) {
  auto e = Engine::Create(dir, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return std::move(*e);
}

GenerationRequest Request(std::vector<int> prompt, int max_tokens, float temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = seed;
  return r;
}

TEST(EngineBatching, BatchOfFourEqualsEachAlone) {
  auto d = OpenModelDir(TinyModel(1, 16));
  ASSERT_TRUE(d);
  std::vector<GenerationRequest> reqs = {Request(TestPrompt(40, 1), 24, 0.0f, 0), Request(TestPrompt(75, 2), 24, 0.8f, 11),
                                         Request(TestPrompt(9, 3), 24, 1.0f, 12), Request(TestPrompt(130, 4), 24, 0.0f, 0)};
  std::vector<Outcome> alone;
  for (auto& r : reqs) {
    auto e = MakeEngine(*d);
    auto id = e->Submit(r);
    ASSERT_TRUE(id);
    alone.push_back(Drain(*e)[*id]);
  }
  EngineOptions o;
  o.prefill_chunk_tokens = 48;  // several steps of chunked prefill while others decode
  o.prefill_chunk_tokens_idle = 48;
  auto e = MakeEngine(*d, o);
  std::vector<SequenceId> ids;
  for (auto& r : reqs) ids.push_back(*e->Submit(r));
  auto together = Drain(*e);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[ids[i]].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[ids[i]].finish, alone[i].finish);
    EXPECT_EQ(together[ids[i]].usage.completion_tokens, static_cast<int>(alone[i].tokens.size()));
  }
}

TEST(EngineOptionsCheck, DecodeActivationBitsMustBeAWidthTheKernelsHave) {
  auto d = OpenModelDir(TinyModel(1, 16));
  ASSERT_TRUE(d);
  for (int bad : {0, 12, 32, -8}) {
    EngineOptions o;
    o.decode_activation_bits = bad;
    auto refused = Engine::Create(*d, o);
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message().find("decode_activation_bits"), std::string::npos);
  }
  for (int good : {8, 16, 21}) {
    EngineOptions o;
    o.decode_activation_bits = good;
    auto e = Engine::Create(*d, o);
    EXPECT_TRUE(e) << good << ": " << e.error().ToString();
  }
}

TEST(EngineBatching, PromptChunksAreLargerWhenNothingDecodes) {
  // Alone, a prompt runs in chunks of prefill_chunk_tokens_idle (no one
  // waits on those steps); beside a decoding sequence, of
  // prefill_chunk_tokens. Counted in steps to each one's first token.
  auto d = OpenModelDir(TinyModel(1, 16));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.prefix_cache = false;  // (its snapshots would split chunks at block boundaries)
  o.prefill_chunk_tokens = 16;
  o.prefill_chunk_tokens_idle = 64;
  auto e = MakeEngine(*d, o);
  const auto steps_to_first_token = [&](SequenceId id) {
    for (int steps = 1; steps <= 100; ++steps)
      for (const TokenEvent& ev : e->Step())
        if (ev.id == id && ev.token >= 0) return steps;
    return -1;
  };
  // A budget of 0 (or less) would never run a prompt: refused at Create.
  for (int bad : {0, -5}) {
    EngineOptions b = o;
    b.prefill_chunk_tokens_idle = bad;
    auto refused = Engine::Create(*d, b);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message().find("prefill_chunk_tokens_idle"), std::string::npos);
  }
  GenerationRequest first = Request(TestPrompt(130, 1), 40, 0.0f, 0);
  first.stop_tokens = {-1};  // it decodes all 40, beside the second prompt
  const SequenceId a = *e->Submit(first);
  EXPECT_EQ(steps_to_first_token(a), 3);  // 64 + 64 + 2 tokens
  const SequenceId b = *e->Submit(Request(TestPrompt(64, 2), 4, 0.0f, 0));
  EXPECT_EQ(steps_to_first_token(b), 4);  // 16 a step while the first decodes
  const auto rest = Drain(*e);
  EXPECT_EQ(rest.at(a).finish, FinishReason::kLength);
}

TEST(EngineBatching, SeedReproducesAndDiffers) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  auto run = [&](uint64_t seed) {
    auto e = MakeEngine(*d);
    auto id = *e->Submit(Request(TestPrompt(20), 32, 1.0f, seed));
    return Drain(*e)[id].tokens;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(EnginePrefix, CacheOnAndOffGiveSameTokens) {
  auto d = OpenModelDir(TinyModel(1, 16));
  ASSERT_TRUE(d);
  const auto history = TestPrompt(200, 9);
  auto turn2 = history;
  for (int t : TestPrompt(30, 10)) turn2.push_back(t);
  auto run = [&](bool prefix) {
    EngineOptions o;
    o.prefix_cache = prefix;
    auto e = MakeEngine(*d, o);
    auto a = *e->Submit(Request(history, 8, 0.0f, 0));
    auto first = Drain(*e);
    auto b = *e->Submit(Request(turn2, 16, 0.7f, 3));
    auto second = Drain(*e);
    return std::make_tuple(first[a], second[b], e->Metrics());
  };
  auto [on1, on2, on_metrics] = run(true);
  auto [off1, off2, off_metrics] = run(false);
  EXPECT_EQ(on1.tokens, off1.tokens);
  EXPECT_EQ(on2.tokens, off2.tokens);
  EXPECT_EQ(off2.usage.cached_tokens, 0);
  EXPECT_EQ(on2.usage.cached_tokens, 192);  // (200-1) rounded down to 16-token blocks
  EXPECT_EQ(on_metrics.prefix_hit_tokens, 192u);
  std::printf("prefix cache: second turn reused %d of %d prompt tokens\n", on2.usage.cached_tokens, on2.usage.prompt_tokens);
}

// Forbids closing the thinking span or the turn, so only the budget can close it.
class KeepThinking : public DecodeController {
 public:
  void Mask(std::span<float> logits) override {
    for (int t : {tok::kEndThink, tok::kEnd, tok::kEos}) logits[static_cast<size_t>(t)] = -INFINITY;
  }
};

TEST(EngineThinking, BudgetForcesEndOfThinking) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  auto e = MakeEngine(*d);
  auto r = Request(TestPrompt(12), 20, 1.0f, 1);
  r.thinking_budget = 8;
  r.controller = std::make_shared<KeepThinking>();
  auto id = *e->Submit(r);
  std::vector<TokenEvent> events;
  while (e->HasWork())
    for (auto& ev : e->Step()) events.push_back(ev);
  ASSERT_GE(events.size(), 9u);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(events[i].reasoning) << i;
  EXPECT_EQ(events[8].token, tok::kEndThink);
  EXPECT_TRUE(events[8].forced);
  EXPECT_FALSE(events[8].reasoning);
  EXPECT_FALSE(events[9].reasoning);
  EXPECT_EQ(events.back().usage.reasoning_tokens, 8);
  EXPECT_EQ(events.back().usage.completion_tokens, 20);
  EXPECT_EQ(events.back().finish, FinishReason::kLength);
  (void)id;
}

TEST(EngineLimits, RefusesBadPromptsAndCancels) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.cache_tokens = 256;
  o.prefix_cache = false;
  o.max_waiting = 2;
  auto e = MakeEngine(*d, o);
  EXPECT_EQ(e->max_context(), 256);
  auto too_long = e->Submit(Request(TestPrompt(250), 10, 0, 0));
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().code(), ErrorCode::kOutOfRange);  // the daemon maps the code, never the text
  EXPECT_NE(too_long.error().message().find("context length exceeded"), std::string::npos);
  auto padding = e->Submit(Request({256, 300, 1}, 4, 0, 0));
  ASSERT_FALSE(padding);
  EXPECT_NE(padding.error().message().find("padding id 300"), std::string::npos);
  EXPECT_FALSE(e->Submit(Request({}, 4, 0, 0)));
  auto a = *e->Submit(Request(TestPrompt(20), 100, 0, 0));
  auto b = *e->Submit(Request(TestPrompt(20), 100, 0, 0));
  auto full = e->Submit(Request(TestPrompt(20), 100, 0, 0));
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code(), ErrorCode::kResourceExhausted);
  e->Step();
  e->Cancel(a);
  auto ev = e->Step();
  bool cancelled = std::any_of(ev.begin(), ev.end(), [&](auto& x) { return x.id == a && x.finish == FinishReason::kCancelled; });
  EXPECT_TRUE(cancelled);
  e->Cancel(b);
  Drain(*e);
  // Cancelled sequences give their blocks back (the prefix cache, off here, would keep some).
  const auto m = e->Metrics();
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_DOUBLE_EQ(m.cache_usage_ratio, 0.0);
}

TEST(KvPoolTest, FullPoolIsAnError) {
  KvPool pool(2, 4, 8);
  SequenceCache c;
  EXPECT_TRUE(EnsureBlocks(pool, c, 8));
  auto st = EnsureBlocks(pool, c, 9);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().message().find("KV cache pool is full"), std::string::npos);
  ReleaseBlocks(pool, c);
  EXPECT_EQ(pool.free_blocks(), 2);
}

TEST(KvPoolTest, PoolLargerThanMemoryIsAnErrorAtStart) {
  // 2^20 blocks of 16 tokens x 2^16 floats: 4 PiB, far beyond any machine.
  EXPECT_THROW(KvPool(int64_t{1} << 20, 16, size_t{1} << 16), std::bad_alloc);
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.cache_tokens = int64_t{1} << 40;
  auto e = Engine::Create(*d, o);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(e.error().message().find("cache_tokens"), std::string::npos) << e.error().ToString();
}

TEST(KvPoolTest, FreshBlocksReadZero) {
  KvPool pool(64, 16, 100);
  for (int b = 0; b < 64; b += 21)
    for (int s = 0; s < 16; s += 5)
      for (int f = 0; f < 100; f += 33) EXPECT_EQ(pool.TokenRow(b, s)[f], 0.0f);
}

TEST(Sampler, GreedyTopKTopP) {
  std::vector<float> l = {1, 5, 5, 2};
  std::mt19937_64 rng(1);
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(SampleToken(l, greedy, rng), 1);  // tie -> lower id
  SamplingParams k1;
  k1.top_k = 1;
  EXPECT_EQ(SampleToken(l, k1, rng), 1);
  SamplingParams p;
  p.top_p = 0.01f;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(SampleToken(l, p, rng), 1);
  std::vector<float> padded(384, 0.0f);
  padded[300] = 100;
  MaskPadding(padded);
  EXPECT_LT(SampleToken(padded, greedy, rng), 268);
}

// Sampling follows the tempered softmax: the frequencies of 40,000 draws
// (fixed seed) within 0.01 of the probabilities, with and without top-k.
TEST(Sampler, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> base = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 2.0f, -3.0f, 1.0f};
  for (int top_k : {0, 3}) {
    SamplingParams params;
    params.temperature = 0.7f;
    params.top_k = top_k;
    // Expected: softmax(base / T) over the candidates (the top_k by logit, ties to the lower id).
    std::vector<int> ids(base.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return base[a] > base[b]; });
    if (top_k > 0) ids.resize(static_cast<size_t>(top_k));
    std::vector<double> expect(base.size(), 0.0);
    double sum = 0;
    for (int id : ids) sum += expect[id] = std::exp(base[id] / 0.7);
    for (double& e : expect) e /= sum;
    std::mt19937_64 rng(11);
    std::vector<int> count(base.size(), 0);
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) {
      std::vector<float> l = base;
      ++count[SampleToken(l, params, rng)];
    }
    for (size_t id = 0; id < base.size(); ++id)
      EXPECT_NEAR(static_cast<double>(count[id]) / draws, expect[id], 0.01) << "id " << id << " top_k " << top_k;
  }
}

// top-p over a large flat vocabulary: the nucleus is the lowest-id half
// (ties go to the lower id), found past the first sorted prefix; every draw
// falls inside it and spreads over it.
TEST(Sampler, NucleusOverALargeFlatVocabulary) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_p = 0.5f;
  std::mt19937_64 rng(3);
  std::vector<int> seen(1000, 0);
  for (int i = 0; i < 4000; ++i) {
    std::vector<float> l(1000, 0.25f);
    const int id = SampleToken(l, params, rng);
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 500) << "outside the nucleus";
    ++seen[id];
  }
  int distinct = 0;
  for (int c : seen) distinct += c > 0;
  EXPECT_GT(distinct, 450);
  // One token far above the rest is the whole nucleus.
  std::vector<float> l(1000, 0.0f);
  l[777] = 30.0f;
  EXPECT_EQ(SampleToken(l, params, rng), 777);
}

}  // namespace
}  // namespace moeserve::engine
