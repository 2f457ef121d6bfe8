// DeepSeek-V3.2 (engine/families/deepseek_v32) against the fp32 PyTorch
// reference written from DeepSeek's inference code
// (tools/reference/families/deepseek_v32.py), on tiny random checkpoints in
// the published layout (Hugging Face names, FP8 e4m3 weights with 128x128
// weight_scale_inv, two shards and an index, an MTP layer): logits within
// 1e-3 * max|ref| at every position of a prompt and of the teacher-forced
// continuation, greedy tokens identical, DSA selections identical (index_topk
// 8, so the indexer really chooses); the FP8 matrices held as published
// (block scales that are not powers of two) within 1e-5 of the reference,
// which applies the scales in fp32 to the unrounded weights, in prefill,
// decode and batched decode, and decode's bytes counting them as a byte a
// weight; hostile configs and checkpoints fail with errors naming the field
// or tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <unistd.h>

#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/fp8_block.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "../../engine/layers.hpp"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

std::string Script() { return "/usr/bin/python3 " + Root() + "/tools/reference/families/deepseek_v32.py "; }

std::string Temp(const std::string& tag) {
  return ::testing::TempDir() + "/moe_ds32_" + tag + "_" + std::to_string(::getpid());
}

// One tiny checkpoint for the whole file (writing it takes seconds).
const std::string& TinyModel() {
  static const std::string dir = [] {
    std::string d = Temp("model");
    fs::remove_all(d);
    std::string cmd = Script() + "write --out " + d + " --layers 3 --index-topk 8 --scales float 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

std::string Copy(const std::string& tag) {
  std::string d = Temp(tag);
  fs::remove_all(d);
  fs::copy(TinyModel(), d, fs::copy_options::recursive);
  return d;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void WriteJson(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2);
}

struct Reference {
  int positions = 0, vocab = 0;
  std::vector<int> tokens, greedy;
  std::vector<double> margin;
  std::vector<float> logits;
  json dsa;
};

bool RunReference(const std::string& model, const std::vector<int>& prompt, int decode, Reference* r) {
  std::string out = model + "_ref", toks;
  for (size_t i = 0; i < prompt.size(); ++i) toks += (i ? "," : "") + std::to_string(prompt[i]);
  std::string cmd = Script() + "run --model " + model + " --tokens " + toks + " --decode " + std::to_string(decode) +
                    " --out " + out + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return ADD_FAILURE() << cmd, false;
  json meta = ReadJson(out + "/meta.json");
  r->positions = meta["positions"];
  r->vocab = meta["vocab_size"];
  r->tokens = meta["tokens"].get<std::vector<int>>();
  r->greedy = meta["greedy_tokens"].get<std::vector<int>>();
  r->margin = meta["top2_margin"].get<std::vector<double>>();
  r->dsa = meta["dsa"];
  r->logits.resize(static_cast<size_t>(r->positions) * r->vocab);
  std::ifstream lf(out + "/logits.f32", std::ios::binary);
  lf.read(reinterpret_cast<char*>(r->logits.data()), static_cast<std::streamsize>(r->logits.size() * 4));
  fs::remove_all(out);
  return static_cast<bool>(lf);
}

constexpr int kPrompt = 20, kDecode = 12;

std::vector<int> Prompt(int vocab) {
  std::vector<int> p;
  uint64_t s = 7;
  while (static_cast<int>(p.size()) < kPrompt) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p.push_back(static_cast<int>((s >> 33) % static_cast<uint64_t>(vocab)));
  }
  return p;
}

const Reference& Ref() {
  static const Reference ref = [] {
    Reference r;
    auto cfg = deepseek_v32::LoadConfig(TinyModel());
    EXPECT_TRUE(cfg) << cfg.error().ToString();
    EXPECT_TRUE(RunReference(TinyModel(), Prompt(cfg ? cfg->model.vocab_size : 1000), kDecode, &r));
    return r;
  }();
  return ref;
}

void CompareWithReference(KernelChoice kernels) {
  const Reference& ref = Ref();
  ASSERT_EQ(ref.positions, kPrompt + kDecode);
  // The serving path (family.cpp): each tensor converted as the model loads.
  auto dir = deepseek_v32::OpenDirStreamed(TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  EXPECT_EQ(dir->family, "deepseek_v32");
  ModelOptions mo;
  mo.kernels = kernels;
  auto model = Model::Load(*dir, mo);
  ASSERT_TRUE(model) << model.error().ToString();
  const int V = dir->config.vocab_size;
  ASSERT_EQ(V, ref.vocab);
  KvPool pool(8, 16, (*model)->cache_floats_per_token());
  SequenceCache cache = (*model)->NewSequence();
  ForwardTrace trace;

  // Prefill the prompt (every position's logits), then teacher-force the
  // reference's continuation one token at a time (the decode path).
  std::vector<int> prompt(ref.tokens.begin(), ref.tokens.begin() + kPrompt);
  std::vector<float> logits, all;
  ASSERT_TRUE(EnsureBlocks(pool, cache, kPrompt));
  ForwardSegment seg{&cache, prompt, true};
  ASSERT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &logits, &trace));
  all = logits;
  for (int step = 0; step < kDecode; ++step) {
    std::vector<int> tok = {ref.tokens[static_cast<size_t>(kPrompt + step)]};
    ASSERT_TRUE(EnsureBlocks(pool, cache, cache.length + 1));
    ForwardSegment one{&cache, tok, false};
    ASSERT_TRUE((*model)->Forward(pool, std::span(&one, 1), &logits, &trace));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(ref.positions) * V);

  double worst = 0;
  int greedy_checked = 0;
  for (int p = 0; p < ref.positions; ++p) {
    const float* a = &all[static_cast<size_t>(p) * V];
    const float* b = &ref.logits[static_cast<size_t>(p) * V];
    double max_ref = 0, max_diff = 0;
    for (int v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[v]) - b[v]));
    }
    worst = std::max(worst, max_diff / max_ref);
    EXPECT_LE(max_diff, 1e-3 * max_ref) << "position " << p;
    if (p >= kPrompt - 1 && ref.margin[static_cast<size_t>(p)] > 1e-3 * max_ref) {
      const int best = static_cast<int>(std::max_element(a, a + V) - a);
      EXPECT_EQ(best, ref.greedy[static_cast<size_t>(p - (kPrompt - 1))]) << "greedy token at position " << p;
      ++greedy_checked;
    }
  }
  std::printf("worst max|logit - ref| / max|ref| = %.3g; %d greedy tokens checked\n", worst, greedy_checked);
  EXPECT_GE(greedy_checked, kDecode / 2);  // the margins of this seed leave most of them decisive

  // DSA: the reference lists every sparse selection (t + 1 > index_topk).
  int compared = 0;
  ASSERT_GE(ref.dsa.size(), 3u * (ref.positions - 8));
  for (const json& s : ref.dsa) {
    const int layer = s["layer"], pos = s["pos"];
    const auto& got = trace.dsa_selected[layer];
    ASSERT_LT(pos, static_cast<int>(got.size()));
    if (s["gap"].get<double>() <= 1e-5 * s["max_abs"].get<double>()) continue;  // a tie within the bound
    EXPECT_EQ(got[static_cast<size_t>(pos)], s["keys"].get<std::vector<int>>()) << "layer " << layer << " position " << pos;
    ++compared;
  }
  std::printf("%d DSA selections compared\n", compared);
  EXPECT_GE(compared, static_cast<int>(ref.dsa.size()) * 3 / 4);
}

TEST(DeepseekV32, MatchesReferenceWithReferenceKernels) { CompareWithReference(KernelChoice::kReference); }
TEST(DeepseekV32, MatchesReferenceWithFastKernels) { CompareWithReference(KernelChoice::kFast); }

// Linear() on an FP8 matrix (ragged: 333 x 200, so partial 128-blocks both
// ways; scales not powers of two) against MatMulFp8BlockRef for 1, 63, 64
// (the row kernels), 65 and 300 rows (a prefill chunk: the fp32 GEMM over
// blocks of decoded rows) on every kernel set this CPU runs: within fp32
// summation error of the reference, every output written (Y starts as NaN).
// The batch-invariant set gives a row the same bits alone as among 300.
TEST(DeepseekV32, Fp8LinearAgreesWithTheReferenceForEveryRowCount) {
  constexpr size_t kRows = 333, kCols = 200;
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(kRows * kCols);
  for (uint8_t& c : codes) {
    do c = static_cast<uint8_t>(rng()); while ((c & 0x7F) == 0x7F);  // no NaN codes
  }
  std::vector<float> scales(kernels::Fp8BlockScaleCount(kRows, kCols));
  std::uniform_real_distribution<float> scale_dist(0.3f, 2.9f), x_dist(-1.0f, 1.0f);
  for (float& s : scales) s = scale_dist(rng) / 448.0f;
  Matrix W;
  W.fp8 = codes.data();
  W.fp8_scales = scales.data();
  W.rows = static_cast<int>(kRows);
  W.cols = static_cast<int>(kCols);
  const kernels::Fp8BlockView v = W.fp8_view();
  std::vector<float> X(300 * kCols);
  for (float& x : X) x = x_dist(rng);
  // The bound of each output: sum |w x| over its terms (rows of X are shared by every n).
  std::vector<float> wf(kRows * kCols);
  kernels::Fp8BlockToF32(v, 0, kRows, wf.data());
  std::vector<double> abs_sum(300 * kRows, 0.0);
  for (size_t i = 0; i < 300; ++i)
    for (size_t r = 0; r < kRows; ++r)
      for (size_t c = 0; c < kCols; ++c) abs_sum[i * kRows + r] += std::fabs(wf[r * kCols + c] * X[i * kCols + c]);
  for (const kernels::Isa isa : kernels::SupportedIsas()) {
    for (const size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{300}}) {
      std::vector<float> got(n * kRows, std::nanf("")), want(n * kRows);
      Linear(W, X.data(), static_cast<int>(n), got.data(), kernels::Kernels(isa));
      kernels::MatMulFp8BlockRef(v, X.data(), n, want.data());
      int bad = 0;
      for (size_t i = 0; i < n; ++i)
        for (size_t r = 0; r < kRows; ++r) {
          const float g = got[i * kRows + r], w = want[i * kRows + r];
          const double bound = 2e-5 * abs_sum[i * kRows + r];
          if (!(std::fabs(g - w) <= bound) && ++bad <= 3)
            ADD_FAILURE() << kernels::IsaName(isa) << " n " << n << " row " << i << " output " << r << ": " << g
                          << " against " << w << " (bound " << bound << ")";
        }
      EXPECT_EQ(bad, 0) << kernels::IsaName(isa) << " n " << n;
    }
  }
  const kernels::KernelSet& inv = kernels::KernelsBatchInvariant(kernels::BestIsa());
  std::vector<float> all(300 * kRows), one(kRows);
  Linear(W, X.data(), 300, all.data(), inv);
  for (const size_t i : {size_t{0}, size_t{64}, size_t{150}, size_t{299}}) {
    Linear(W, X.data() + i * kCols, 1, one.data(), inv);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + i * kRows, kRows * sizeof(float))) << "row " << i;
  }
}

// The shared engine opens the directory through the family registry and
// decodes the reference's greedy tokens, two sequences batched together.
TEST(DeepseekV32, ServedByTheEngineBatched) {
  const Reference& ref = Ref();
  EngineOptions eo;
  eo.cache_tokens = 256;
  auto engine = Engine::Open(TinyModel(), eo);
  ASSERT_TRUE(engine) << engine.error().ToString();
  std::vector<int> prompt(ref.tokens.begin(), ref.tokens.begin() + kPrompt);
  std::map<SequenceId, std::vector<int>> out;
  for (int i = 0; i < 2; ++i) {
    GenerationRequest req;
    req.prompt = prompt;
    req.max_tokens = kDecode + 1;
    req.sampling.temperature = 0;
    req.starts_in_reasoning = false;
    req.stop_tokens = {-1};  // run max_tokens whatever is sampled
    auto id = (*engine)->Submit(req);
    ASSERT_TRUE(id) << id.error().ToString();
    out[*id];
  }
  while ((*engine)->HasWork())
    for (const TokenEvent& e : (*engine)->Step()) {
      ASSERT_NE(e.finish, FinishReason::kError) << e.error;
      if (e.token >= 0) out[e.id].push_back(e.token);
    }
  ASSERT_EQ(out.size(), 2u);
  for (const auto& [id, toks] : out) {
    ASSERT_EQ(toks.size(), static_cast<size_t>(kDecode + 1));
    // Identical up to the first position whose reference margin is within the bound.
    for (int k = 0; k <= kDecode; ++k) {
      const int p = kPrompt - 1 + k;
      const float* b = &ref.logits[static_cast<size_t>(p) * ref.vocab];
      const double max_ref = std::fabs(*std::max_element(b, b + ref.vocab, [](float x, float y) { return std::fabs(x) < std::fabs(y); }));
      if (ref.margin[static_cast<size_t>(p)] <= 1e-3 * max_ref) break;
      EXPECT_EQ(toks[static_cast<size_t>(k)], ref.greedy[static_cast<size_t>(k)]) << "sequence " << id << " token " << k;
    }
  }
}

std::string Binary(const std::string& name) {
  const char* b = std::getenv("MOESERVE_BINARY_DIR");
  return std::string(b ? b : MOESERVE_BINARY_DIR_DEFAULT) + "/engine/" + name;
}

std::string RunCommand(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return *status = -1, out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

// moe-run --prompt-ids --print-ids gives the reference's greedy tokens;
// moe-model-info summarises the directory.
TEST(DeepseekV32, MoeRunAndModelInfo) {
  const Reference& ref = Ref();
  std::string ids;
  for (int i = 0; i < kPrompt; ++i) ids += (i ? "," : "") + std::to_string(ref.tokens[static_cast<size_t>(i)]);
  int status = 0;
  const std::string out = RunCommand(Binary("moe-run") + " --model " + TinyModel() + " --prompt-ids " + ids +
                                         " --max-tokens " + std::to_string(kDecode + 1) + " --ignore-eos --print-ids 2>/dev/null",
                                     &status);
  ASSERT_EQ(status, 0) << out;
  std::vector<int> got;
  std::stringstream ss(out);
  for (std::string t; std::getline(ss, t, ',');) got.push_back(std::stoi(t));
  ASSERT_EQ(got.size(), static_cast<size_t>(kDecode + 1)) << out;
  for (int k = 0; k <= kDecode; ++k) {
    const int p = kPrompt - 1 + k;
    const float* b = &ref.logits[static_cast<size_t>(p) * ref.vocab];
    const double max_ref = std::fabs(*std::max_element(b, b + ref.vocab, [](float x, float y) { return std::fabs(x) < std::fabs(y); }));
    if (ref.margin[static_cast<size_t>(p)] <= 1e-3 * max_ref) break;
    EXPECT_EQ(got[static_cast<size_t>(k)], ref.greedy[static_cast<size_t>(k)]) << "token " << k;
  }
  const std::string info = RunCommand(Binary("moe-model-info") + " " + TinyModel() + " 2>&1", &status);
  ASSERT_EQ(status, 0) << info;
  EXPECT_NE(info.find("family         deepseek_v32"), std::string::npos) << info;
  EXPECT_NE(info.find("layers         3 (dsa 3; ffn: dense 1, moe 2)"), std::string::npos) << info;
  EXPECT_NE(info.find("multi-token-prediction layer 3 mapped to mtp.0"), std::string::npos) << info;
}

TEST(DeepseekV32, MapsThePublishedConfig) {
  auto cfg = deepseek_v32::LoadConfig(TinyModel());
  ASSERT_TRUE(cfg) << cfg.error().ToString();
  const ModelConfig& c = cfg->model;
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.first_dense_layers, 1);
  EXPECT_FALSE(c.mla.output_gate);
  for (LayerKind k : c.layer_types) EXPECT_EQ(k, LayerKind::kDsa);
  EXPECT_TRUE(c.dsa.index_fp8);
  EXPECT_TRUE(c.dsa.index_fp8_ue8m0);
  EXPECT_EQ(c.dsa.index_topk, 8);
  EXPECT_EQ(c.expert_format, ExpertFormat::kBf16);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_EQ(cfg->num_nextn_predict_layers, 1);
  EXPECT_EQ(cfg->eos_token_id, 1);
  auto dir = OpenModelDir(TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  bool mtp_logged = false;
  for (const auto& w : dir->warnings) mtp_logged |= w.find("multi-token-prediction layer 3 mapped to mtp.0") != std::string::npos;
  EXPECT_TRUE(mtp_logged);
  // The moe-dsa-v1 chat engine refuses the family rather than misreading its token ids.
  auto engine = Engine::Create(*dir, EngineOptions{});
  ASSERT_FALSE(engine);
  EXPECT_NE(engine.error().message().find("deepseek_v32"), std::string::npos) << engine.error().message();
}

// The published MTP layer (model.layers.3.*) as the graph's MTP module
// (model.md 15): a DSA block with the MoE FFN and its own cache slot; its
// tensors are the published ones; drafts come out of it, the same for a
// chunked prefill as for one chunk and for the streamed load as for the
// converted image (deterministic mode: bit for bit).
TEST(DeepseekV32, MultiTokenPredictionModule) {
  auto dir = OpenModelDir(TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  const ModelConfig& c = dir->config;
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.mtp_kind, LayerKind::kDsa);
  EXPECT_TRUE(c.mtp_moe);
  // enorm, as converted, is the published one widened to F32.
  auto published = Checkpoint::Open(TinyModel());
  ASSERT_TRUE(published) << published.error().ToString();
  const TensorView* from = published->Find("model.layers.3.enorm.weight");
  const TensorView* to = dir->checkpoint.Find("mtp.0.enorm.weight");
  ASSERT_TRUE(from && to);
  ASSERT_EQ(to->dtype, DType::kF32);
  ASSERT_EQ(to->numel(), from->numel());
  for (int64_t i = 0; i < to->numel(); ++i) {
    float got;
    std::memcpy(&got, to->data + 4 * i, 4);
    float want;
    if (from->dtype == DType::kF32) {
      std::memcpy(&want, from->data + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, from->data + 2 * i, 2);
      want = Bf16ToF32(b);
    }
    ASSERT_EQ(got, want) << i;
  }
  for (const char* name : {"mtp.0.eh_proj.weight", "mtp.0.attn.indexer.wk.weight", "mtp.0.ffn.experts.w13.weight",
                           "mtp.0.ffn.shared.w1.weight", "mtp.0.norm.weight"})
    EXPECT_TRUE(dir->checkpoint.Find(name)) << name;

  ModelOptions mo;
  mo.deterministic = true;
  auto plain = Model::Load(*dir, mo);
  mo.mtp = true;
  auto model = Model::Load(*dir, mo);
  auto streamed_dir = deepseek_v32::OpenDirStreamed(TinyModel());
  ASSERT_TRUE(plain && model && streamed_dir);
  auto streamed = Model::Load(*streamed_dir, mo);
  ASSERT_TRUE(streamed) << streamed.error().ToString();
  EXPECT_EQ((*plain)->draft_depth(), 0);
  EXPECT_EQ((*model)->draft_depth(), Model::kMaxDraftChain);
  // One more DSA slot per token: c, k_pe and the indexer key.
  EXPECT_EQ((*model)->cache_floats_per_token(),
            (*plain)->cache_floats_per_token() +
                static_cast<size_t>(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim + c.dsa.index_head_dim));

  std::vector<int> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back(5 + (i * 29 + i * i) % 200);
  const auto drafts = [&](const Model& m, const std::vector<int>& chunks) {
    KvPool pool(16, 16, m.cache_floats_per_token());
    SequenceCache cache = m.NewSequence();
    size_t at = 0;
    for (int n : chunks) {
      EXPECT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(at) + n));
      std::vector<ForwardSegment> seg{{&cache, std::span<const int>(prompt.data() + at, static_cast<size_t>(n)), false}};
      EXPECT_TRUE(m.Forward(pool, seg, nullptr));
      at += static_cast<size_t>(n);
    }
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + 4));
    std::vector<int> out;
    DraftSlot slot{&cache, 17, 3, &out};
    EXPECT_TRUE(m.ProposeDrafts(pool, std::span<DraftSlot>(&slot, 1)));
    ReleaseBlocks(pool, cache);
    return out;
  };
  const std::vector<int> one = drafts(**model, {21});
  ASSERT_EQ(one.size(), 3u);
  for (int t : one) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
  EXPECT_EQ(drafts(**model, {8, 1, 12}), one);
  EXPECT_EQ(drafts(**streamed, {21}), one);
}

// Each edit of config.json fails with an error naming the field.
TEST(DeepseekV32, ConfigErrorsNameTheField) {
  const json base = ReadJson(TinyModel() + "/config.json");
  struct Case {
    std::string field;
    std::function<void(json&)> edit;
  };
  const std::vector<Case> cases = {
      {"n_group", [](json& j) { j["n_group"] = 3; }},
      {"topk_group", [](json& j) { j["topk_group"] = 5; }},
      {"kv_lora_rank", [](json& j) { j.erase("kv_lora_rank"); }},
      {"q_lora_rank", [](json& j) { j["q_lora_rank"] = nullptr; }},
      {"scoring_func", [](json& j) { j["scoring_func"] = "softmax"; }},
      {"topk_method", [](json& j) { j["topk_method"] = "greedy"; }},
      {"index_head_dim", [](json& j) { j["index_head_dim"] = 96; }},
      {"num_key_value_heads", [](json& j) { j["num_key_value_heads"] = 1; }},
      {"quantization_config.weight_block_size", [](json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; }},
      {"quantization_config.fmt", [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; }},
      {"quantization_config.scale_fmt", [](json& j) { j["quantization_config"]["scale_fmt"] = "e4m3"; }},
      {"rope_scaling.type", [](json& j) { j["rope_scaling"]["type"] = "linear"; }},
      {"rope_scaling.mscale_all_dim", [](json& j) { j["rope_scaling"]["mscale_all_dim"] = 0.707; }},
      {"hidden_size", [](json& j) { j["hidden_size"] = "64"; }},
      {"first_k_dense_replace", [](json& j) { j["first_k_dense_replace"] = 9; }},
      {"vocab_size", [](json& j) { j["vocab_size"] = -1; }},
  };
  for (const Case& c : cases) {
    json j = base;
    c.edit(j);
    auto r = deepseek_v32::ParseConfig(j.dump(), "config.json");
    ASSERT_FALSE(r) << c.field;
    EXPECT_NE(r.error().message().find(std::string("config.json: ").append(c.field).append(":")), std::string::npos)
        << c.field << ": " << r.error().message();
  }
}

// Byte offset of a tensor's data in a shard, from its header.
size_t DataOffset(const std::string& shard, const std::string& tensor) {
  std::ifstream in(shard, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  json h = json::parse(header);
  return 8 + n + h[tensor]["data_offsets"][0].get<size_t>();
}

std::string ShardOf(const std::string& dir, const std::string& tensor) {
  return dir + "/" + ReadJson(dir + "/model.safetensors.index.json")["weight_map"][tensor].get<std::string>();
}

void Patch(const std::string& path, size_t offset, const void* bytes, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

TEST(DeepseekV32, HostileCheckpointsFailNamingTheTensor) {
  {  // an FP8 NaN code in a weight
    const std::string d = Copy("nan");
    const std::string name = "model.layers.1.self_attn.q_b_proj.weight";
    const uint8_t nan = 0x7f;
    Patch(ShardOf(d, name), DataOffset(ShardOf(d, name), name) + 5, &nan, 1);
    auto r = OpenModelDir(d);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find(name), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("NaN"), std::string::npos) << r.error().message();
    fs::remove_all(d);
  }
  {  // a zero block scale
    const std::string d = Copy("scale");
    const std::string name = "model.layers.2.mlp.experts.3.down_proj.weight_scale_inv";
    const float zero = 0.0f;
    Patch(ShardOf(d, name), DataOffset(ShardOf(d, name), name), &zero, 4);
    auto r = OpenModelDir(d);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find(name), std::string::npos) << r.error().message();
    fs::remove_all(d);
  }
  {  // a config with one layer fewer: layer 2's tensors are then stray
    const std::string d = Copy("stray");
    json j = ReadJson(d + "/config.json");
    j["num_nextn_predict_layers"] = 0;
    WriteJson(d + "/config.json", j);
    auto r = OpenModelDir(d);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find("model.layers.3."), std::string::npos) << r.error().message();
    fs::remove_all(d);
  }
  {  // a shape that does not match the config
    const std::string d = Copy("shape");
    json j = ReadJson(d + "/config.json");
    j["kv_lora_rank"] = 64;
    WriteJson(d + "/config.json", j);
    auto r = OpenModelDir(d);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find("kv_a_proj_with_mqa.weight"), std::string::npos) << r.error().message();
    fs::remove_all(d);
  }
}

// The model's own greedy continuation of the prompt, `steps` tokens.
std::vector<int> FreeGreedy(Model& model, const std::vector<int>& prompt_tokens, int steps) {
  KvPool pool(8, 16, model.cache_floats_per_token());
  SequenceCache cache = model.NewSequence();
  std::vector<float> logits;
  std::vector<int> out, next(prompt_tokens.begin(), prompt_tokens.begin() + kPrompt);
  for (int k = 0; k < steps; ++k) {
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + static_cast<int>(next.size())));
    ForwardSegment seg{&cache, next, false};  // the last position's logits
    EXPECT_TRUE(model.Forward(pool, std::span(&seg, 1), &logits, nullptr));
    out.push_back(static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    next = {out.back()};
  }
  return out;
}

// Logits of every prompt position and of the teacher-forced continuation.
std::vector<float> TeacherForced(Model& model, const std::vector<int>& tokens) {
  KvPool pool(8, 16, model.cache_floats_per_token());
  SequenceCache cache = model.NewSequence();
  std::vector<float> logits, all;
  std::vector<int> prompt(tokens.begin(), tokens.begin() + kPrompt);
  EXPECT_TRUE(EnsureBlocks(pool, cache, kPrompt));
  ForwardSegment seg{&cache, prompt, true};
  EXPECT_TRUE(model.Forward(pool, std::span(&seg, 1), &logits, nullptr));
  all = logits;
  for (size_t k = kPrompt; k < tokens.size(); ++k) {
    std::vector<int> tok = {tokens[k]};
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + 1));
    ForwardSegment one{&cache, tok, false};
    EXPECT_TRUE(model.Forward(pool, std::span(&one, 1), &logits, nullptr));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// The streamed load (each tensor converted as Model::Load asks for it) gives
// the same model as the converted image: bit-identical logits.
TEST(DeepseekV32, StreamedLoadEqualsTheConvertedImage) {
  const Reference& ref = Ref();
  auto image = OpenModelDir(TinyModel());
  ASSERT_TRUE(image) << image.error().ToString();
  auto streamed = deepseek_v32::OpenDirStreamed(TinyModel());
  ASSERT_TRUE(streamed) << streamed.error().ToString();
  EXPECT_EQ(streamed->checkpoint.AllTensors().size(), 0u);
  auto a = Model::Load(*image), b = Model::Load(*streamed);
  ASSERT_TRUE(a) << a.error().ToString();
  ASSERT_TRUE(b) << b.error().ToString();
  EXPECT_EQ((*a)->resident_weight_bytes(), (*b)->resident_weight_bytes());
  const std::vector<float> la = TeacherForced(**a, ref.tokens), lb = TeacherForced(**b, ref.tokens);
  ASSERT_EQ(la.size(), static_cast<size_t>(ref.positions) * ref.vocab);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
}

// MXFP4 requantisation of the routed experts: every block of the encoded
// experts decodes within MXFP4's rounding of the BF16 values it came from
// (a quarter of the block's largest magnitude: E2M1 steps of at most 2 on a
// scale putting the largest in [4, 8)), and the whole tensor's rms error is
// small; a wrong scale exponent (twice or half every value) fails both.
TEST(DeepseekV32, RequantisedExpertsDecodeNearTheirBf16Values) {
  auto bf16 = deepseek_v32::OpenDir(TinyModel());
  auto mx = deepseek_v32::OpenDir(TinyModel(), ExpertFormat::kMxfp4);
  ASSERT_TRUE(bf16) << bf16.error().ToString();
  ASSERT_TRUE(mx) << mx.error().ToString();
  EXPECT_EQ(mx->config.expert_format, ExpertFormat::kMxfp4);
  int checked = 0;
  for (int layer = 0; layer < bf16->config.num_layers; ++layer) {
    if (!bf16->config.IsMoeLayer(layer)) continue;
    for (const char* w : {"w13", "w2"}) {
      const std::string base = "layers." + std::to_string(layer) + ".ffn.experts." + w;
      const TensorView* ref = bf16->checkpoint.Find(base + ".weight");
      const TensorView* blocks = mx->checkpoint.Find(base + ".blocks");
      const TensorView* scales = mx->checkpoint.Find(base + ".scales");
      ASSERT_TRUE(ref && blocks && scales) << base;
      EXPECT_EQ(mx->checkpoint.Find(base + ".weight"), nullptr);
      const size_t E = static_cast<size_t>(ref->shape[0]), rows = static_cast<size_t>(ref->shape[1]);
      const size_t cols = static_cast<size_t>(ref->shape[2]), n = E * rows * cols;
      std::vector<float> got(n), want(n);
      for (size_t e = 0; e < E; ++e)
        kernels::Mxfp4DecodeMatrix(blocks->data + e * rows * cols / 2, scales->data + e * rows * cols / 32, rows, cols,
                                   got.data() + e * rows * cols);
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, ref->data + 2 * i, 2);
        want[i] = Bf16ToF32(b);
      }
      double err2 = 0, ref2 = 0;
      for (size_t blk = 0; blk < n / 32; ++blk) {
        float amax = 0;
        for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(want[blk * 32 + k]));
        for (size_t k = 0; k < 32; ++k) {
          const double d = static_cast<double>(got[blk * 32 + k]) - want[blk * 32 + k];
          ASSERT_LE(std::fabs(d), 0.25 * amax * (1 + 1e-6)) << base << " element " << blk * 32 + k;
          err2 += d * d;
          ref2 += static_cast<double>(want[blk * 32 + k]) * want[blk * 32 + k];
        }
      }
      const double rel = std::sqrt(err2 / ref2);
      std::printf("%s: rms error of the MXFP4 experts %.4f of the BF16 rms\n", base.c_str(), rel);
      EXPECT_GT(ref2, 0);
      EXPECT_LT(rel, 0.15) << base;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * (bf16->config.num_layers - 1));  // layer 0 is dense
}

// What MXFP4 experts cost against the BF16 path on the tiny random model
// (docs/model-format.md section 10 and 13 give the measured figures):
// teacher-forced logits of the reference's tokens, both loaded streamed.
TEST(DeepseekV32, Mxfp4ExpertsCostAgainstTheBf16Path) {
  const Reference& ref = Ref();
  ModelOptions mx_options;
  mx_options.experts = ExpertFormat::kMxfp4;
  auto bf16_dir = deepseek_v32::OpenDirStreamed(TinyModel());
  auto mx_dir = deepseek_v32::OpenDirStreamed(TinyModel(), ExpertFormat::kMxfp4);
  ASSERT_TRUE(bf16_dir && mx_dir);
  auto bf16 = Model::Load(*bf16_dir);
  auto mx = Model::Load(*mx_dir, mx_options);
  ASSERT_TRUE(bf16) << bf16.error().ToString();
  ASSERT_TRUE(mx) << mx.error().ToString();
  EXPECT_LT((*mx)->resident_weight_bytes(), (*bf16)->resident_weight_bytes());
  const std::vector<float> a = TeacherForced(**bf16, ref.tokens), b = TeacherForced(**mx, ref.tokens);
  const int V = ref.vocab, P = ref.positions;
  ASSERT_EQ(a.size(), static_cast<size_t>(P) * V);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0, sum_rel = 0, sum_cos = 0, lowest_cos = 1;
  int agree = 0;
  for (int p = 0; p < P; ++p) {
    const float* x = &a[static_cast<size_t>(p) * V];
    const float* y = &b[static_cast<size_t>(p) * V];
    double max_ref = 0, max_diff = 0, xy = 0, xx = 0, yy = 0;
    for (int v = 0; v < V; ++v) {
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
  std::printf("MXFP4 experts against BF16: max|dlogit|/max|logit| mean %.4f worst %.4f; cosine mean %.5f lowest %.5f; "
              "argmax agrees at %d of %d positions\n",
              sum_rel / P, worst, sum_cos / P, lowest_cos, agree, P);
  EXPECT_GT(worst, 0);  // the experts really changed
  EXPECT_LT(sum_rel / P, 0.10);  // measured 0.041
  EXPECT_LT(worst, 0.20);         // measured 0.073
  EXPECT_GT(sum_cos / P, 0.99);   // measured 0.9990
  EXPECT_GE(agree, P * 7 / 8);     // measured 30 of 32
  // Free-running greedy decode from the prompt: how many tokens agree
  // before the first difference. A random model's top-2 gaps are mostly
  // smaller than MXFP4's perturbation, so where the runs part is chance
  // (teacher-forced, 1 or 2 of 32 choices differ): 23 of 24 agreed with the
  // other weights rounded to BF16, 9 of 24 with them exact (FP8 kept).
  const std::vector<int> ga = FreeGreedy(**bf16, ref.tokens, 24), gb = FreeGreedy(**mx, ref.tokens, 24);
  const size_t same = static_cast<size_t>(std::mismatch(ga.begin(), ga.end(), gb.begin()).first - ga.begin());
  std::printf("greedy decode: the first %zu of %zu tokens agree\n", same, ga.size());
  EXPECT_GE(same, 8u);  // measured 9 of 24
}

// Int8 indexer scores (ModelOptions::indexer_scores) through the family's
// load: the pool row holds each DSA layer's indexer key as int8 codes and a
// scale (after DeepSeek-V3.2's Hadamard and FP8 rounding), and the logits of
// a teacher-forced run, whose rows past index_topk (8) select, stay near the
// exact scores' logits.
TEST(DeepseekV32, Int8IndexerScoresThroughTheFamily) {
  const Reference& ref = Ref();
  auto dir = deepseek_v32::OpenDirStreamed(TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  ModelOptions int8_options;
  int8_options.indexer_scores = IndexerScores::kInt8;
  auto exact = Model::Load(*dir);
  auto int8 = Model::Load(*dir, int8_options);
  ASSERT_TRUE(exact) << exact.error().ToString();
  ASSERT_TRUE(int8) << int8.error().ToString();
  const ModelConfig& c = dir->config;
  ASSERT_TRUE(c.dsa.index_fp8);
  size_t dsa_layers = 0;
  for (LayerKind k : c.layer_types) dsa_layers += k == LayerKind::kDsa;
  ASSERT_GT(dsa_layers, 0u);
  const int ID = c.dsa.index_head_dim;
  EXPECT_EQ((*exact)->cache_floats_per_token() - (*int8)->cache_floats_per_token(),
            dsa_layers * (static_cast<size_t>(ID) - kernels::IndexerInt8KeyFloats(ID)));
  const std::vector<float> a = TeacherForced(**exact, ref.tokens), b = TeacherForced(**int8, ref.tokens);
  const int V = ref.vocab, P = ref.positions;
  ASSERT_EQ(a.size(), static_cast<size_t>(P) * V);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0, sum_rel = 0;
  int agree = 0;
  for (int p = 0; p < P; ++p) {
    const float* x = &a[static_cast<size_t>(p) * V];
    const float* y = &b[static_cast<size_t>(p) * V];
    double max_ref = 0, max_diff = 0;
    for (int v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(x[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[v]) - x[v]));
    }
    worst = std::max(worst, max_diff / max_ref);
    sum_rel += max_diff / max_ref;
    agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
  }
  std::printf("int8 indexer scores against exact: max|dlogit|/max|logit| mean %.4f worst %.4f; argmax agrees at %d of %d\n",
              sum_rel / P, worst, agree, P);
  EXPECT_LT(sum_rel / P, 0.03);  // measured 0.0063
  EXPECT_LT(worst, 0.25);         // measured 0.082
  EXPECT_GE(agree, P * 7 / 8);    // measured 31 of 32
}

// Requantisation at load belongs to a family that converts: asking a model
// stored with BF16 experts for MXFP4 through Model::Load alone is refused.
TEST(DeepseekV32, ExpertFormatMismatchIsRefused) {
  auto dir = OpenModelDir(TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  ModelOptions mo;
  mo.experts = ExpertFormat::kMxfp4;
  auto model = Model::Load(*dir, mo);
  ASSERT_FALSE(model);
  EXPECT_NE(model.error().message().find("experts: mxfp4 requested"), std::string::npos) << model.error().message();
}

// A directory written converted (what `moe-daemon publish --experts mxfp4`
// uploads) loads with no conversion and gives bit-identical logits to the
// requantisation at load; what it refuses names the directory or field.
TEST(DeepseekV32, ConvertedDirectoryLoadsAsTheRequantisationAtLoad) {
  const Reference& ref = Ref();
  const std::string out = Temp("converted");
  fs::remove_all(out);
  // Small shards, so that the index spreads the tensors over several.
  ASSERT_TRUE(deepseek_v32::WriteConverted(TinyModel(), out, ExpertFormat::kMxfp4, 8u << 20));
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_GT(ReadJson(out + "/model.safetensors.index.json")["weight_map"]["head.weight"].get<std::string>().size(), 0u);
  EXPECT_EQ(ReadJson(out + "/config.json")["moeserve_converted"]["routed_experts"], "mxfp4");

  auto converted = deepseek_v32::OpenDirStreamed(out);
  ASSERT_TRUE(converted) << converted.error().ToString();
  EXPECT_EQ(converted->config.expert_format, ExpertFormat::kMxfp4);
  EXPECT_EQ(converted->source, nullptr);  // mapped, nothing converted
  EXPECT_NE(converted->checkpoint.Find("layers.1.ffn.experts.w13.blocks"), nullptr);
  auto at_load = deepseek_v32::OpenDirStreamed(TinyModel(), ExpertFormat::kMxfp4);
  ASSERT_TRUE(at_load) << at_load.error().ToString();
  ModelOptions mx;
  mx.experts = ExpertFormat::kMxfp4;
  auto a = Model::Load(*converted, mx), b = Model::Load(*at_load, mx);
  ASSERT_TRUE(a) << a.error().ToString();
  ASSERT_TRUE(b) << b.error().ToString();
  const std::vector<float> la = TeacherForced(**a, ref.tokens), lb = TeacherForced(**b, ref.tokens);
  ASSERT_EQ(la.size(), static_cast<size_t>(ref.positions) * ref.vocab);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
  // The engine serves it like the published directory.
  auto engine = Engine::Open(out, EngineOptions{});
  ASSERT_TRUE(engine) << engine.error().ToString();

  // Asking it for the other format, converting it again, overwriting it.
  auto other = deepseek_v32::OpenDirStreamed(out, ExpertFormat::kBf16);
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message().find("holds its routed experts converted to mxfp4"), std::string::npos)
      << other.error().message();
  auto again = deepseek_v32::WriteConverted(out, out + "_2", ExpertFormat::kMxfp4);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message().find("already converted"), std::string::npos) << again.error().message();
  auto over = deepseek_v32::WriteConverted(TinyModel(), out, ExpertFormat::kMxfp4);
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().message().find("already exists"), std::string::npos) << over.error().message();

  // A marker naming a format the engine does not hold.
  json cfg = ReadJson(out + "/config.json");
  cfg["moeserve_converted"]["routed_experts"] = "fp8";
  WriteJson(out + "/config.json", cfg);
  auto bad = deepseek_v32::OpenDirStreamed(out);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("moeserve_converted.routed_experts: 'fp8' is not"), std::string::npos)
      << bad.error().message();
  fs::remove_all(out);
}

// A converted directory is a checkpoint a tenant could publish by hand: its
// FP8 matrices are checked as the published ones are (a bad block scale or a
// NaN code is refused naming the tensor, never multiplied).
TEST(DeepseekV32, HostileConvertedFp8TensorsFailNamingTheTensor) {
  const auto converted = [](const std::string& tag) {
    const std::string out = Temp(tag);
    fs::remove_all(out);
    EXPECT_TRUE(deepseek_v32::WriteConverted(TinyModel(), out, ExpertFormat::kMxfp4));
    return out;
  };
  const auto refusal = [](const std::string& dir) {
    auto e = Engine::Open(dir, EngineOptions{});
    EXPECT_FALSE(e) << dir << " loaded";
    return e ? std::string() : e.error().message();
  };
  for (const float bad : {0.0f, -0.5f, std::numeric_limits<float>::infinity()}) {
    const std::string d = converted("hostile_scale");
    const std::string name = "layers.1.attn.wq_a.weight_scale_inv";
    Patch(ShardOf(d, name), DataOffset(ShardOf(d, name), name), &bad, sizeof bad);  // block 0
    const std::string why = refusal(d);
    EXPECT_NE(why.find(name), std::string::npos) << why;
    EXPECT_NE(why.find("is not a positive finite number"), std::string::npos) << why;
    fs::remove_all(d);
  }
  {
    const std::string d = converted("hostile_code");
    const std::string name = "layers.1.attn.wq_b.weight";
    const uint8_t nan = 0xff;  // S.1111.111
    Patch(ShardOf(d, name), DataOffset(ShardOf(d, name), name) + 9, &nan, 1);
    const std::string why = refusal(d);
    EXPECT_NE(why.find(name), std::string::npos) << why;
    EXPECT_NE(why.find("NaN"), std::string::npos) << why;
    fs::remove_all(d);
  }
}

// The largest max|a - ref| / max|ref| over the logits rows of positions
// [first, first + rows) (a holds those rows in order).
double WorstRelative(const std::vector<float>& a, const Reference& ref, int first, int rows) {
  const int V = ref.vocab;
  double worst = 0;
  for (int p = 0; p < rows; ++p) {
    const float* x = &a[static_cast<size_t>(p) * V];
    const float* b = &ref.logits[static_cast<size_t>(first + p) * V];
    double max_ref = 0, max_diff = 0;
    for (int v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(x[v]) - b[v]));
    }
    worst = std::max(worst, max_diff / max_ref);
  }
  return worst;
}

// FP8 weights held as published (model.md 13). The tiny checkpoint's block
// scales are floats, not powers of two (written with --scales float): the
// matrices the engine only multiplies stay FP8 beside their "_scale_inv"
// scales, kv_b_proj (indexed element-wise by the absorbed form) converts to
// F32, and the logits of every prompt position (prefill), every
// teacher-forced decode step, and two sequences decoded as one batch match
// the fp32 reference, which applies the scales in fp32 to the unrounded
// weights as upstream's fp8_gemm does, within 1e-5 of max|ref|. Rounding
// code * scale to BF16 at load (the loader before FP8 was kept) misses the
// bound by two orders of magnitude on this checkpoint.
constexpr double kFp8Tolerance = 1e-5;

TEST(DeepseekV32, FloatBlockScalesGiveTheFp32ReferencesLogits) {
  const Reference& ref = Ref();
  auto image = OpenModelDir(TinyModel());
  ASSERT_TRUE(image) << image.error().ToString();
  const auto dtype = [&](const std::string& name) {
    const TensorView* t = image->checkpoint.Find(name);
    EXPECT_TRUE(t) << name;
    return t ? t->dtype : DType::kBool;
  };
  for (const char* m : {"attn.wq_a", "attn.wq_b", "attn.wkv_a", "attn.wo", "attn.indexer.wq_b", "attn.indexer.wk",
                        "ffn.shared.w1", "ffn.shared.w3", "ffn.shared.w2"}) {
    EXPECT_EQ(dtype(std::string("layers.1.") + m + ".weight"), DType::kF8E4M3) << m;
    EXPECT_EQ(dtype(std::string("layers.1.") + m + ".weight_scale_inv"), DType::kF32) << m;
  }
  for (const char* m : {"ffn.w1", "ffn.w3", "ffn.w2"}) EXPECT_EQ(dtype(std::string("layers.0.") + m + ".weight"), DType::kF8E4M3);
  EXPECT_EQ(dtype("mtp.0.eh_proj.weight"), DType::kF8E4M3);
  EXPECT_EQ(dtype("layers.1.attn.wkv_b.weight"), DType::kF32);
  EXPECT_EQ(dtype("layers.1.ffn.experts.w13.weight"), DType::kBF16);  // routed experts: the experts setting's
  EXPECT_EQ(dtype("embed.weight"), DType::kBF16);                     // published BF16

  auto dir = deepseek_v32::OpenDirStreamed(TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  ModelOptions mo;
  mo.kernels = KernelChoice::kReference;
  auto model = Model::Load(*dir, mo);
  ASSERT_TRUE(model) << model.error().ToString();
  ASSERT_EQ(ref.positions, kPrompt + kDecode);
  const std::vector<float> all = TeacherForced(**model, ref.tokens);
  ASSERT_EQ(all.size(), static_cast<size_t>(ref.positions) * ref.vocab);
  const double prefill = WorstRelative(all, ref, 0, kPrompt);
  const std::vector<float> decoded(all.begin() + static_cast<ptrdiff_t>(kPrompt) * ref.vocab, all.end());
  const double decode = WorstRelative(decoded, ref, kPrompt, kDecode);

  // Two sequences of the same tokens decoded as one batch (2 rows through
  // every product) after their prompts.
  KvPool pool(16, 16, (*model)->cache_floats_per_token());
  SequenceCache ca = (*model)->NewSequence(), cb = (*model)->NewSequence();
  std::vector<int> prompt(ref.tokens.begin(), ref.tokens.begin() + kPrompt);
  std::vector<float> logits, batched;
  for (SequenceCache* c : {&ca, &cb}) {
    ASSERT_TRUE(EnsureBlocks(pool, *c, kPrompt));
    ForwardSegment seg{c, prompt, false};
    ASSERT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &logits));
  }
  double batch = 0;
  for (int step = 0; step < kDecode; ++step) {
    const std::vector<int> tok = {ref.tokens[static_cast<size_t>(kPrompt + step)]};
    ASSERT_TRUE(EnsureBlocks(pool, ca, ca.length + 1));
    ASSERT_TRUE(EnsureBlocks(pool, cb, cb.length + 1));
    ForwardSegment segs[2] = {{&ca, tok, false}, {&cb, tok, false}};
    ASSERT_TRUE((*model)->Forward(pool, std::span(segs, 2), &logits));
    ASSERT_EQ(logits.size(), 2u * ref.vocab);
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> row(logits.begin() + static_cast<ptrdiff_t>(r) * ref.vocab,
                                   logits.begin() + static_cast<ptrdiff_t>(r + 1) * ref.vocab);
      batch = std::max(batch, WorstRelative(row, ref, kPrompt + step, 1));
    }
  }
  std::printf("FP8 kept, float block scales: worst max|logit - ref| / max|ref| prefill %.3g, decode %.3g, "
              "batched decode %.3g (bound %.0e)\n", prefill, decode, batch, kFp8Tolerance);
  EXPECT_LE(prefill, kFp8Tolerance);
  EXPECT_LE(decode, kFp8Tolerance);
  EXPECT_LE(batch, kFp8Tolerance);
}

// Float block scales convert kv_b_proj to F32; the absorbed form's per-head
// products (W_uk^T q_nope, W_uv lat) then run as one fp32 GEMM per head over
// a block of at least 16 rows (attention_mla.cpp, head_gemms), not a
// matrix-vector product per row and head. A 48-token prefill with the fast
// kernels, whose rows after index_topk are sparse (index_topk 8: 40 sparse
// rows in one block) or all causal (index_topk 2048: 48 dense rows in one
// block), gives every position's logits within 1e-5 of max|logit| of the
// reference kernels' expanded form on the same checkpoint.
TEST(DeepseekV32, Fp32KvBHeadGemmsAgreeWithTheReferenceForm) {
  const std::string dense = Temp("dense_topk");
  fs::remove_all(dense);
  const std::string cmd = Script() + "write --out " + dense + " --layers 2 --index-topk 2048 --scales float 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  constexpr int kRows = 48;
  for (const std::string& d : {TinyModel(), dense}) {
    auto logits = [&](KernelChoice kc) {
      auto dir = deepseek_v32::OpenDirStreamed(d);
      EXPECT_TRUE(dir) << dir.error().ToString();
      if (!dir) return std::vector<float>();
      EXPECT_EQ(dir->config.mla.num_heads, 4);
      ModelOptions mo;
      mo.kernels = kc;
      auto model = Model::Load(*dir, mo);
      EXPECT_TRUE(model) << model.error().ToString();
      if (!model) return std::vector<float>();
      std::vector<int> prompt;
      for (int i = 0; i < kRows; ++i) prompt.push_back((i * 7919 + 11) % dir->config.vocab_size);
      KvPool pool(kRows / 16 + 2, 16, (*model)->cache_floats_per_token());
      SequenceCache cache = (*model)->NewSequence();
      EXPECT_TRUE(EnsureBlocks(pool, cache, kRows));
      ForwardSegment seg{&cache, prompt, true};
      std::vector<float> out;
      EXPECT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &out));
      return out;
    };
    const std::vector<float> fast = logits(KernelChoice::kFast), ref = logits(KernelChoice::kReference);
    ASSERT_FALSE(ref.empty());
    ASSERT_EQ(fast.size(), ref.size());
    const size_t V = ref.size() / kRows;
    double worst = 0;
    for (int p = 0; p < kRows; ++p) {
      double mx = 0, diff = 0;
      for (size_t v = 0; v < V; ++v) {
        const size_t i = static_cast<size_t>(p) * V + v;
        mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
        diff = std::max(diff, std::fabs(static_cast<double>(fast[i]) - ref[i]));
      }
      ASSERT_GT(mx, 0) << "position " << p;
      worst = std::max(worst, diff / mx);
    }
    std::printf("%s: fast (per-head fp32 GEMMs) against reference kernels, worst %.3g of max|logit|\n", d.c_str(), worst);
    EXPECT_LE(worst, 1e-5) << d;
  }
  fs::remove_all(dense);
}

// What a decode step reads, counted from the converted tensors themselves:
// FP8 matrices one byte a weight plus their block scales, BF16 two, F32 four
// (kv_b_proj, norms), every tensor of the layers and the head; the
// embedding, the routed experts and the MTP module apart.
TEST(DeepseekV32, DecodeReadsTheFp8MatricesAsOneByteAWeight) {
  auto image = OpenModelDir(TinyModel());
  ASSERT_TRUE(image) << image.error().ToString();
  auto model = Model::Load(*image);
  ASSERT_TRUE(model) << model.error().ToString();
  double dense = 0, fp8_bytes = 0;
  for (const TensorView* t : image->checkpoint.AllTensors()) {
    if (t->name == "embed.weight" || t->name.starts_with("mtp.") || t->name.find(".ffn.experts.") != std::string::npos)
      continue;
    dense += static_cast<double>(t->nbytes);
    if (t->dtype == DType::kF8E4M3) fp8_bytes += static_cast<double>(t->nbytes);
  }
  EXPECT_GT(fp8_bytes, 0.0);
  const DecodeWeightBytes w = (*model)->decode_weight_bytes();
  EXPECT_EQ(w.dense, dense);
  std::printf("decode reads %.0f dense bytes, %.0f of them FP8 codes\n", w.dense, fp8_bytes);
}

// Power-of-two block scales (a UE8M0 release): kv_b_proj converts to BF16,
// which is exact then (and half F32's memory); the rest stays FP8; the
// logits still match the fp32 reference within the bound.
TEST(DeepseekV32, PowerOfTwoBlockScalesConvertKvBToBf16Exactly) {
  const std::string d = Temp("pow2");
  fs::remove_all(d);
  const std::string cmd = Script() + "write --out " + d + " --layers 2 --index-topk 8 --scales pow2 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto image = OpenModelDir(d);
  ASSERT_TRUE(image) << image.error().ToString();
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".attn.";
    const TensorView* kvb = image->checkpoint.Find(p + "wkv_b.weight");
    const TensorView* wo = image->checkpoint.Find(p + "wo.weight");
    ASSERT_TRUE(kvb && wo) << p;
    EXPECT_EQ(kvb->dtype, DType::kBF16) << p;
    EXPECT_EQ(wo->dtype, DType::kF8E4M3) << p;
  }
  Reference ref;
  auto cfg = deepseek_v32::LoadConfig(d);
  ASSERT_TRUE(cfg) << cfg.error().ToString();
  ASSERT_TRUE(RunReference(d, Prompt(cfg->model.vocab_size), kDecode, &ref));
  ModelOptions mo;
  mo.kernels = KernelChoice::kReference;
  auto model = Model::Load(*image, mo);
  ASSERT_TRUE(model) << model.error().ToString();
  const std::vector<float> all = TeacherForced(**model, ref.tokens);
  ASSERT_EQ(all.size(), static_cast<size_t>(ref.positions) * ref.vocab);
  const double worst = WorstRelative(all, ref, 0, ref.positions);
  std::printf("power-of-two block scales: worst max|logit - ref| / max|ref| %.3g\n", worst);
  EXPECT_LE(worst, kFp8Tolerance);
  fs::remove_all(d);
}

// The shared checkpoint (about 57 MB) goes when the tests end.
class RemoveTinyModel : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(Temp("model")); }
};
const auto* const kRemoveTinyModel = ::testing::AddGlobalTestEnvironment(new RemoveTinyModel);

}  // namespace
}  // namespace moeserve::engine
