// The gpt-oss family on the serving Engine (engine.hpp, gpt_oss_model.hpp) on
// a tiny random gpt-oss checkpoint written by tools/reference/gpt_oss.py:
// sequences run together, with chunked prefill and a queue, emit exactly the
// tokens of the single-sequence greedy loop over GptOssModel, with or without
// the block prefix cache (per tenant, and the public prefix for all);
// analysis tokens count as reasoning and the thinking budget closes them
// into a final message; stops, cancels, controller faults and refused
// submissions; logprobs against a log-softmax of the model's own logits (and
// their cost, printed).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>
#include <unistd.h>

#include "gpt_oss_solo.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"

namespace moeserve::engine {
namespace {

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

// Two layers, one banded with a window of 4: prompts here are longer than
// twice the window, so the banded cache is trimmed while they run.
const std::string& ModelDir() {
  static std::string dir = [] {
    std::string d = ::testing::TempDir() + "/moe_gptoss_engine_" + std::to_string(::getpid());
    std::filesystem::remove_all(d);
    std::string cmd = "/usr/bin/python3 " + Root() + "/tools/reference/gpt_oss.py write --out " + d +
                      " --layers 2 --window 4 --seed 5 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

// The checkpoint (about 100 MB) goes when the tests end.
struct RemoveModel : ::testing::Environment {
  void TearDown() override { std::filesystem::remove_all(ModelDir()); }
};
const auto* const kRemoveModel = ::testing::AddGlobalTestEnvironment(new RemoveModel);

// Prefix-cache blocks of 4 tokens, so that the short prompts here share some.
EngineOptions Options() {
  EngineOptions o;
  o.block_tokens = 4;
  o.cache_tokens = 4096;
  return o;
}

std::unique_ptr<Engine> NewEngine(EngineOptions o = Options()) {
  auto e = Engine::Open(ModelDir(), o);
  if (!e) {
    ADD_FAILURE() << e.error().ToString();
    return nullptr;
  }
  return std::move(*e);
}

// One engine without the prefix cache, shared by the tests that need no
// particular options (a load is most of a test's time).
Engine& SharedPlain() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions o = Options();
    o.prefix_cache = false;
    return NewEngine(o);
  }();
  return *e;
}

const HarmonyChatHooks& Hooks(const Engine& e) { return static_cast<const HarmonyChatHooks&>(e.chat()); }

std::vector<int> Prompt(int n, int salt) {
  std::vector<int> p;
  uint64_t s = 1000 + static_cast<uint64_t>(salt);
  while (static_cast<int>(p.size()) < n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p.push_back(static_cast<int>((s >> 33) % 150000));
  }
  return p;
}

// Runs the engine until idle; every event by sequence.
std::map<SequenceId, std::vector<TokenEvent>> Drain(Engine& e, int max_steps = 500) {
  std::map<SequenceId, std::vector<TokenEvent>> out;
  for (int i = 0; i < max_steps && e.HasWork(); ++i)
    for (auto& ev : e.Step()) out[ev.id].push_back(ev);
  EXPECT_FALSE(e.HasWork());
  return out;
}

std::vector<int> Tokens(const std::vector<TokenEvent>& events) {
  std::vector<int> t;
  for (const auto& e : events)
    if (e.token >= 0) t.push_back(e.token);
  return t;
}

// Masks the harmony control tokens and the rest of the reserved range, so that
// a random model writes only text.
class TextOnly : public DecodeController {
 public:
  void Mask(std::span<float> logits) override {
    for (size_t i = 199998; i < logits.size(); ++i) logits[i] = -std::numeric_limits<float>::infinity();
  }
};

TEST(GptOssServing, ConcurrentSequencesEmitTheSingleSequenceGreedyTokens) {
  EngineOptions o = Options();
  o.prefix_cache = false;  // every block goes back to the pool at the end
  o.max_running = 2;  // the third waits for a slot
  o.prefill_chunk_tokens = 7;
  auto e = NewEngine(o);
  ASSERT_TRUE(e);
  const int vocab = Hooks(*e).tokenizer().vocab_size();
  auto model = GptOssModel::Load(ModelDir());
  ASSERT_TRUE(model) << model.error().ToString();
  const std::vector<std::vector<int>> prompts = {Prompt(5, 1), Prompt(23, 2), Prompt(17, 3)};
  const int decode = 9;
  std::vector<SequenceId> ids;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = decode;
    r.sampling.temperature = 0;
    r.stop_tokens = {-1};  // none: run to max_tokens
    auto id = e->Submit(r);
    ASSERT_TRUE(id) << id.error().ToString();
    ids.push_back(*id);
  }
  EXPECT_EQ(e->Metrics().waiting, 3);
  auto events = Drain(*e);
  for (size_t i = 0; i < prompts.size(); ++i) {
    // The reference: one sequence, whole prompt, greedy over the tokenizer's ids.
    SoloSequence st(**model);
    std::vector<float> logits;
    std::vector<int> want;
    ASSERT_TRUE(st.Forward(prompts[i], false, &logits));
    for (int k = 0; k < decode; ++k) {
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
      want.push_back(next);
      ASSERT_TRUE(st.Forward(std::vector<int>{next}, false, &logits));
    }
    const auto& ev = events[ids[i]];
    EXPECT_EQ(Tokens(ev), want) << "sequence " << i;
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.back().finish, FinishReason::kLength);
    EXPECT_EQ(ev.back().usage.prompt_tokens, static_cast<int>(prompts[i].size()));
    EXPECT_EQ(ev.back().usage.completion_tokens, decode);
    EXPECT_EQ(ev.back().usage.reasoning_tokens, 0);  // the prompts open no analysis message
  }
  EXPECT_EQ(e->Metrics().running, 0);
  EXPECT_EQ(e->Metrics().cache_usage_ratio, 0.0);
}

// Sampling reuses the engine's sampler: a seed fixes the tokens, another seed
// draws others.
// A long prompt alone is prefilled in blocks of the family's
// idle_prefill_rows (512), not in one prefill_chunk_tokens_idle (2048) call:
// 1,100 tokens take three steps (512, 512, 76) before the first token.
TEST(GptOssServing, LongPromptAlonePrefillsInBlocksOfTheFamilysRows) {
  Engine& e = SharedPlain();
  ASSERT_EQ(e.family_model().idle_prefill_rows(), 512);
  GenerationRequest r;
  r.prompt = Prompt(1100, 9);
  r.max_tokens = 1;
  r.sampling.temperature = 0;
  r.stop_tokens = {-1};
  ASSERT_TRUE(e.Submit(r));
  int steps = 0, tokens = 0;
  while (e.HasWork() && tokens == 0 && steps < 10) {
    ++steps;
    for (const auto& ev : e.Step()) tokens += ev.token >= 0;
  }
  EXPECT_EQ(tokens, 1);
  EXPECT_EQ(steps, 3);
  Drain(e);
}

TEST(GptOssServing, SeededSampling) {
  Engine& e = SharedPlain();
  auto run = [&](uint64_t seed) {
    GenerationRequest r;
    r.prompt = Prompt(12, 6);
    r.max_tokens = 12;
    r.sampling.temperature = 1.5f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = seed;
    r.stop_tokens = {-1};
    auto id = e.Submit(r);
    EXPECT_TRUE(id);
    return Tokens(Drain(e)[*id]);
  };
  const auto a = run(7);
  EXPECT_EQ(a.size(), 12u);
  EXPECT_EQ(run(7), a);
  EXPECT_NE(run(8), a);

}

// The block prefix cache: a prompt that extends an earlier one prefills only
// what its cached whole blocks do not hold, and emits what an engine without
// the cache emits.
TEST(GptOssServing, PrefixCacheServesExtensionsWithTheSameTokens) {
  auto run = [](Engine& e, const std::vector<int>& prompt) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 5;
    r.sampling.temperature = 0;
    r.stop_tokens = {-1};
    auto id = e.Submit(r);
    EXPECT_TRUE(id);
    return Drain(e)[*id];
  };
  // 21 tokens: the cache keeps the first 20 (five whole blocks), leaving one to compute.
  const std::vector<int> first = Prompt(21, 4);
  std::vector<int> second = first;
  for (int t : Prompt(11, 5)) second.push_back(t);

  Engine* plain = &SharedPlain();
  auto cached = NewEngine();
  ASSERT_TRUE(cached);
  auto a = run(*cached, first);
  EXPECT_EQ(a.back().usage.cached_tokens, 0);
  EXPECT_EQ(cached->Metrics().prefix_cache.entries, 1);
  EXPECT_GT(cached->Metrics().prefix_cache.kv_bytes, 0);
  auto b = run(*cached, second);
  EXPECT_EQ(b.back().usage.cached_tokens, 20);
  EXPECT_EQ(cached->Metrics().prefix_hit_tokens, 20u);
  EXPECT_EQ(Tokens(b), Tokens(run(*plain, second)));
  EXPECT_EQ(Tokens(a), Tokens(run(*plain, first)));
  // A prompt that is not an extension (it differs inside the kept one) starts afresh.
  std::vector<int> other = second;
  other[3] += 1;
  auto c = run(*cached, other);
  EXPECT_EQ(c.back().usage.cached_tokens, 0);
  EXPECT_EQ(Tokens(c), Tokens(run(*plain, other)));

  // A bound smaller than one entry keeps nothing.
  EngineOptions tiny = Options();
  tiny.prefix_cache_bytes = 1000;
  auto small = NewEngine(tiny);
  ASSERT_TRUE(small);
  run(*small, first);
  EXPECT_EQ(run(*small, second).back().usage.cached_tokens, 0);
  EXPECT_EQ(small->Metrics().prefix_cache.entries, 0);
  EXPECT_GE(small->Metrics().prefix_cache.too_large, 2u);
}

// Cached prefixes are per tenant: another tenant's extension of a cached
// prompt starts afresh (its cached_tokens would tell it the prompt was
// sent); the blocks of a public prefix are kept for every tenant.
TEST(GptOssServing, PrefixesAreReusedOnlyByTheirTenantExceptThePublicPrefix) {
  auto e = NewEngine();
  ASSERT_TRUE(e);
  auto cached = [&](const std::string& tenant, const std::vector<int>& prompt, int64_t public_tokens) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 2;
    r.sampling.temperature = 0;
    r.stop_tokens = {-1};
    r.tenant = tenant;
    r.public_prefix_tokens = public_tokens;
    auto id = e->Submit(r);
    EXPECT_TRUE(id);
    return Drain(*e)[*id].back().usage.cached_tokens;
  };
  const std::vector<int> first = Prompt(21, 4);
  std::vector<int> second = first;
  for (int t : Prompt(11, 5)) second.push_back(t);
  EXPECT_EQ(cached("a", first, 0), 0);
  EXPECT_EQ(cached("b", second, 0), 0);   // a's state is a's
  EXPECT_EQ(cached("a", second, 0), 20);  // a's extension hits
  // 12 public tokens: kept once for everyone, whoever sent them first.
  std::vector<int> pub = Prompt(12, 6), mine = pub, theirs = pub;
  for (int t : Prompt(9, 7)) mine.push_back(t);
  for (int t : Prompt(9, 8)) theirs.push_back(t);
  EXPECT_EQ(cached("a", mine, 12), 0);
  EXPECT_EQ(cached("b", theirs, 12), 12);
  EXPECT_EQ(cached("c", theirs, 0), 0);  // not marked public: nothing of another tenant's
}

TEST(GptOssServing, AnalysisIsReasoningAndTheBudgetOpensTheFinalAnswer) {
  Engine* e = &SharedPlain();
  const HfTokenizer& tok = Hooks(*e).tokenizer();
  auto prompt = tok.Encode("<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>analysis<|message|>",
                           AddedTokenText::kMatchAll);
  ASSERT_TRUE(prompt);
  GenerationRequest r;
  r.prompt = *prompt;
  r.max_tokens = 14;
  r.sampling.temperature = 0;
  r.thinking_budget = 3;
  r.controller = std::make_shared<TextOnly>();
  auto id = e->Submit(r);
  ASSERT_TRUE(id);
  auto ev = Drain(*e)[*id];
  ASSERT_EQ(Tokens(ev).size(), 14u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(ev[i].reasoning) << i;
    EXPECT_FALSE(ev[i].forced) << i;
  }
  const auto close = *tok.Encode("<|end|><|start|>assistant<|channel|>final<|message|>", AddedTokenText::kMatchAll);
  for (size_t i = 0; i < close.size(); ++i) {
    EXPECT_EQ(ev[3 + i].token, close[i]) << i;
    EXPECT_TRUE(ev[3 + i].forced) << i;
    EXPECT_FALSE(ev[3 + i].reasoning) << i;
  }
  for (size_t i = 3 + close.size(); i < 14; ++i) EXPECT_FALSE(ev[i].reasoning) << i;  // the final answer
  EXPECT_EQ(ev.back().usage.reasoning_tokens, 3);
  EXPECT_EQ(ev.back().finish, FinishReason::kLength);
}

// Forces <|return|> after the first token: a forced stop token ends the sequence.
class ReturnAfterOne : public TextOnly {
 public:
  explicit ReturnAfterOne(int ret) : ret_(ret) {}
  std::vector<int> OnToken(int) override { return done_++ ? std::vector<int>{} : std::vector<int>{ret_}; }

 private:
  int ret_, done_ = 0;
};

class Throws : public DecodeController {
 public:
  void Mask(std::span<float>) override { throw std::runtime_error("mask exploded"); }
};

TEST(GptOssServing, StopsCancelsAndFaultsTouchOnlyTheirSequence) {
  Engine* e = &SharedPlain();
  GenerationRequest base;
  base.prompt = Prompt(6, 9);
  base.max_tokens = 30;
  base.sampling.temperature = 0;

  GenerationRequest stop = base;
  stop.controller = std::make_shared<ReturnAfterOne>(Hooks(*e).harmony_tokens().return_);
  GenerationRequest faulty = base;
  faulty.controller = std::make_shared<Throws>();
  GenerationRequest cancelled = base;
  GenerationRequest plain = base;
  plain.max_tokens = 4;
  plain.controller = std::make_shared<TextOnly>();
  auto s = e->Submit(stop), f = e->Submit(faulty), c = e->Submit(cancelled), p = e->Submit(plain);
  ASSERT_TRUE(s && f && c && p);
  e->Cancel(*c);
  auto ev = Drain(*e);

  EXPECT_EQ(ev[*s].back().finish, FinishReason::kStop);
  EXPECT_EQ(Tokens(ev[*s]).size(), 2u);
  EXPECT_EQ(Tokens(ev[*s]).back(), Hooks(*e).harmony_tokens().return_);
  EXPECT_EQ(ev[*s].back().usage.completion_tokens, 2);

  EXPECT_EQ(ev[*f].back().finish, FinishReason::kError);
  EXPECT_NE(ev[*f].back().error.find("mask exploded"), std::string::npos) << ev[*f].back().error;

  ASSERT_EQ(ev[*c].size(), 1u);
  EXPECT_EQ(ev[*c][0].finish, FinishReason::kCancelled);

  EXPECT_EQ(ev[*p].back().finish, FinishReason::kLength);
  EXPECT_EQ(Tokens(ev[*p]).size(), 4u);
}

// log_softmax over the tokenizer's ids of one row of logits, in double.
std::vector<double> LogSoftmax(const std::vector<float>& row, int ids) {
  double mx = *std::max_element(row.begin(), row.begin() + ids), sum = 0;
  for (int i = 0; i < ids; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
  std::vector<double> out(static_cast<size_t>(ids));
  for (int i = 0; i < ids; ++i) out[static_cast<size_t>(i)] = row[i] - mx - std::log(sum);
  return out;
}

TEST(GptOssServing, LogprobsOnlyWhenAskedAndAsTheModelsLogSoftmax) {
  Engine& e = SharedPlain();
  const int vocab = Hooks(e).tokenizer().vocab_size();
  GenerationRequest base;
  base.prompt = Prompt(10, 11);
  base.max_tokens = 6;
  base.stop_tokens = {-1};
  // Temperature, top-p and the controller's mask change what is sampled, never the reported values.
  base.sampling.temperature = 1.3f;
  base.sampling.top_p = 0.8f;
  base.sampling.seed = 4;
  base.controller = std::make_shared<TextOnly>();
  GenerationRequest asked = base, bare = base, none = base;
  asked.logprobs = 5;
  bare.logprobs = 0;
  auto a = e.Submit(asked), b = e.Submit(bare), n = e.Submit(none);
  ASSERT_TRUE(a && b && n);
  auto ev = Drain(e);
  const auto tokens = Tokens(ev[*a]);
  ASSERT_EQ(tokens.size(), 6u);
  // Asking changes nothing about what is sampled.
  EXPECT_EQ(Tokens(ev[*b]), tokens);
  EXPECT_EQ(Tokens(ev[*n]), tokens);
  for (const auto& x : ev[*n]) {
    EXPECT_FALSE(x.logprob.has_value());
    EXPECT_TRUE(x.top_logprobs.empty());
  }
  for (const auto& x : ev[*b]) {
    EXPECT_TRUE(x.logprob.has_value());
    EXPECT_TRUE(x.top_logprobs.empty());  // 0 alternatives: the sampled token's only
  }

  // The reference: the same tokens through the model, one at a time.
  auto model = GptOssModel::Load(ModelDir());
  ASSERT_TRUE(model) << model.error().ToString();
  SoloSequence st(**model);
  std::vector<float> logits;
  ASSERT_TRUE(st.Forward(base.prompt, false, &logits));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto want = LogSoftmax(logits, vocab);
    const TokenEvent& got = ev[*a][i];
    ASSERT_TRUE(got.logprob.has_value()) << i;
    EXPECT_NEAR(*got.logprob, want[static_cast<size_t>(tokens[i])], 2e-3) << i;
    EXPECT_NEAR(*ev[*b][i].logprob, *got.logprob, 1e-6) << i;
    std::vector<int> order(want.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int x, int y) { return want[x] > want[y]; });
    ASSERT_EQ(got.top_logprobs.size(), 5u) << i;
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(got.top_logprobs[k].token, order[k]) << i << "/" << k;
      EXPECT_NEAR(got.top_logprobs[k].logprob, want[static_cast<size_t>(order[k])], 2e-3) << i << "/" << k;
      if (k > 0) {
        EXPECT_GE(got.top_logprobs[k - 1].logprob, got.top_logprobs[k].logprob) << i << "/" << k;
      }
    }
    ASSERT_TRUE(st.Forward(std::vector<int>{tokens[i]}, false, &logits));
  }

  // Forced tokens (a controller's, the thinking budget's) carry none.
  GenerationRequest forced = base;
  forced.logprobs = 3;
  forced.stop_tokens = {};  // the defaults: <|return|> stops
  forced.controller = std::make_shared<ReturnAfterOne>(Hooks(e).harmony_tokens().return_);
  auto f = e.Submit(forced);
  ASSERT_TRUE(f);
  auto fev = Drain(e)[*f];
  ASSERT_EQ(Tokens(fev).size(), 2u);
  EXPECT_FALSE(fev[0].forced);
  EXPECT_TRUE(fev[0].logprob.has_value());
  EXPECT_EQ(fev[0].top_logprobs.size(), 3u);
  EXPECT_TRUE(fev[1].forced);
  EXPECT_EQ(fev[1].token, Hooks(e).harmony_tokens().return_);
  EXPECT_FALSE(fev[1].logprob.has_value());
  EXPECT_TRUE(fev[1].top_logprobs.empty());

  // Out of range: refused, naming the field.
  for (int bad : {-2, 21}) {
    GenerationRequest r = base;
    r.logprobs = bad;
    auto id = e.Submit(r);
    ASSERT_FALSE(id) << bad;
    EXPECT_EQ(id.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(id.error().message().find("logprobs"), std::string::npos) << id.error().message();
  }
}

// What asking costs: decode tokens/s with and without logprobs (20
// alternatives), printed for the record; not an assertion (no wall-clock asserts).
TEST(GptOssServing, LogprobsCostIsPrinted) {
  Engine& e = SharedPlain();
  auto rate = [&](int logprobs) {
    GenerationRequest r;
    r.prompt = Prompt(8, 12);
    r.max_tokens = 48;
    r.stop_tokens = {-1};
    r.sampling.temperature = 0;
    r.logprobs = logprobs;
    auto id = e.Submit(r);
    EXPECT_TRUE(id);
    e.Step();  // admission, the prefill and the first token: untimed
    const auto t0 = std::chrono::steady_clock::now();
    int decoded = 0;
    while (e.HasWork())
      for (const auto& ev : e.Step()) decoded += ev.token >= 0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return decoded / s;
  };
  rate(-1);  // warm-up
  const double off = rate(-1), on = rate(20), on0 = rate(0);
  std::cout << "gpt-oss tiny decode: " << off << " tokens/s without logprobs, " << on0 << " with logprobs (0 alternatives), "
            << on << " with top_logprobs 20\n";
  EXPECT_GT(off, 0);
}

TEST(GptOssServing, RefusedSubmissionsSayWhy) {
  EngineOptions o = Options();
  o.max_context = 64;
  o.max_waiting = 1;
  auto e = NewEngine(o);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->max_context(), 64);
  GenerationRequest r;
  r.max_tokens = 4;
  auto empty = e->Submit(r);
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code(), ErrorCode::kInvalidArgument);

  r.prompt = {1, 2, e->family_model().vocab_size()};
  auto oov = e->Submit(r);
  ASSERT_FALSE(oov);
  EXPECT_EQ(oov.error().code(), ErrorCode::kInvalidArgument);

  r.prompt = Prompt(61, 1);
  auto too_long = e->Submit(r);
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(too_long.error().message().find("64"), std::string::npos) << too_long.error().message();

  r.prompt = Prompt(8, 1);
  ASSERT_TRUE(e->Submit(r));
  auto full = e->Submit(r);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code(), ErrorCode::kResourceExhausted);
}

TEST(GptOssServing, LoadRefusesANonHarmonyTokenizer) {
  const std::string dir = ::testing::TempDir() + "/moe_gptoss_engine_notok_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::copy(ModelDir(), dir);
  // A tokenizer.json without harmony's control tokens (a plain BPE with two tokens).
  {
    std::ofstream f(dir + "/tokenizer.json");
    f << R"({"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
           "post_processor":null,"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}})";
  }
  auto e = Engine::Open(dir, Options());
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("harmony"), std::string::npos) << e.error().message();
}

}  // namespace
}  // namespace moeserve::engine
