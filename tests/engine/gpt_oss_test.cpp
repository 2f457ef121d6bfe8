// gpt-oss (gpt_oss_model.hpp) against the fp32 PyTorch reference
// (tools/reference/gpt_oss.py) on tiny random checkpoints written in the
// Hugging Face layout: logits within 1e-3 * max|ref| at every position of a
// prompt longer than the sliding window and of the greedy continuation,
// greedy tokens identical; hostile checkpoints fail with clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "gpt_oss_solo.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::engine {
namespace {

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

std::string Temp(const std::string& tag) {
  return ::testing::TempDir() + "/moe_gptoss_" + tag + "_" + std::to_string(::getpid());
}

std::string Script() { return "/usr/bin/python3 " + Root() + "/tools/reference/gpt_oss.py "; }

// Writes a tiny checkpoint with the writer's extra arguments; its path.
std::string WriteModel(const std::string& tag, const std::string& args) {
  std::string dir = Temp(tag);
  std::filesystem::remove_all(dir);
  std::string cmd = Script() + "write --out " + dir + " " + args + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

struct Reference {
  int prompt_len = 0, positions = 0, vocab = 0;
  std::vector<int> tokens, greedy;
  std::vector<double> margin;
  std::vector<float> logits;
};

bool RunReference(const std::string& model, const std::vector<int>& prompt, int decode, Reference* r) {
  std::string out = model + "_ref", toks;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i) toks += ',';
    toks += std::to_string(prompt[i]);
  }
  std::string cmd = Script() + "run --model " + model + " --tokens " + toks + " --decode " + std::to_string(decode) +
                    " --out " + out + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return ADD_FAILURE() << cmd, false;
  std::ifstream mf(out + "/meta.json");
  auto meta = nlohmann::json::parse(mf);
  r->prompt_len = meta["prompt_len"];
  r->positions = meta["positions"];
  r->vocab = meta["vocab_size"];
  r->tokens = meta["tokens"].get<std::vector<int>>();
  r->greedy = meta["greedy_tokens"].get<std::vector<int>>();
  r->margin = meta["top2_margin"].get<std::vector<double>>();
  r->logits.resize(static_cast<size_t>(r->positions) * r->vocab);
  std::ifstream lf(out + "/logits.f32", std::ios::binary);
  lf.read(reinterpret_cast<char*>(r->logits.data()), static_cast<std::streamsize>(r->logits.size() * 4));
  std::filesystem::remove_all(out);
  return static_cast<bool>(lf);
}

std::vector<int> Prompt(int n, int vocab) {
  std::vector<int> p;
  uint64_t s = 11;
  while (static_cast<int>(p.size()) < n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p.push_back(static_cast<int>((s >> 33) % static_cast<uint64_t>(vocab)));
  }
  return p;
}

// The engine's logits for the reference's token sequence (the prompt in one
// call, or in calls of prompt_chunk tokens, then a token a call, as decode
// runs) and its own greedy continuation, with the given kernels.
void Conformance(const std::string& dir, int prompt_len, int decode, int window,
                 kernels::Isa isa = kernels::BestIsa(), int prompt_chunk = 0) {
  auto model = GptOssModel::Load(dir, isa);
  ASSERT_TRUE(model) << model.error().ToString();
  const GptOssConfig& c = (*model)->config();
  ASSERT_EQ(c.sliding_window, window);
  ASSERT_GT(prompt_len, 2 * window);  // the band cuts off most of the prompt
  Reference ref;
  ASSERT_TRUE(RunReference(dir, Prompt(prompt_len, c.vocab), decode, &ref));
  ASSERT_EQ(ref.vocab, c.vocab);
  ASSERT_EQ(ref.positions, prompt_len + decode);

  SoloSequence st(**model);
  std::vector<float> all, part;
  const int chunk = prompt_chunk > 0 ? prompt_chunk : prompt_len;
  for (int at = 0; at < prompt_len; at += chunk) {
    const int n = std::min(chunk, prompt_len - at);
    ASSERT_TRUE(st.Forward(std::span(ref.tokens).subspan(at, n), true, &part));
    all.insert(all.end(), part.begin(), part.end());
  }
  for (int i = prompt_len; i < ref.positions; ++i) {
    ASSERT_TRUE(st.Forward(std::span(ref.tokens).subspan(i, 1), true, &part));
    all.insert(all.end(), part.begin(), part.end());
  }
  ASSERT_EQ(all.size(), ref.logits.size());
  double worst = 0;
  int greedy_checked = 0;
  for (int p = 0; p < ref.positions; ++p) {
    const float* e = all.data() + static_cast<size_t>(p) * c.vocab;
    const float* r = ref.logits.data() + static_cast<size_t>(p) * c.vocab;
    double maxref = 0, maxdiff = 0;
    for (int v = 0; v < c.vocab; ++v) {
      maxref = std::max(maxref, std::fabs(static_cast<double>(r[v])));
      maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(e[v]) - r[v]));
    }
    ASSERT_GT(maxref, 0);
    worst = std::max(worst, maxdiff / maxref);
    EXPECT_LE(maxdiff, 1e-3 * maxref) << "position " << p;
    if (p >= prompt_len - 1 && ref.margin[p] > 2e-3 * maxref) {
      const int argmax = static_cast<int>(std::max_element(e, e + c.vocab) - e);
      EXPECT_EQ(argmax, ref.greedy[p - (prompt_len - 1)]) << "position " << p;
      ++greedy_checked;
    }
  }
  ::testing::Test::RecordProperty("worst_ratio", std::to_string(worst));
  std::printf("worst max|diff|/max|ref| = %.3g over %d positions; %d greedy picks checked\n", worst, ref.positions,
              greedy_checked);
  EXPECT_GE(greedy_checked, decode / 2);  // margins of random models are mostly far above the bound

  // Greedy decode from a fresh state reproduces the reference's tokens.
  SoloSequence g(**model);
  std::vector<int> next(ref.tokens.begin(), ref.tokens.begin() + prompt_len), own;
  for (int i = 0; i <= decode; ++i) {
    ASSERT_TRUE(g.Forward(next, false, &part));
    own.push_back(static_cast<int>(std::max_element(part.begin(), part.end()) - part.begin()));
    next = {own.back()};
  }
  EXPECT_EQ(own, ref.greedy);
  std::filesystem::remove_all(dir);
}

TEST(GptOss, ConformanceRealVocabUntied) {
  Conformance(WriteModel("real", "--layers 4 --window 8 --seed 1"), 24, 10, 8);
}

TEST(GptOss, ConformanceSmallVocabTiedNarrowWindow) {
  Conformance(WriteModel("tied", "--layers 3 --window 3 --vocab 1000 --tie --seed 2"), 12, 8, 3);
}

// The reference kernels (plain loops) meet the same bound, and so does a
// prompt fed in chunks of 5 tokens that straddle the band's cut-offs.
TEST(GptOss, ConformanceReferenceKernels) {
  Conformance(WriteModel("refk", "--layers 2 --window 3 --vocab 1000 --seed 4"), 12, 6, 3, kernels::Isa::kReference);
}

TEST(GptOss, ConformancePromptInChunks) {
  Conformance(WriteModel("chunks", "--layers 2 --window 3 --vocab 1000 --seed 5"), 17, 6, 3, kernels::BestIsa(), 5);
}

// The family reads and writes whole token rows: a pool cut in stripes (the
// moe-dsa-v1 graph's) is refused, not written at the wrong addresses.
TEST(GptOss, AStripedPoolIsRefused) {
  const std::string dir = WriteModel("striped", "--layers 1 --vocab 300 --seed 2");
  auto model = GptOssModel::Load(dir);
  ASSERT_TRUE(model) << model.error().ToString();
  const GptOssModel& m = **model;
  KvPool pool(8, 4, m.cache_floats_per_token(), {0, m.cache_floats_per_token() / 2});
  SequenceCache cache;
  const std::vector<int> prompt = {5, 17, 99};
  ASSERT_TRUE(EnsureBlocks(pool, cache, 3));
  ForwardSegment seg{&cache, prompt, false};
  std::vector<float> logits;
  auto st = m.Forward(pool, std::span<ForwardSegment>(&seg, 1), &logits);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message().find("stripes"), std::string::npos) << st.error().ToString();
}

// A batched decode step (one Forward over one segment per sequence, their
// blocks in one KvPool: the projections and experts over all sequences' rows
// at once, attention per sequence) gives each sequence the logits of its own
// forward alone, within the bound for batched against alone (1e-4 of the
// largest logit), and the same greedy tokens: sequences at different
// lengths, past the sliding window, with experts shared by several rows.
TEST(GptOss, BatchedDecodeMatchesEachSequenceAlone) {
  const std::string dir = WriteModel("batch", "--layers 3 --window 4 --vocab 1000 --seed 5");
  auto model = GptOssModel::Load(dir);
  ASSERT_TRUE(model) << model.error().ToString();
  const GptOssModel& m = **model;
  const size_t vocab = static_cast<size_t>(m.config().vocab);
  const std::vector<std::vector<int>> prompts = {{5, 17, 99, 3, 250, 8, 61, 7, 400, 12, 33}, {42}, {7, 7, 7, 900, 1, 2}};
  const size_t B = prompts.size();
  KvPool pool(64, 4, m.cache_floats_per_token());  // blocks of 4: sequences interleave in the pool
  std::vector<SoloSequence> alone;
  std::vector<SequenceCache> together(B);
  std::vector<int> next_alone(B), next_together(B);
  std::vector<float> logits;
  for (size_t i = 0; i < B; ++i) {
    alone.emplace_back(m);
    ASSERT_TRUE(alone[i].Forward(prompts[i], false, &logits));
    next_alone[i] = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_TRUE(EnsureBlocks(pool, together[i], static_cast<int64_t>(prompts[i].size())));
    ForwardSegment seg{&together[i], prompts[i], false};
    ASSERT_TRUE(m.Forward(pool, std::span<ForwardSegment>(&seg, 1), &logits));
    next_together[i] = next_alone[i];
  }
  double worst = 0;
  for (int step = 0; step < 10; ++step) {
    std::vector<ForwardSegment> segs;
    for (size_t i = 0; i < B; ++i) {
      ASSERT_TRUE(EnsureBlocks(pool, together[i], together[i].length + 1));
      segs.push_back({&together[i], std::span<const int>(&next_together[i], 1), false});
    }
    std::vector<float> batch;
    ASSERT_TRUE(m.Forward(pool, segs, &batch));
    ASSERT_EQ(batch.size(), B * vocab);
    for (size_t i = 0; i < B; ++i) {
      ASSERT_TRUE(alone[i].Forward(std::vector<int>{next_alone[i]}, false, &logits));
      const float* b = batch.data() + i * vocab;
      double maxref = 0, maxdiff = 0;
      for (size_t v = 0; v < vocab; ++v) {
        maxref = std::max(maxref, std::fabs(static_cast<double>(logits[v])));
        maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(b[v]) - logits[v]));
      }
      worst = std::max(worst, maxdiff / maxref);
      EXPECT_LE(maxdiff, 1e-4 * maxref) << "sequence " << i << " step " << step;
      next_alone[i] = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      next_together[i] = static_cast<int>(std::max_element(b, b + vocab) - b);
      EXPECT_EQ(next_together[i], next_alone[i]) << "sequence " << i << " step " << step;
      EXPECT_EQ(together[i].length, alone[i].length());
    }
  }
  std::printf("batched against alone: worst max|diff|/max|logit| = %.3g\n", worst);
  // Misuse is refused: a sequence twice in one pass, blocks that do not cover the tokens.
  std::vector<float> out;
  const int one = 1;
  std::vector<ForwardSegment> twice = {{&together[0], std::span<const int>(&one, 1), false},
                                       {&together[0], std::span<const int>(&one, 1), false}};
  ASSERT_TRUE(EnsureBlocks(pool, together[0], together[0].length + 2));
  EXPECT_FALSE(m.Forward(pool, twice, &out));
  SequenceCache bare;
  ForwardSegment uncovered{&bare, std::span<const int>(&one, 1), false};
  EXPECT_FALSE(m.Forward(pool, std::span<ForwardSegment>(&uncovered, 1), &out));
  for (auto& c : together) ReleaseBlocks(pool, c);
  std::filesystem::remove_all(dir);
}

// Over the positions of two runs' logits (`vocab` a position): the largest
// max|got - want| / max|want|.
double WorstPositionDiff(const std::vector<float>& want, const std::vector<float>& got, size_t vocab) {
  double worst = 0;
  for (size_t p = 0; p < want.size() / vocab; ++p) {
    double maxref = 0, maxdiff = 0;
    for (size_t v = p * vocab; v < (p + 1) * vocab; ++v) {
      maxref = std::max(maxref, std::fabs(static_cast<double>(want[v])));
      maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(got[v]) - want[v]));
    }
    worst = std::max(worst, maxdiff / maxref);
  }
  return worst;
}

// ModelOptions::bf16_activations reaches gpt-oss through the family
// registry (as the engine, the daemon and moe-run load it): a prefill of
// more than kernels::kBf16ActMinRows rows runs the BF16-activation products,
// whose logits move by the rounding (not zero, well inside a tenth of the
// largest logit) and keep the last position's greedy pick; the reference
// kernels stay fp32 whatever the option says.
TEST(GptOss, Bf16ActivationsReachTheFamilyLoad) {
  const std::string dir = WriteModel("bf16act", "--layers 2 --window 4 --seed 6");
  auto family = FindFamily(dir);
  ASSERT_TRUE(family) << family.error().ToString();
  auto load = [&](bool bf16, KernelChoice k) {
    ModelOptions o;
    o.kernels = k;
    o.bf16_activations = bf16;
    auto parts = (*family)->load(dir, o);
    EXPECT_TRUE(parts) << parts.error().ToString();
    return parts ? std::move(parts->model) : nullptr;
  };
  auto fp32 = load(false, KernelChoice::kFast), bf16 = load(true, KernelChoice::kFast);
  auto ref_bf16 = load(true, KernelChoice::kReference);
  ASSERT_TRUE(fp32 && bf16 && ref_bf16);
  const auto& m32 = dynamic_cast<const GptOssModel&>(*fp32);
  const auto& m16 = dynamic_cast<const GptOssModel&>(*bf16);
  EXPECT_NE(std::string(m16.kernels().matmul_mxfp4.name).find("+bf16act"), std::string::npos);
  EXPECT_NE(std::string(m16.kernels().matmul_bf16.name).find("+bf16act"), std::string::npos);
  EXPECT_EQ(std::string(m32.kernels().matmul_mxfp4.name).find("+bf16act"), std::string::npos);
  EXPECT_EQ(std::string(dynamic_cast<const GptOssModel&>(*ref_bf16).kernels().matmul_mxfp4.name).find("+bf16act"),
            std::string::npos);

  const int prompt_len = 2 * static_cast<int>(kernels::kBf16ActMinRows);
  const std::vector<int> prompt = Prompt(prompt_len, m32.config().vocab);
  std::vector<float> a, b;
  SoloSequence s32(m32), s16(m16);
  ASSERT_TRUE(s32.Forward(prompt, true, &a));
  ASSERT_TRUE(s16.Forward(prompt, true, &b));
  ASSERT_EQ(a.size(), b.size());
  const size_t vocab = static_cast<size_t>(m32.config().vocab);
  const double worst = WorstPositionDiff(a, b, vocab);
  std::printf("bf16 activations against fp32 over %d prefill positions: worst max|diff|/max|logit| = %.3g\n",
              prompt_len, worst);
  EXPECT_GT(worst, 0.0);  // the option ran other products
  EXPECT_LT(worst, 0.1);
  const auto last = [&](const std::vector<float>& l) {
    return std::max_element(l.end() - static_cast<std::ptrdiff_t>(vocab), l.end()) - l.end();
  };
  EXPECT_EQ(last(a), last(b));
  std::filesystem::remove_all(dir);
}

// The amx row's products (BF16 attention projections and head, MXFP4
// experts, both with BF16 activations) serve a whole prefill: on the
// amx_model row (the row's code on the software tiles, wherever AVX-512 BF16
// runs) and, on a CPU with AMX, on the amx row itself, against the AVX-512
// row's BF16-activation products (the same rounding; fp32 summation order
// only).
TEST(GptOss, TheAmxRowsProductsServeAPrefill) {
  if (!kernels::IsaSupported(kernels::Isa::kAmxModel))
    GTEST_SKIP() << "no avx512_bf16 here: the amx row's helpers (and so its model row) cannot run; "
                 << kernels::IsaReport();
  const std::string dir = WriteModel("amx", "--layers 2 --window 4 --seed 7");
  auto base = GptOssModel::Load(dir, kernels::Isa::kAvx512, true);
  ASSERT_TRUE(base) << base.error().ToString();
  const int prompt_len = 2 * static_cast<int>(kernels::kBf16ActMinRows) + 5;
  const std::vector<int> prompt = Prompt(prompt_len, (*base)->config().vocab);
  std::vector<float> want;
  SoloSequence sb(**base);
  ASSERT_TRUE(sb.Forward(prompt, true, &want));
  const size_t vocab = static_cast<size_t>((*base)->config().vocab);
  int rows_run = 0;
  for (kernels::Isa isa : {kernels::Isa::kAmxModel, kernels::Isa::kAmx}) {
    if (!kernels::IsaSupported(isa)) continue;  // amx: reported by the kernels' AmxRow test
    SCOPED_TRACE(kernels::IsaName(isa));
    ++rows_run;
    auto m = GptOssModel::Load(dir, isa, true);
    ASSERT_TRUE(m) << m.error().ToString();
    const std::string own = std::string("_") + kernels::IsaVariantSuffix(isa);
    EXPECT_EQ(std::string((*m)->kernels().matmul_bf16.name), "matmul_bf16" + own + "+bf16act");
    std::vector<float> got;
    SoloSequence s(**m);
    ASSERT_TRUE(s.Forward(prompt, true, &got));
    ASSERT_EQ(got.size(), want.size());
    const double worst = WorstPositionDiff(want, got, vocab);
    std::printf("%s against avx512, BF16 activations, %d prefill positions: worst max|diff|/max|logit| = %.3g\n",
                kernels::IsaName(isa), prompt_len, worst);
    EXPECT_LT(worst, 1e-4);
  }
  EXPECT_GE(rows_run, 1);
  std::filesystem::remove_all(dir);
}

TEST(GptOss, CheckpointCarriesRealTokenizerFiles) {
  std::string dir = WriteModel("tok", "--layers 1 --vocab 1000");
  EXPECT_TRUE(std::filesystem::exists(dir + "/tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  std::filesystem::remove_all(dir);
}

std::string LoadError(const std::string& dir) {
  auto m = GptOssModel::Load(dir);
  EXPECT_FALSE(m) << "loaded a hostile checkpoint: " << dir;
  return m ? std::string() : m.error().ToString();
}

// The experts setting names a format the family does not convert to: refused, not ignored.
TEST(GptOss, AnotherExpertFormatIsRefused) {
  std::string dir = WriteModel("experts", "--layers 2 --vocab 1000");
  EngineOptions eo;
  eo.experts = ExpertFormat::kBf16;
  auto engine = Engine::Open(dir, eo);
  ASSERT_FALSE(engine);
  EXPECT_NE(engine.error().message().find("experts: bf16 requested"), std::string::npos) << engine.error().message();
  std::filesystem::remove_all(dir);
}

TEST(GptOss, MissingTensorIsNamed) {
  std::string dir = WriteModel("missing", "--layers 2 --vocab 1000 --drop model.layers.1.self_attn.sinks");
  EXPECT_NE(LoadError(dir).find("missing tensor 'model.layers.1.self_attn.sinks'"), std::string::npos)
      << LoadError(dir);
  std::filesystem::remove_all(dir);
}

TEST(GptOss, WrongShapeIsNamed) {
  std::string dir = WriteModel("shape", "--layers 2 --vocab 1000 --bad-shape model.layers.0.mlp.router.bias");
  std::string e = LoadError(dir);
  EXPECT_NE(e.find("'model.layers.0.mlp.router.bias' has shape [3], expected [4]"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(GptOss, WrongExpertBlocksShapeIsNamed) {
  std::string dir = WriteModel("blocks", "--layers 1 --vocab 1000 --bad-shape model.layers.0.mlp.experts.down_proj_blocks");
  std::string e = LoadError(dir);
  EXPECT_NE(e.find("down_proj_blocks' has shape"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(GptOss, NanExpertScaleIsRefused) {
  std::string dir = WriteModel("nan", "--layers 1 --vocab 1000 --nan-scale model.layers.0.mlp.experts.gate_up_proj_scales");
  std::string e = LoadError(dir);
  EXPECT_NE(e.find("gate_up_proj_scales' holds 255"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(GptOss, BadConfigValuesAreNamed) {
  std::string dir = WriteModel("config", "--layers 2 --vocab 1000");
  std::ifstream in(dir + "/config.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"num_key_value_heads", 3, "multiple of num_key_value_heads"},
      {"hidden_size", 48, "multiples of 32"},
      {"num_experts_per_tok", 9, "exceeds num_local_experts"},
      {"sliding_window", 0, "'sliding_window' = 0 is outside"},
      {"layer_types", nlohmann::json::array({"full_attention"}), "'layer_types' must list"},
      {"layer_types", nlohmann::json::array({"full_attention", "banded"}), "layer_types[1]"},
      {"rope_scaling", nlohmann::json{{"rope_type", "linear"}, {"factor", 2.0}}, "only yarn"},
      {"head_dim", "16", "'head_dim' must be an integer"},
      {"model_type", "llama", "model_type is not"},
      {"vocab_size", nullptr, "missing 'vocab_size'"},
  };
  {
    // Parses, but more weights than any machine here holds, even as MXFP4: refused before any tensor is read.
    nlohmann::json j = good;
    j["hidden_size"] = 32768;
    j["intermediate_size"] = 32768;
    j["num_local_experts"] = 4096;
    j["num_hidden_layers"] = 1;
    j["layer_types"] = nlohmann::json::array({"full_attention"});
    std::ofstream(dir + "/config.json") << j.dump();
    std::string e = LoadError(dir);
    EXPECT_NE(e.find("GB of weights in memory, more than this machine's"), std::string::npos) << e;
  }
  int checked = 0;
  for (const Case& k : cases) {
    nlohmann::json j = good;
    j[k.key] = k.value;
    std::ofstream(dir + "/config.json") << j.dump();
    std::string e = LoadError(dir);
    EXPECT_NE(e.find(k.expect), std::string::npos) << k.key << ": " << e;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
  std::ofstream(dir + "/config.json") << "{not json";
  EXPECT_NE(LoadError(dir).find("not a JSON object"), std::string::npos);
  std::filesystem::remove(dir + "/config.json");
  EXPECT_NE(LoadError(dir).find("cannot open"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(GptOss, OutOfVocabularyTokenIsRefused) {
  std::string dir = WriteModel("oov", "--layers 1 --vocab 1000");
  auto model = GptOssModel::Load(dir);
  ASSERT_TRUE(model) << model.error().ToString();
  SoloSequence st(**model);
  std::vector<float> logits;
  const std::vector<int> bad = {5, 1000};
  auto s = st.Forward(bad, false, &logits);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().ToString().find("token id 1000 is outside the vocabulary"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::engine
