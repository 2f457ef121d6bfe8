// Qwen3-Next (Hugging Face layout) against the fp32 PyTorch reference
// (tools/reference/families/qwen3_next.py) on a tiny random checkpoint in the
// published layout: logits within model.md section 10's CPU bound, greedy
// ids, the chunked and recurrent DeltaNet forms, prefill split across calls,
// the prefix cache's reuse of DeltaNet state, and config errors naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "families/qwen3_next/config.hpp"
#include "families/qwen3_next/graph.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/qwen3_next_info.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using testing_util::TempPath;

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

std::string Script() { return Root() + "/tools/reference/families/qwen3_next.py"; }

// A prompt longer than the DeltaNet chunk (32), so that the chunked form runs
// over more than one chunk.
const std::vector<int> kPrompt = {4000, 872, 198, 970, 0, 5, 77, 1200, 33, 8, 900, 4, 61, 99, 100, 101, 102, 103, 104,
                                  105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121,
                                  122, 123, 3000, 4095};
constexpr int kDecode = 8;

struct Fixture {
  std::string model;
  std::vector<int> tokens, greedy;
  std::vector<double> margin;
  std::vector<float> logits;
  int vocab = 0;
};

const Fixture& Shared() {
  static Fixture* f = [] {
    auto* f = new Fixture;
    f->model = TempPath("qwen3_next");
    const std::string ref = TempPath("qwen3_next_ref");
    std::filesystem::remove_all(f->model);
    std::filesystem::remove_all(ref);
    std::string ids;
    for (int t : kPrompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string write = "/usr/bin/python3 " + Script() + " write --out " + f->model + " --vocab 4096 --seed 3";
    const std::string run = "/usr/bin/python3 " + Script() + " run --model " + f->model + " --tokens " + ids +
                            " --decode " + std::to_string(kDecode) + " --out " + ref;
    if (std::system(write.c_str()) != 0 || std::system(run.c_str()) != 0) {
      ADD_FAILURE() << "the reference failed: " << write << " / " << run;
      return f;
    }
    std::ifstream in(ref + "/meta.json");
    const auto meta = nlohmann::json::parse(in);
    f->tokens = meta["tokens"].get<std::vector<int>>();
    f->greedy = meta["greedy_tokens"].get<std::vector<int>>();
    f->margin = meta["top2_margin"].get<std::vector<double>>();
    f->vocab = meta["vocab"].get<int>();
    std::ifstream lf(ref + "/logits.f32", std::ios::binary);
    f->logits.resize(f->tokens.size() * static_cast<size_t>(f->vocab));
    lf.read(reinterpret_cast<char*>(f->logits.data()), static_cast<std::streamsize>(f->logits.size() * 4));
    return f;
  }();
  return *f;
}

// All logits of the reference's token sequence, prefilled in pieces of
// `piece` tokens (each piece after the first continues the cached state).
std::vector<float> EngineLogits(const Model& m, const std::vector<int>& tokens, int piece) {
  KvPool pool(64, 16, m.cache_floats_per_token());
  SequenceCache cache = m.NewSequence();
  std::vector<float> all;
  for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(piece)) {
    const size_t n = std::min(tokens.size() - at, static_cast<size_t>(piece));
    EXPECT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(at + n)));
    ForwardSegment seg{&cache, std::span<const int>(tokens.data() + at, n), true};
    std::vector<float> logits;
    auto st = m.Forward(pool, std::span<ForwardSegment>(&seg, 1), &logits);
    EXPECT_TRUE(st) << st.error().ToString();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  ReleaseBlocks(pool, cache);
  return all;
}

void ExpectClose(const Fixture& f, const std::vector<float>& got, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), f.logits.size()) << what;
  const size_t V = static_cast<size_t>(f.vocab);
  for (size_t p = 0; p < f.tokens.size(); ++p) {
    double mx = 0, err = 0;
    for (size_t j = 0; j < V; ++j) {
      mx = std::max(mx, std::fabs(static_cast<double>(f.logits[p * V + j])));
      err = std::max(err, std::fabs(static_cast<double>(got[p * V + j]) - f.logits[p * V + j]));
    }
    ASSERT_LE(err, rel * mx) << what << ": position " << p;
  }
}

TEST(Qwen3Next, LogitsMatchTheReferenceInEveryForm) {
  const Fixture& f = Shared();
  ASSERT_FALSE(f.logits.empty());
  ASSERT_GT(kPrompt.size(), 32u);
  for (auto form : {DeltaForm::kChunked, DeltaForm::kRecurrent}) {
    ModelOptions o;
    o.kernels = KernelChoice::kReference;
    o.delta_form = form;
    auto m = qwen3_next::LoadModel(f.model, o);
    ASSERT_TRUE(m) << m.error().ToString();
    const std::string name = form == DeltaForm::kChunked ? "chunked" : "recurrent";
    // One prefill; prefill split across calls (7 does not divide the chunk);
    // and one token per call (decode steps).
    ExpectClose(f, EngineLogits(**m, f.tokens, static_cast<int>(f.tokens.size())), 1e-3, name + ", one call");
    ExpectClose(f, EngineLogits(**m, f.tokens, 7), 1e-3, name + ", pieces of 7");
    ExpectClose(f, EngineLogits(**m, f.tokens, 1), 1e-3, name + ", one token per call");
  }
  // The fast kernels (BF16 weights as stored, fp32 activations).
  auto fast = qwen3_next::LoadModel(f.model, ModelOptions{});
  ASSERT_TRUE(fast) << fast.error().ToString();
  ExpectClose(f, EngineLogits(**fast, f.tokens, static_cast<int>(f.tokens.size())), 1e-3, "fast kernels");
}

// Each key head's q and k rows are projected once, not once per value head
// that shares them (the graph repeats them per value head): the DeltaNet
// layers' projection work in the forward's own profile is that of nk key
// heads, and the logits above hold it to the reference.
TEST(Qwen3Next, DeltaNetProjectsEachKeyHeadOnce) {
  const Fixture& f = Shared();
  ASSERT_FALSE(f.logits.empty());
  auto cfg = qwen3_next::LoadConfig(f.model);
  ASSERT_TRUE(cfg) << cfg.error().ToString();
  const qwen3_next::Config& c = *cfg;
  ASSERT_LT(c.linear_k_heads, c.linear_v_heads);  // the fixture repeats key heads
  auto m = qwen3_next::LoadModel(f.model, ModelOptions{});
  ASSERT_TRUE(m) << m.error().ToString();
  const int n = static_cast<int>(f.tokens.size());
  KvPool pool(64, 16, (*m)->cache_floats_per_token());
  SequenceCache cache = (*m)->NewSequence();
  ASSERT_TRUE(EnsureBlocks(pool, cache, n));
  ForwardSegment seg{&cache, std::span<const int>(f.tokens.data(), f.tokens.size()), true};
  ForwardProfile profile;
  ForwardTrace trace;
  trace.profile = &profile;
  std::vector<float> logits;
  auto st = (*m)->Forward(pool, std::span<ForwardSegment>(&seg, 1), &logits, &trace);
  ASSERT_TRUE(st) << st.error().ToString();
  ReleaseBlocks(pool, cache);
  int delta_layers = 0;
  for (bool full : c.full_attention) delta_layers += full ? 0 : 1;
  ASSERT_GT(delta_layers, 0);
  // Rows per layer: q and k (nk dk each), v and the gate (nv dv each), a
  // and b (nv each), times D; the output projection D x nv dv.
  const double D = c.hidden_size, nk = c.linear_k_heads, nv = c.linear_v_heads, dk = c.linear_k_dim,
               dv = c.linear_v_dim;
  const auto flops = [&](double q_heads) {
    return 2.0 * n * delta_layers * (D * (2 * q_heads * dk + 2 * nv * dv + 2 * nv) + nv * dv * D);
  };
  const double got = profile.flops[static_cast<int>(LayerKind::kDelta)][static_cast<int>(ProfilePart::kProjections)];
  EXPECT_DOUBLE_EQ(got, flops(nk));
  EXPECT_LT(got, flops(nv));
}

// The published multi-token-prediction layer (mtp.fc, its norms,
// mtp.layers.0: full attention with the MoE) as the graph's MTP module
// (model.md 15), loaded with ModelOptions::mtp: a gated-GQA cache slot per
// token, drafts within the vocabulary, the same for a prefill in pieces as
// in one call (deterministic mode: bit for bit).
TEST(Qwen3Next, MultiTokenPredictionModule) {
  const Fixture& f = Shared();
  ModelOptions o;
  o.deterministic = true;
  auto plain = qwen3_next::LoadModel(f.model, o);
  o.mtp = true;
  auto m = qwen3_next::LoadModel(f.model, o);
  ASSERT_TRUE(plain && m) << (m ? plain.error().ToString() : m.error().ToString());
  EXPECT_EQ((*plain)->draft_depth(), 0);
  EXPECT_EQ((*m)->draft_depth(), Model::kMaxDraftChain);
  const GqaConfig& g = (*m)->config().gqa;
  EXPECT_EQ((*m)->config().mtp_kind, LayerKind::kGqa);
  EXPECT_EQ((*m)->cache_floats_per_token(),
            (*plain)->cache_floats_per_token() + 2 * static_cast<size_t>(g.num_kv_heads) * static_cast<size_t>(g.head_dim));
  const std::vector<int> prompt(f.tokens.begin(), f.tokens.begin() + 30);
  const auto drafts = [&](const Model& model, int piece) {
    KvPool pool(16, 16, model.cache_floats_per_token());
    SequenceCache cache = model.NewSequence();
    for (size_t at = 0; at < prompt.size(); at += static_cast<size_t>(piece)) {
      const size_t n = std::min(prompt.size() - at, static_cast<size_t>(piece));
      EXPECT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(at + n)));
      ForwardSegment seg{&cache, std::span<const int>(prompt.data() + at, n), false};
      EXPECT_TRUE(model.Forward(pool, std::span<ForwardSegment>(&seg, 1), nullptr));
    }
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + 4));
    std::vector<int> out;
    DraftSlot slot{&cache, 42, 3, &out};
    EXPECT_TRUE(model.ProposeDrafts(pool, std::span<DraftSlot>(&slot, 1)));
    ReleaseBlocks(pool, cache);
    return out;
  };
  const std::vector<int> one = drafts(**m, 30);
  ASSERT_EQ(one.size(), 3u);
  for (int t : one) EXPECT_TRUE(t >= 0 && t < (*m)->vocab_size()) << t;
  EXPECT_EQ(drafts(**m, 7), one);
  EXPECT_EQ(drafts(**m, 1), one);
}

// Greedy ids through the registry and the shared engine, equal to the
// reference's wherever its two best logits are further apart than the
// bound; then the same prompt again, served from the prefix cache (the
// DeltaNet state restored from a snapshot), with the same ids.
TEST(Qwen3Next, EngineGreedyMatchesTheReferenceAndReusesThePrefix) {
  const Fixture& f = Shared();
  ASSERT_FALSE(f.greedy.empty());
  auto family = FindFamily(f.model);
  ASSERT_TRUE(family);
  EXPECT_STREQ((*family)->name, "qwen3_next");
  EngineOptions eo;
  eo.cache_tokens = 1024;
  eo.block_tokens = 16;
  auto engine = Engine::Open(f.model, eo);
  ASSERT_TRUE(engine) << engine.error().ToString();
  std::vector<std::vector<int>> runs;
  std::vector<int> cached;
  for (int round = 0; round < 2; ++round) {
    GenerationRequest req;
    req.prompt = kPrompt;
    req.max_tokens = kDecode;
    req.sampling.temperature = 0;
    req.stop_tokens = {-1};
    ASSERT_TRUE((*engine)->Submit(req));
    std::vector<int> ids;
    while ((*engine)->HasWork())
      for (const TokenEvent& e : (*engine)->Step()) {
        ASSERT_NE(e.finish, FinishReason::kError) << e.error;
        if (e.token >= 0) ids.push_back(e.token);
        if (e.finish != FinishReason::kNone) cached.push_back(e.usage.cached_tokens);
      }
    runs.push_back(ids);
  }
  ASSERT_EQ(runs[0].size(), static_cast<size_t>(kDecode));
  EXPECT_EQ(runs[0], runs[1]);
  ASSERT_EQ(cached.size(), 2u);
  EXPECT_EQ(cached[0], 0);
  EXPECT_GT(cached[1], 0) << "the second run did not reuse the cached prefix";
  // Compared up to the first pick whose margin is within the bound.
  const size_t V = static_cast<size_t>(f.vocab);
  int checked = 0;
  for (int i = 0; i < kDecode; ++i) {
    const size_t p = kPrompt.size() - 1 + static_cast<size_t>(i);
    double mx = 0;
    for (size_t j = 0; j < V; ++j) mx = std::max(mx, std::fabs(static_cast<double>(f.logits[p * V + j])));
    if (f.margin[p] <= 2e-3 * mx) break;
    EXPECT_EQ(runs[0][static_cast<size_t>(i)], f.greedy[static_cast<size_t>(i)]) << "decode step " << i;
    ++checked;
  }
  EXPECT_GE(checked, 3) << "too few decode steps had a clear reference pick to compare";
}

// moe-model-info's summary: the layer kinds and FFNs the config gives, the
// MTP tensors counted apart.
// The experts setting asks for a format the checkpoint cannot be
// requantised to (MXFP4 blocks of 32 across a moe_intermediate_size of 48):
// refused, not ignored.
TEST(Qwen3Next, AnotherExpertFormatIsRefused) {
  const std::string odd = TempPath("qwen3_next_odd_experts");
  std::filesystem::remove_all(odd);
  std::filesystem::copy(Shared().model, odd);
  std::ifstream in(odd + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  in.close();
  cfg["moe_intermediate_size"] = 48;
  std::ofstream(odd + "/config.json") << cfg.dump();
  EngineOptions eo;
  eo.experts = ExpertFormat::kMxfp4;
  auto engine = Engine::Open(odd, eo);
  ASSERT_FALSE(engine);
  EXPECT_NE(engine.error().message().find("experts: mxfp4 requested"), std::string::npos) << engine.error().message();
  EXPECT_NE(engine.error().message().find("moe_intermediate_size 48"), std::string::npos) << engine.error().message();
}

// experts: mxfp4 requantises the published BF16 experts at load (model.md
// section 7's encoder): the routed experts take about a quarter of the
// bytes, and the logits stay near the BF16 experts' (the cost of MXFP4,
// measured and bounded here), through the registry and the engine too.
TEST(Qwen3Next, Mxfp4ExpertsStayNearTheBf16Experts) {
  const Fixture& f = Shared();
  ASSERT_FALSE(f.tokens.empty());
  ModelOptions mo;
  mo.experts = ExpertFormat::kMxfp4;
  auto bf16 = qwen3_next::LoadModel(f.model, ModelOptions{});
  auto mx = qwen3_next::LoadModel(f.model, mo);
  ASSERT_TRUE(bf16) << bf16.error().ToString();
  ASSERT_TRUE(mx) << mx.error().ToString();
  EXPECT_EQ((*mx)->config().expert_format, ExpertFormat::kMxfp4);
  // 4.25 bits per weight (codes and one scale per 32) against 16.
  EXPECT_LT((*mx)->routed_expert_bytes() * 10, (*bf16)->routed_expert_bytes() * 3)
      << (*mx)->routed_expert_bytes() << " vs " << (*bf16)->routed_expert_bytes();
  const int n = static_cast<int>(f.tokens.size());
  const std::vector<float> a = EngineLogits(**bf16, f.tokens, n), b = EngineLogits(**mx, f.tokens, n);
  const size_t V = static_cast<size_t>(f.vocab);
  ASSERT_EQ(a.size(), f.tokens.size() * V);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0, sum_rel = 0, sum_cos = 0, lowest_cos = 1;
  int agree = 0;
  for (size_t p = 0; p < f.tokens.size(); ++p) {
    const float* x = &a[p * V];
    const float* y = &b[p * V];
    double max_ref = 0, max_diff = 0, xy = 0, xx = 0, yy = 0;
    for (size_t v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(x[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[v]) - x[v]));
      xy += static_cast<double>(x[v]) * y[v];
      xx += static_cast<double>(x[v]) * x[v];
      yy += static_cast<double>(y[v]) * y[v];
    }
    const double cos = xy / std::sqrt(xx * yy);
    worst = std::max(worst, max_diff / max_ref);
    sum_rel += max_diff / max_ref;
    sum_cos += cos;
    lowest_cos = std::min(lowest_cos, cos);
    agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
  }
  const int P = n;
  std::printf("MXFP4 experts against BF16: max|dlogit|/max|logit| mean %.4f worst %.4f; cosine mean %.5f lowest %.5f; "
              "argmax agrees at %d of %d positions\n",
              sum_rel / P, worst, sum_cos / P, lowest_cos, agree, P);
  EXPECT_GT(worst, 0);  // the experts really changed
  EXPECT_LT(sum_rel / P, 0.30);  // measured 0.20
  EXPECT_GT(sum_cos / P, 0.95);  // measured 0.971
  EXPECT_GE(agree, P * 5 / 8);    // measured 35 of 47
  // What the MXFP4 experts compute is the fp32 reference on the checkpoint
  // whose experts went through MXFP4 and back (model.md section 7, in
  // tools/reference/mxfp4.py): within section 10's bound on the reference
  // kernels, so the requantisation (its layout, order and scales) is the
  // spec's and the error above is MXFP4's own.
  {
    const std::string rounded = TempPath("qwen3_next_mxfp4_rounded"), out = TempPath("qwen3_next_mxfp4_ref");
    std::filesystem::remove_all(rounded);
    std::filesystem::remove_all(out);
    std::string ids;
    for (int t : f.tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string round = "/usr/bin/python3 " + Script() + " mxfp4-experts --model " + f.model + " --out " + rounded;
    const std::string run = "/usr/bin/python3 " + Script() + " run --model " + rounded + " --tokens " + ids +
                            " --decode 0 --out " + out;
    ASSERT_EQ(std::system(round.c_str()), 0) << round;
    ASSERT_EQ(std::system(run.c_str()), 0) << run;
    std::vector<float> want(a.size());
    std::ifstream lf(out + "/logits.f32", std::ios::binary);
    lf.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
    ASSERT_EQ(lf.gcount(), static_cast<std::streamsize>(want.size() * 4));
    ModelOptions ref_mx;
    ref_mx.kernels = KernelChoice::kReference;
    ref_mx.experts = ExpertFormat::kMxfp4;
    auto exact = qwen3_next::LoadModel(f.model, ref_mx);
    ASSERT_TRUE(exact) << exact.error().ToString();
    const std::vector<float> got = EngineLogits(**exact, f.tokens, n);
    ASSERT_EQ(got.size(), want.size());
    for (size_t p = 0; p < f.tokens.size(); ++p) {
      double mx = 0, err = 0;
      for (size_t v = 0; v < V; ++v) {
        mx = std::max(mx, std::fabs(static_cast<double>(want[p * V + v])));
        err = std::max(err, std::fabs(static_cast<double>(got[p * V + v]) - want[p * V + v]));
      }
      ASSERT_LE(err, 1e-3 * mx) << "MXFP4 experts against the reference on the rounded experts: position " << p;
    }
    std::filesystem::remove_all(rounded);
    std::filesystem::remove_all(out);
  }
  // The same through the registry: Engine::Open with experts mxfp4 serves it.
  EngineOptions eo;
  eo.cache_tokens = 1024;
  eo.block_tokens = 16;
  eo.experts = ExpertFormat::kMxfp4;
  auto engine = Engine::Open(f.model, eo);
  ASSERT_TRUE(engine) << engine.error().ToString();
  EXPECT_EQ((*engine)->config().expert_format, ExpertFormat::kMxfp4);
}

TEST(Qwen3Next, DescribeSummarisesTheDirectory) {
  const Fixture& f = Shared();
  auto text = DescribeQwen3Next(f.model);
  ASSERT_TRUE(text) << text.error().ToString();
  EXPECT_NE(text->find("(2 shards)"), std::string::npos) << *text;
  EXPECT_NE(text->find("4: 3 Gated DeltaNet, 1 gated attention; 3 MoE, 1 dense MLP"), std::string::npos) << *text;
  EXPECT_NE(text->find("8, top-2 (renormalised), shared expert 48 wide"), std::string::npos) << *text;
  EXPECT_NE(text->find("multi-token prediction: speculative drafts when asked"), std::string::npos) << *text;
}

// A converted directory stacks the routed experts under engine names
// (layers.N.ffn.experts.w13 / w2), not .mlp.experts.: moe-model-info counts
// the same routed, total and active parameters for it as for the published
// one, BF16 or MXFP4 (blocks two parameters a byte, scales none).
TEST(Qwen3Next, DescribeCountsAConvertedDirectorysExperts) {
  const Fixture& f = Shared();
  // The routed count of "parameters     T total, R routed, A active per token".
  const auto routed = [](const std::string& dir) {
    auto text = DescribeQwen3Next(dir);
    EXPECT_TRUE(text) << text.error().ToString();
    if (!text) return std::string();
    const size_t end = text->find(" routed,"), start = text->rfind(", ", end);
    EXPECT_NE(end, std::string::npos) << *text;
    if (end == std::string::npos || start == std::string::npos) return std::string();
    return text->substr(start + 2, end - start - 2);
  };
  const std::string published = routed(f.model);
  ASSERT_FALSE(published.empty());
  EXPECT_NE(published, "0");
  for (ExpertFormat format : {ExpertFormat::kBf16, ExpertFormat::kMxfp4}) {
    const std::string out = TempPath(std::string("qwen3_next_describe_") + std::string(ExpertFormatName(format)));
    std::filesystem::remove_all(out);
    auto st = qwen3_next::WriteConverted(f.model, out, format, uint64_t{1} << 30);
    ASSERT_TRUE(st) << st.error().ToString();
    EXPECT_EQ(routed(out), published) << ExpertFormatName(format);
    std::filesystem::remove_all(out);
  }
  EXPECT_EQ(Qwen3NextTensorParameters("layers.0.ffn.experts.w13.blocks", 10), 20);
  EXPECT_EQ(Qwen3NextTensorParameters("layers.0.ffn.experts.w13.scales", 10), 0);
  EXPECT_TRUE(IsQwen3NextRoutedExpert("layers.3.ffn.experts.w2.weight"));
  EXPECT_FALSE(IsQwen3NextRoutedExpert("layers.3.ffn.shared.w2.weight"));
}

TEST(Qwen3Next, ConfigErrorsNameTheField) {
  const std::string good = R"({"model_type": "qwen3_next", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8})";
  auto ok = qwen3_next::ParseConfig(good);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->full_attention, (std::vector<bool>{false, false}));
  auto with = [&](const std::string& key, const std::string& value) {
    auto j = nlohmann::json::parse(good);
    j[key] = nlohmann::json::parse(value);
    auto r = qwen3_next::ParseConfig(j.dump());
    EXPECT_FALSE(r) << key;
    return r ? std::string() : r.error().message();
  };
  EXPECT_NE(with("linear_num_value_heads", "3").find("linear_num_value_heads"), std::string::npos);
  EXPECT_NE(with("num_key_value_heads", "3").find("num_key_value_heads"), std::string::npos);
  EXPECT_NE(with("layer_types", R"(["full_attention"])").find("layer_types"), std::string::npos);
  EXPECT_NE(with("layer_types", R"(["full_attention", "sliding"])").find("layer_types[1]"), std::string::npos);
  EXPECT_NE(with("hidden_size", "\"64\"").find("hidden_size"), std::string::npos);
  EXPECT_NE(with("num_experts_per_tok", "600").find("num_experts_per_tok"), std::string::npos);
  EXPECT_NE(with("mlp_only_layers", "[5]").find("mlp_only_layers"), std::string::npos);
  EXPECT_NE(with("rope_scaling", R"({"type": "yarn"})").find("rope_scaling"), std::string::npos);
  EXPECT_NE(with("partial_rotary_factor", "0.01").find("partial_rotary_factor"), std::string::npos);
  EXPECT_NE(with("model_type", "\"qwen3\"").find("model_type"), std::string::npos);
}

TEST(Qwen3Next, MissingOrMisshapenTensorsAreNamed) {
  const Fixture& f = Shared();
  const std::string bad = TempPath("qwen3_next_bad");
  std::filesystem::remove_all(bad);
  std::filesystem::copy(f.model, bad);
  // Claim a larger hidden size than the tensors have.
  std::ifstream in(bad + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  in.close();
  cfg["linear_value_head_dim"] = 32;
  std::ofstream(bad + "/config.json") << cfg.dump();
  auto m = qwen3_next::LoadModel(bad, ModelOptions{});
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("model.layers.0.linear_attn.in_proj_qkvz.weight"), std::string::npos)
      << m.error().message();
}

}  // namespace
}  // namespace moeserve::engine
