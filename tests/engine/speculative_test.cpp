// Speculative decoding (engine.hpp SpeculativeMode): drafts never change a
// greedy sequence's tokens and, in deterministic mode, not one bit of its
// log-probabilities; a cut-short draft rolls every layer kind's state back
// (MLA and DSA rows, DSA's indexer keys, DeltaNet's recurrent state, gated
// GQA, gpt-oss's banded attention); a draft token the grammar refuses ends
// the draft; sampled drafts keep the model's distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/sampler.hpp"
#include "speculation/prompt_lookup.hpp"
#include "test_models.hpp"
#include "../support/forced_tokens.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

// ---- Prompt lookup ----

TEST(PromptLookup, ProposesWhatFollowedTheLongestEarlierMatch) {
  PromptLookup lookup(3, 16);
  //                  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
  std::vector<int> t{10, 11, 12, 13, 14, 9, 8, 11, 12, 15, 16, 7, 10, 11, 12};
  // Suffix 10 11 12 matches at 0..2 (3 tokens); 11 12 alone at 7..8 is
  // shorter than min_match and also 2 tokens: the longest wins.
  EXPECT_EQ(lookup.Propose(t, 2), (std::vector<int>{13, 14}));
  EXPECT_EQ(lookup.Propose(t, 10), (std::vector<int>{13, 14, 9, 8, 11, 12, 15, 16, 7, 10}));
}

TEST(PromptLookup, PrefersALongerMatchOverAMoreRecentOne) {
  PromptLookup lookup(3, 16);
  // "1 2 3 4" then later "9 2 3 4": the suffix "1 2 3 4" matches the first
  // occurrence over 4 tokens, the second over only 3.
  std::vector<int> t{1, 2, 3, 4, 50, 51, 9, 2, 3, 4, 60, 61, 1, 2, 3, 4};
  EXPECT_EQ(lookup.Propose(t, 2), (std::vector<int>{50, 51}));
  t.back() = 5;  // no earlier "2 3 5"
  PromptLookup fresh(3, 16);
  EXPECT_TRUE(fresh.Propose(t, 2).empty());
}

TEST(PromptLookup, GrowsWithTheSequenceAndNeedsMinMatch) {
  PromptLookup lookup(3, 8);
  std::vector<int> t{5, 6, 7, 8, 5, 6};
  EXPECT_TRUE(lookup.Propose(t, 4).empty());  // "8 5 6" never occurred
  t.push_back(7);
  EXPECT_EQ(lookup.Propose(t, 4), (std::vector<int>{8, 5, 6, 7}));
  EXPECT_EQ(lookup.indexed(), static_cast<int64_t>(t.size()));
  EXPECT_TRUE(lookup.Propose(t, 0).empty());
}

// ---- The acceptance rule ----

TEST(VerifyDraftToken, GreedyAcceptsOnlyTheArgmax) {
  std::mt19937_64 rng(1);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<float> l{0.1f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(VerifyDraftToken(l, greedy, 1, rng).token, 1);
  EXPECT_TRUE(VerifyDraftToken(l, greedy, 1, rng).accepted);
  const DraftVerdict refused = VerifyDraftToken(l, greedy, 2, rng);  // a tie goes to the lower id
  EXPECT_EQ(refused.token, 1);
  EXPECT_FALSE(refused.accepted);
}

// The tokens VerifyDraftToken yields have the distribution SampleToken
// draws from, whatever the draft: 400k draws per case, each frequency
// within 5 standard deviations of its probability. Always accepting the
// draft, or drawing the rejection from the full distribution, fails this.
TEST(VerifyDraftToken, SampledKeepsTheDistribution) {
  const std::vector<float> logits{1.0f, 0.2f, -0.5f, 1.4f, 0.0f, -3.0f};
  struct Case {
    float temperature;
    int top_k;
    float top_p;
  };
  for (const Case c : {Case{1.0f, 0, 1.0f}, Case{0.7f, 3, 1.0f}, Case{1.3f, 0, 0.8f}}) {
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    // The target distribution, from SampleToken itself.
    constexpr int kDraws = 400000;
    std::vector<double> want(logits.size(), 0);
    std::mt19937_64 ref_rng(7);
    for (int i = 0; i < kDraws; ++i) {
      std::vector<float> row = logits;
      want[static_cast<size_t>(SampleToken(row, params, ref_rng))] += 1.0 / kDraws;
    }
    for (int draft : {0, 3, 5}) {
      std::mt19937_64 rng(11 + static_cast<uint64_t>(draft));
      std::vector<double> got(logits.size(), 0);
      int accepted = 0;
      for (int i = 0; i < kDraws; ++i) {
        std::vector<float> row = logits;
        const DraftVerdict v = VerifyDraftToken(row, params, draft, rng);
        ASSERT_GE(v.token, 0);
        got[static_cast<size_t>(v.token)] += 1.0;
        accepted += v.accepted;
        if (v.accepted) ASSERT_EQ(v.token, draft);
      }
      for (size_t t = 0; t < logits.size(); ++t) {
        const double p = want[t], f = got[t] / kDraws;
        const double sd = std::sqrt(std::max(p * (1 - p), 1e-7) / kDraws) * std::sqrt(2.0);
        EXPECT_NEAR(f, p, 5 * sd + 1e-6) << "temperature " << c.temperature << " top_k " << c.top_k << " top_p "
                                          << c.top_p << " draft " << draft << " token " << t;
      }
      // The draft is accepted exactly as often as the model would draw it.
      EXPECT_NEAR(static_cast<double>(accepted) / kDraws, want[static_cast<size_t>(draft)],
                  5 * std::sqrt(std::max(want[static_cast<size_t>(draft)], 1e-7) / kDraws) + 1e-6);
    }
  }
}

// ---- Through the engine, on every family ----

struct Trace {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  SequenceUsage usage;
  std::string error;
};

std::map<SequenceId, Trace> Drain(Engine& e) {
  std::map<SequenceId, Trace> out;
  for (int guard = 0; e.HasWork() && guard < 100000; ++guard)
    for (const TokenEvent& ev : e.Step()) {
      Trace& t = out[ev.id];
      if (ev.token >= 0) t.tokens.push_back(ev.token);
      if (ev.logprob) t.logprobs.push_back(*ev.logprob);
      for (const TokenLogprob& l : ev.top_logprobs) t.logprobs.push_back(l.logprob);
      if (ev.finish != FinishReason::kNone) t.usage = ev.usage;
      if (!ev.error.empty()) t.error = ev.error;
    }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct FamilyCase {
  std::string name;
  std::string dir;
  int vocab = 0;  // ids below this are ordinary tokens in every family's vocabulary
  // Batch-invariant decode (EngineOptions::deterministic) where the family
  // has it: drafted and plain runs agree bit for bit. gpt-oss has no such
  // mode: a verification's rows run the multi-row products, so its
  // log-probabilities agree to rounding (a stale or missing cache row would
  // move them by far more).
  bool deterministic = true;
};

void ExpectSameLogprobs(const FamilyCase& fc, const std::vector<float>& drafted, const std::vector<float>& plain) {
  ASSERT_EQ(drafted.size(), plain.size());
  ASSERT_FALSE(plain.empty());
  if (fc.deterministic) {
    EXPECT_TRUE(SameBits(drafted, plain)) << "log-probabilities differ";
    return;
  }
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(drafted[i], plain[i], 2e-3) << "log-probability " << i;
}

std::vector<FamilyCase>& Families() {
  static std::vector<FamilyCase> cases = [] {
    std::vector<FamilyCase> out;
    out.push_back({"moe-dsa-v1 (mla, delta, dsa)", TinyModel(1, 16), 200});
    const std::string base = ::testing::TempDir() + "/moe_spec_" + std::to_string(::getpid());
    const std::vector<std::pair<std::string, std::string>> written{
        {"qwen3_next (gated gqa, delta)", "families/qwen3_next.py write --vocab 512 --layers 4 --seed 5"},
        {"deepseek_v32 (mla, dsa)", "families/deepseek_v32.py write --layers 3 --index-topk 8"},
        {"gpt-oss (banded and full attention)", "gpt_oss.py write --layers 2 --window 4 --seed 5"}};
    for (size_t i = 0; i < written.size(); ++i) {
      const std::string dir = base + "_" + std::to_string(i);
      std::filesystem::remove_all(dir);
      const std::string cmd =
          "/usr/bin/python3 " + Root() + "/tools/reference/" + written[i].second + " --out " + dir + " 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
      out.push_back({written[i].first, dir, 200, written[i].first.rfind("gpt-oss", 0) != 0});
    }
    return out;
  }();
  return cases;
}

struct RemoveModels : ::testing::Environment {
  void TearDown() override {
    for (const FamilyCase& c : Families())
      if (c.dir.find("/moe_spec_") != std::string::npos) std::filesystem::remove_all(c.dir);
  }
};
const auto* const kRemoveModels = ::testing::AddGlobalTestEnvironment(new RemoveModels);

std::unique_ptr<Engine> Open(const std::string& dir, SpeculativeMode mode, bool deterministic, int draft_tokens = 4) {
  EngineOptions o;
  o.deterministic = deterministic;
  o.speculative = mode;
  o.draft_tokens = draft_tokens;
  o.cache_tokens = 1 << 12;
  o.block_tokens = 4;
  auto e = Engine::Open(dir, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

// Prompt tokens: a "sentence" of 12 ids, noise, the sentence again (the
// lookup has something to copy), more noise, then the sentence's first 4.
std::vector<int> RepeatingPrompt(int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(3, vocab - 1);
  std::vector<int> sentence(12), prompt;
  for (int& t : sentence) t = id(rng);
  for (int i = 0; i < 5; ++i) prompt.push_back(id(rng));
  prompt.insert(prompt.end(), sentence.begin(), sentence.end());
  for (int i = 0; i < 7; ++i) prompt.push_back(id(rng));
  prompt.insert(prompt.end(), sentence.begin(), sentence.end());
  for (int i = 0; i < 3; ++i) prompt.push_back(id(rng));
  prompt.insert(prompt.end(), sentence.begin(), sentence.begin() + 4);
  return prompt;
}

Trace RunOne(Engine& e, GenerationRequest r) {
  auto id = e.Submit(std::move(r));
  EXPECT_TRUE(id) << id.error().ToString();
  if (!id) return {};
  return Drain(e)[*id];
}

// The grammar forces the sentence's continuation for 6 tokens, then 2
// tokens that differ from what the prompt's copy says, then the sentence's
// last tokens: lookup drafts are wholly accepted, cut short in the middle
// (the rollback), and refused at once. Deterministic mode: the logprobs (of
// the model's own logits, before the mask) are the same bits as without
// speculation, so every layer's state after each rollback is exact.
TEST(SpeculativeEngine, RollbackIsExactOnEveryFamily) {
  for (const FamilyCase& fc : Families()) {
    SCOPED_TRACE(fc.name);
    const std::vector<int> prompt = RepeatingPrompt(fc.vocab, 3);
    const std::vector<int> sentence(prompt.begin() + 5, prompt.begin() + 17);
    std::vector<int> forced(sentence.begin() + 4, sentence.begin() + 10);  // accepted drafts
    forced.push_back(sentence[10] == 100 ? 101 : 100);                           // the copy says sentence[10]
    forced.push_back(sentence[11] == 100 ? 101 : 100);
    forced.insert(forced.end(), sentence.begin(), sentence.end());  // the sentence from its start
    auto request = [&] {
      GenerationRequest r;
      r.prompt = prompt;
      r.max_tokens = static_cast<int>(forced.size());
      r.sampling.temperature = 0;
      r.logprobs = 5;
      r.stop_tokens = {fc.vocab + 7};
      r.controller = std::make_shared<test_support::ForcedTokens>(forced);
      return r;
    };
    auto off = Open(fc.dir, SpeculativeMode::kOff, fc.deterministic);
    auto on = Open(fc.dir, SpeculativeMode::kLookup, fc.deterministic);
    ASSERT_TRUE(off && on);
    const Trace plain = RunOne(*off, request());
    const Trace drafted = RunOne(*on, request());
    EXPECT_EQ(plain.error, "");
    EXPECT_EQ(drafted.error, "");
    EXPECT_EQ(plain.tokens, forced);
    EXPECT_EQ(drafted.tokens, forced);
    ExpectSameLogprobs(fc, drafted.logprobs, plain.logprobs);
    const DraftCounts counts = on->Metrics().drafts_lookup;
    EXPECT_GT(counts.accepted, 0u);
    EXPECT_GT(counts.proposed, counts.accepted) << "some draft must have been cut short";
    EXPECT_LT(counts.drafts, forced.size()) << "the drafts must have saved passes";
    EXPECT_EQ(drafted.usage.completion_tokens, plain.usage.completion_tokens);
  }
}

// Free-running greedy decode, deterministic mode: the same tokens and
// log-probabilities with lookup drafts as without, on prompts whose own
// repetitions the model tends to continue.
TEST(SpeculativeEngine, GreedyTokensUnchangedOnEveryFamily) {
  for (const FamilyCase& fc : Families()) {
    SCOPED_TRACE(fc.name);
    auto off = Open(fc.dir, SpeculativeMode::kOff, fc.deterministic);
    auto on = Open(fc.dir, SpeculativeMode::kAuto, fc.deterministic, 3);
    ASSERT_TRUE(off && on);
    for (uint64_t seed : {1, 2}) {
      GenerationRequest r;
      r.prompt = RepeatingPrompt(fc.vocab, seed);
      r.max_tokens = 24;
      r.sampling.temperature = 0;
      r.logprobs = 2;
      r.stop_tokens = {fc.vocab + 7};
      const Trace plain = RunOne(*off, r);
      const Trace drafted = RunOne(*on, r);
      EXPECT_EQ(drafted.tokens, plain.tokens) << "seed " << seed;
      ExpectSameLogprobs(fc, drafted.logprobs, plain.logprobs);
    }
  }
}

// Without deterministic mode, one sequence alone: a verification runs its
// rows as decode steps do (attention query by query, DeltaNet recurrent, the
// products' decode row tiles), so its tokens and log-probabilities are the
// same bits as plain decode's on the graph's families.
TEST(SpeculativeEngine, OneSequenceGetsTheSameBitsWithoutDeterministicMode) {
  for (const FamilyCase& fc : Families()) {
    if (!fc.deterministic) continue;  // gpt-oss: its own forward pass, checked to rounding above
    SCOPED_TRACE(fc.name);
    auto off = Open(fc.dir, SpeculativeMode::kOff, false);
    auto on = Open(fc.dir, SpeculativeMode::kLookup, false);
    ASSERT_TRUE(off && on);
    const std::vector<int> prompt = RepeatingPrompt(fc.vocab, 3);
    const std::vector<int> sentence(prompt.begin() + 5, prompt.begin() + 17);
    std::vector<int> forced(sentence.begin() + 4, sentence.end());
    forced.insert(forced.end(), sentence.begin(), sentence.end());
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = static_cast<int>(forced.size());
    r.sampling.temperature = 0;
    r.logprobs = 5;
    r.stop_tokens = {fc.vocab + 7};
    r.controller = std::make_shared<test_support::ForcedTokens>(forced);
    GenerationRequest r2 = r;
    r2.controller = std::make_shared<test_support::ForcedTokens>(forced);
    const Trace plain = RunOne(*off, r);
    const Trace drafted = RunOne(*on, r2);
    EXPECT_EQ(drafted.tokens, plain.tokens);
    EXPECT_TRUE(SameBits(drafted.logprobs, plain.logprobs)) << "log-probabilities differ";
    EXPECT_GT(on->Metrics().drafts_lookup.accepted, 0u);
  }
}

// A draft whose first token the grammar refuses: refused, the sequence goes
// on with the grammar's token, and no draft token is ever emitted.
TEST(SpeculativeEngine, AGrammarThatRefusesTheDraftEndsIt) {
  const FamilyCase& fc = Families()[0];
  const std::vector<int> prompt = RepeatingPrompt(fc.vocab, 4);
  const std::vector<int> sentence(prompt.begin() + 5, prompt.begin() + 17);
  // The sentence's next token (the suffix now matches the prompt's copies,
  // which propose the sentence's rest), then ids the prompt never uses (it
  // draws below 200), none twice: the grammar refuses the copy's first token.
  std::vector<int> forced{sentence[4]};
  for (int i = 0; i < 5; ++i) forced.push_back(200 + i);
  auto on = Open(fc.dir, SpeculativeMode::kLookup, false);
  ASSERT_TRUE(on);
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = static_cast<int>(forced.size());
  r.sampling.temperature = 0;
  r.stop_tokens = {fc.vocab + 7};
  r.controller = std::make_shared<test_support::ForcedTokens>(forced);
  const Trace t = RunOne(*on, r);
  EXPECT_EQ(t.tokens, forced);
  const DraftCounts counts = on->Metrics().drafts_lookup;
  EXPECT_EQ(counts.drafts, 1u) << "the prompt's copy must have been proposed once";
  EXPECT_GT(counts.proposed, 0u);
  EXPECT_EQ(counts.accepted, 0u);
}

// Usage counts emitted tokens, not drafts; max_tokens holds with drafts
// longer than the room left; a stop token inside an accepted draft ends
// the sequence there.
TEST(SpeculativeEngine, MaxTokensAndStopsHoldInsideADraft) {
  const FamilyCase& fc = Families()[0];
  const std::vector<int> prompt = RepeatingPrompt(fc.vocab, 5);
  const std::vector<int> sentence(prompt.begin() + 5, prompt.begin() + 17);
  const std::vector<int> forced(sentence.begin() + 4, sentence.end());
  for (int max_tokens : {1, 2, 3, 5}) {
    auto on = Open(fc.dir, SpeculativeMode::kLookup, false);
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.stop_tokens = {fc.vocab + 7};
    r.controller = std::make_shared<test_support::ForcedTokens>(forced);
    const Trace t = RunOne(*on, r);
    EXPECT_EQ(t.tokens, std::vector<int>(forced.begin(), forced.begin() + max_tokens));
    EXPECT_EQ(t.usage.completion_tokens, max_tokens);
  }
  auto on = Open(fc.dir, SpeculativeMode::kLookup, false);
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = 8;
  r.sampling.temperature = 0;
  r.stop_tokens = {forced[2]};  // the third token of the copy
  r.controller = std::make_shared<test_support::ForcedTokens>(forced);
  const Trace t = RunOne(*on, r);
  EXPECT_EQ(t.tokens, std::vector<int>(forced.begin(), forced.begin() + 3));
  EXPECT_EQ(t.usage.completion_tokens, 3);
}

// Above speculative_max_batch decoding sequences no step drafts.
TEST(SpeculativeEngine, TheSchedulerSwitchesDraftsOffForALargeBatch) {
  const FamilyCase& fc = Families()[0];
  EngineOptions o;
  o.speculative = SpeculativeMode::kLookup;
  o.speculative_max_batch = 2;
  o.cache_tokens = 1 << 12;
  o.block_tokens = 4;
  auto run = [&](int sequences) {
    auto e = Engine::Open(fc.dir, o);
    EXPECT_TRUE(e);
    for (int i = 0; i < sequences; ++i) {
      GenerationRequest r;
      r.prompt = RepeatingPrompt(fc.vocab, 9);
      r.max_tokens = 6;
      r.sampling.temperature = 0;
      r.stop_tokens = {fc.vocab + 7};
      const std::vector<int> sentence(r.prompt.begin() + 5, r.prompt.begin() + 17);
      r.controller = std::make_shared<test_support::ForcedTokens>(std::vector<int>(sentence.begin() + 4, sentence.end()));
      EXPECT_TRUE((*e)->Submit(std::move(r)));
    }
    Drain(**e);
    return (*e)->Metrics().drafts_lookup.drafts;
  };
  EXPECT_GT(run(2), 0u);
  EXPECT_EQ(run(3), 0u);
}

// A generated moe-dsa-v1 model with an MTP module (moe-model-gen --mtp 1).
const std::string& MtpModel() {
  static std::string dir = [] {
    std::string d = TempPath("spec_mtp");
    std::filesystem::remove_all(d);
    ModelGenOptions o;
    o.config = *PresetConfig("tiny");
    o.config.dsa.index_topk = 16;
    o.config.num_nextn_predict_layers = 1;
    o.seed = 4;
    auto st = GenerateModel(o, d);
    EXPECT_TRUE(st) << st.error().ToString();
    return d;
  }();
  return dir;
}

// MTP drafts (random weights: few are accepted), and auto with both kinds:
// the same greedy tokens and log-probabilities, bit for bit, as without;
// the drafts are counted by kind.
TEST(SpeculativeEngine, MtpDraftsLeaveGreedyOutputUnchanged) {
  auto off = Open(MtpModel(), SpeculativeMode::kOff, true);
  auto mtp = Open(MtpModel(), SpeculativeMode::kMtp, true, 2);
  auto both = Open(MtpModel(), SpeculativeMode::kAuto, true, 3);
  ASSERT_TRUE(off && mtp && both);
  for (uint64_t seed : {1, 2}) {
    GenerationRequest r;
    r.prompt = RepeatingPrompt(200, seed);
    r.max_tokens = 20;
    r.sampling.temperature = 0;
    r.logprobs = 2;
    r.stop_tokens = {207};
    const Trace plain = RunOne(*off, r);
    const Trace by_mtp = RunOne(*mtp, r);
    const Trace by_both = RunOne(*both, r);
    EXPECT_EQ(by_mtp.tokens, plain.tokens);
    EXPECT_EQ(by_both.tokens, plain.tokens);
    EXPECT_TRUE(SameBits(by_mtp.logprobs, plain.logprobs));
    EXPECT_TRUE(SameBits(by_both.logprobs, plain.logprobs));
  }
  EXPECT_GT(mtp->Metrics().drafts_mtp.proposed, 0u);
  EXPECT_EQ(mtp->Metrics().drafts_lookup.proposed, 0u);
  EXPECT_GT(both->Metrics().drafts_mtp.proposed + both->Metrics().drafts_lookup.proposed, 0u);
}

// Sampled requests run with drafts: tokens in range, usage as emitted.
TEST(SpeculativeEngine, SampledRequestsRunWithDrafts) {
  auto e = Open(MtpModel(), SpeculativeMode::kAuto, false, 4);
  ASSERT_TRUE(e);
  GenerationRequest r;
  r.prompt = RepeatingPrompt(200, 6);
  r.max_tokens = 30;
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 3;
  r.stop_tokens = {207};
  const Trace t = RunOne(*e, r);
  EXPECT_EQ(t.error, "");
  EXPECT_EQ(static_cast<int>(t.tokens.size()), t.usage.completion_tokens);
  EXPECT_GT(t.usage.completion_tokens, 0);
  for (int tok : t.tokens) EXPECT_LT(tok, 268);
}

TEST(SpeculativeEngine, MtpWithoutMtpLayersIsRefusedClearly) {
  EngineOptions o;
  o.speculative = SpeculativeMode::kMtp;
  auto e = Engine::Open(Families()[0].dir, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("multi-token-prediction"), std::string::npos) << e.error().message();
  o.speculative = SpeculativeMode::kOff;
  auto plain = Engine::Open(Families()[0].dir, o);
  ASSERT_TRUE(plain);
  GenerationRequest r;
  r.prompt = {5, 6, 7};
  r.speculative = SpeculativeMode::kMtp;
  auto id = (*plain)->Submit(r);
  ASSERT_FALSE(id);
  EXPECT_NE(id.error().message().find("'mtp'"), std::string::npos) << id.error().message();
  o.draft_tokens = 5;
  EXPECT_FALSE(Engine::Open(Families()[0].dir, o));
}

}  // namespace
}  // namespace moeserve::engine
