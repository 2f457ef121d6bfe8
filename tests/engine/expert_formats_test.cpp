// BF16 routed experts against MXFP4 routed experts of the same checkpoint,
// one test per family, each loaded as a node loads it: what MXFP4 costs in
// logits (max|dlogit| / max|logit| per position, mean and worst, over the
// prompt and a teacher-forced continuation), in argmax agreement at those
// positions, and in greedy decode (how many of N free-running tokens agree
// before the first difference). docs/model-format.md ("Expert formats per
// family") has the measured table; the bounds here hold it with margin.
//
//  * moe-dsa-v1: the trained tiny agent's bf16/ checkpoint, BF16 against
//    its experts requantised at load (experts: mxfp4) and against the
//    directory `moe-daemon publish --experts mxfp4` writes (bit-identical);
//  * Qwen3-Next and DeepSeek-V3.2: tiny random checkpoints in the published
//    layout (the families' reference writers), BF16 (FP8 dequantised for
//    DeepSeek) against the converted MXFP4 directory, which must give the
//    requantisation at load's logits bit for bit; a scale of the converted
//    directory corrupted must break the bounds;
//  * gpt-oss: published MXFP4 (the format it was trained in), so its BF16
//    experts are the MXFP4 values decoded, exactly: the engine's MXFP4
//    kernels against the fp32 reference on those values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

#include "gpt_oss_solo.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/safetensors.hpp"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

std::string Temp(const std::string& tag) {
  return ::testing::TempDir() + "/moe_expert_formats_" + tag + "_" + std::to_string(::getpid());
}

// What MXFP4 experts cost against BF16 experts.
struct Regression {
  int positions = 0;
  double mean_rel = 0, worst_rel = 0;  // max|dlogit| / max|logit| (BF16's) per position
  int argmax_agree = 0;
  int greedy_steps = 0, greedy_same = 0;  // free-running greedy tokens agreeing before the first difference
};

// The bounds a family's figures must hold.
struct Bounds {
  double mean_rel, worst_rel;
  double argmax_share;  // of the positions
  int greedy_same;      // of greedy_steps
};

// What falls outside the bounds, one line each (empty: all within).
std::vector<std::string> Outside(const Regression& r, const Bounds& b) {
  std::vector<std::string> out;
  if (!(r.mean_rel <= b.mean_rel)) out.push_back("mean max|dlogit|/max|logit| " + std::to_string(r.mean_rel));
  if (!(r.worst_rel <= b.worst_rel)) out.push_back("worst max|dlogit|/max|logit| " + std::to_string(r.worst_rel));
  if (r.argmax_agree < b.argmax_share * r.positions)
    out.push_back("argmax agrees at " + std::to_string(r.argmax_agree) + " of " + std::to_string(r.positions));
  if (r.greedy_same < b.greedy_same)
    out.push_back("greedy agrees for " + std::to_string(r.greedy_same) + " of " + std::to_string(r.greedy_steps));
  return out;
}

void Print(const char* family, const Regression& r) {
  std::printf("%s: MXFP4 vs BF16 experts over %d positions: max|dlogit|/max|logit| mean %.3g worst %.3g; argmax agrees "
              "at %d of %d; greedy: the first %d of %d tokens agree\n",
              family, r.positions, r.mean_rel, r.worst_rel, r.argmax_agree, r.positions, r.greedy_same, r.greedy_steps);
}

// Per-position figures of two [positions, V] logit tables (a: BF16's).
void CompareLogits(const std::vector<float>& a, const std::vector<float>& b, size_t V, Regression* r) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(V, 0u);
  r->positions = static_cast<int>(a.size() / V);
  ASSERT_GT(r->positions, 0);
  double sum = 0;
  for (int p = 0; p < r->positions; ++p) {
    const float* x = &a[static_cast<size_t>(p) * V];
    const float* y = &b[static_cast<size_t>(p) * V];
    double max_ref = 0, max_diff = 0;
    for (size_t v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(x[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[v]) - x[v]));
    }
    ASSERT_GT(max_ref, 0) << "position " << p;
    sum += max_diff / max_ref;
    r->worst_rel = std::max(r->worst_rel, max_diff / max_ref);
    r->argmax_agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
  }
  r->mean_rel = sum / r->positions;
}

// Greedy decode of `steps` tokens after the prompt.
std::vector<int> Greedy(const Model& m, const std::vector<int>& prompt, int steps) {
  KvPool pool(64, 16, m.cache_floats_per_token());
  SequenceCache cache = m.NewSequence();
  std::vector<int> out, next = prompt;
  std::vector<float> logits;
  for (int k = 0; k < steps; ++k) {
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + static_cast<int64_t>(next.size())));
    ForwardSegment seg{&cache, next, false};
    auto st = m.Forward(pool, std::span<ForwardSegment>(&seg, 1), &logits);
    EXPECT_TRUE(st) << st.error().ToString();
    if (!st || logits.empty()) break;
    out.push_back(static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    next = {out.back()};
  }
  ReleaseBlocks(pool, cache);
  return out;
}

// Every position's logits of `tokens`, in one prefill.
std::vector<float> AllLogits(const Model& m, const std::vector<int>& tokens) {
  KvPool pool(64, 16, m.cache_floats_per_token());
  SequenceCache cache = m.NewSequence();
  std::vector<float> logits;
  EXPECT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(tokens.size())));
  ForwardSegment seg{&cache, tokens, true};
  auto st = m.Forward(pool, std::span<ForwardSegment>(&seg, 1), &logits);
  EXPECT_TRUE(st) << st.error().ToString();
  ReleaseBlocks(pool, cache);
  return logits;
}

// The figures of two models on the layer graph: greedy from the prompt, then
// the prompt and BF16's greedy continuation teacher-forced through both.
Regression Measure(const Model& bf16, const Model& mx, const std::vector<int>& prompt, int steps) {
  Regression r;
  const std::vector<int> ga = Greedy(bf16, prompt, steps), gb = Greedy(mx, prompt, steps);
  EXPECT_EQ(ga.size(), static_cast<size_t>(steps));
  EXPECT_EQ(gb.size(), ga.size());
  r.greedy_steps = static_cast<int>(ga.size());
  r.greedy_same = static_cast<int>(std::mismatch(ga.begin(), ga.end(), gb.begin(), gb.end()).first - ga.begin());
  std::vector<int> tokens = prompt;
  tokens.insert(tokens.end(), ga.begin(), ga.end());
  const std::vector<float> la = AllLogits(bf16, tokens), lb = AllLogits(mx, tokens);
  CompareLogits(la, lb, la.size() / tokens.size(), &r);
  return r;
}

std::unique_ptr<Model> Load(const std::string& dir, std::optional<ExpertFormat> experts) {
  ModelOptions mo;
  mo.experts = experts;
  auto m = LoadLayerGraph(dir, mo);
  EXPECT_TRUE(m) << dir << ": " << m.error().ToString();
  if (!m) return nullptr;
  if (experts) {
    EXPECT_EQ((*m)->config().expert_format, *experts);
  }
  return std::move(*m);
}

// `moe-daemon publish --experts mxfp4`'s conversion, through the registry.
std::string Converted(const std::string& dir, const std::string& tag) {
  const std::string out = Temp(tag);
  fs::remove_all(out);
  auto family = FindFamily(dir);
  EXPECT_TRUE(family) << family.error().ToString();
  if (!family || !(*family)->write_converted) return ADD_FAILURE() << dir << ": no conversion", out;
  auto st = (*family)->write_converted(dir, out, ConversionOptions{.experts = ExpertFormat::kMxfp4});
  EXPECT_TRUE(st) << st.error().ToString();
  auto held = (*family)->converted_experts(out);
  EXPECT_TRUE(held && *held == ExpertFormat::kMxfp4) << out;
  return out;
}

// Logits of every position of `tokens` must be the same bits.
void ExpectSameLogits(const Model& a, const Model& b, const std::vector<int>& tokens, const std::string& what) {
  const std::vector<float> la = AllLogits(a, tokens), lb = AllLogits(b, tokens);
  ASSERT_EQ(la.size(), lb.size()) << what;
  ASSERT_FALSE(la.empty()) << what;
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0) << what;
}

// Where `tensor`'s bytes start in its shard of DIR (the shard's header says),
// and the shard.
struct TensorPlace {
  std::string file;
  uint64_t offset = 0, nbytes = 0, per_first_dim = 0;
};
TensorPlace Place(const std::string& dir, const std::string& tensor) {
  TensorPlace place;
  auto ck = Checkpoint::Open(dir);
  EXPECT_TRUE(ck) << ck.error().ToString();
  if (!ck) return place;
  const TensorView* t = ck->Find(tensor);
  EXPECT_NE(t, nullptr) << tensor;
  if (!t) return place;
  place.file = *t->file;
  place.nbytes = t->nbytes;
  place.per_first_dim = t->nbytes / static_cast<size_t>(t->shape[0]);
  std::ifstream f(place.file, std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string header(n, ' ');
  f.read(header.data(), static_cast<std::streamsize>(n));
  place.offset = 8 + n + nlohmann::json::parse(header).at(tensor).at("data_offsets")[0].get<uint64_t>();
  return place;
}

// Rewrites `bytes` at `offset` of `file`.
void Poke(const std::string& file, uint64_t offset, const std::vector<char>& bytes) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << file;
}

// One expert's MXFP4 scales raised by 2 (expert 0's: the first dimension's
// first slice; its weights four times too large): what a wrong scale in a
// written directory does.
void CorruptScales(const std::string& dir, const std::string& tensor) {
  const TensorPlace p = Place(dir, tensor);
  ASSERT_FALSE(p.file.empty()) << tensor;
  std::vector<char> scales(p.per_first_dim);
  {
    std::ifstream in(p.file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(p.offset));
    in.read(scales.data(), static_cast<std::streamsize>(scales.size()));
  }
  for (char& c : scales) c = static_cast<char>(static_cast<uint8_t>(c) + 2);
  Poke(p.file, p.offset, scales);
}

// BF16 element `element` of `tensor` set to `bits` (a NaN or an infinity).
void SetBf16(const std::string& dir, const std::string& tensor, uint64_t element, uint16_t bits) {
  const TensorPlace p = Place(dir, tensor);
  ASSERT_FALSE(p.file.empty()) << tensor;
  ASSERT_LT(2 * element, p.nbytes);
  Poke(p.file, p.offset + 2 * element, {static_cast<char>(bits & 0xFF), static_cast<char>(bits >> 8)});
}

// The bounds must catch a wrong scale: expert 0's scales of both stacks in
// every MoE layer of the converted directory raised by 2, the figures of
// that model against BF16 outside at least one bound.
void ExpectCorruptScalesCaught(const Model& bf16, const std::string& converted, const std::vector<int>& prompt, int steps,
                               const Bounds& bounds, const std::string& family) {
  for (int layer = 0; layer < bf16.config().num_layers; ++layer)
    if (bf16.config().IsMoeLayer(layer))
      for (const char* w : {"w13", "w2"})
        CorruptScales(converted, "layers." + std::to_string(layer) + ".ffn.experts." + w + ".scales");
  auto corrupt = LoadLayerGraph(converted, ModelOptions{});
  ASSERT_TRUE(corrupt) << corrupt.error().ToString();
  const Regression c = Measure(bf16, **corrupt, prompt, steps);
  Print((family + " with expert 0's scales raised by 2").c_str(), c);
  EXPECT_FALSE(Outside(c, bounds).empty()) << family << ": a corrupted MXFP4 scale stays within the bounds";
}

// moe-dsa-v1: the trained tiny agent (models/tiny-agent/bf16), asked a
// question in its chat format; its experts requantised at load and in the
// directory publish writes.
TEST(ExpertFormats, MoeDsaV1TinyAgent) {
  const std::string dir = Root() + "/models/tiny-agent/bf16";
  auto prompt = RenderChat({ChatMessage(ChatRole::kUser, "What is 182+265? Then convert 47 kg to g.")}, nullptr, true);
  ASSERT_TRUE(prompt) << prompt.error().ToString();
  auto bf16 = Load(dir, std::nullopt), mx = Load(dir, ExpertFormat::kMxfp4);
  ASSERT_TRUE(bf16 && mx);
  EXPECT_EQ(bf16->config().expert_format, ExpertFormat::kBf16);
  EXPECT_LT(mx->routed_expert_bytes() * 10, bf16->routed_expert_bytes() * 3);
  const Regression r = Measure(*bf16, *mx, *prompt, 32);
  Print("moe-dsa-v1 (tiny agent)", r);
  EXPECT_GT(r.worst_rel, 0);  // the experts really changed
  // Measured (AVX-512): mean 0.037, worst 0.228, argmax 78 of 78, greedy 32 of 32.
  const Bounds b{.mean_rel = 0.06, .worst_rel = 0.35, .argmax_share = 0.95, .greedy_same = 28};
  for (const std::string& why : Outside(r, b)) ADD_FAILURE() << why;

  // The published form: its experts MXFP4 on disk, the same bits as at load.
  const std::string out = Converted(dir, "moe_dsa_v1");
  auto converted = Load(out, std::nullopt);
  ASSERT_TRUE(converted);
  EXPECT_EQ(converted->config().expert_format, ExpertFormat::kMxfp4);
  auto ck = Checkpoint::Open(out);
  ASSERT_TRUE(ck);
  EXPECT_NE(ck->Find("layers.1.ffn.experts.w13.blocks"), nullptr);
  EXPECT_EQ(ck->Find("layers.1.ffn.experts.w13.weight"), nullptr);
  ExpectSameLogits(*mx, *converted, *prompt, "the converted directory against the requantisation at load");
  ExpectCorruptScalesCaught(*bf16, out, *prompt, 32, b, "moe-dsa-v1");
  fs::remove_all(out);
}

// Qwen3-Next's tiny random checkpoint (published BF16 experts).
TEST(ExpertFormats, Qwen3Next) {
  const std::string dir = Temp("qwen3_next");
  fs::remove_all(dir);
  const std::string write = "/usr/bin/python3 " + Root() + "/tools/reference/families/qwen3_next.py write --out " + dir +
                            " --vocab 4096 --seed 3 2>&1";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  const std::vector<int> prompt = {4000, 872, 198, 970, 0, 5, 77, 1200, 33, 8, 900, 4, 61, 99, 100, 101,
                                   102, 103, 104, 105, 3000, 4095};
  auto bf16 = Load(dir, std::nullopt), at_load = Load(dir, ExpertFormat::kMxfp4);
  ASSERT_TRUE(bf16 && at_load);
  const std::string out = Converted(dir, "qwen3_next_mxfp4");
  auto mx = Load(out, std::nullopt);
  ASSERT_TRUE(mx);
  EXPECT_EQ(mx->config().expert_format, ExpertFormat::kMxfp4);
  ExpectSameLogits(*at_load, *mx, prompt, "the converted directory against the requantisation at load");
  const Regression r = Measure(*bf16, *mx, prompt, 16);
  Print("qwen3_next (tiny random)", r);
  EXPECT_GT(r.worst_rel, 0);
  // Measured (AVX-512): mean 0.161, worst 0.436, argmax 29 of 38, greedy 3 of 16.
  const Bounds b{.mean_rel = 0.25, .worst_rel = 0.7, .argmax_share = 0.6, .greedy_same = 1};
  for (const std::string& why : Outside(r, b)) ADD_FAILURE() << why;
  ExpectCorruptScalesCaught(*bf16, out, prompt, 16, b, "qwen3_next");
  fs::remove_all(out);
  fs::remove_all(dir);
}

// DeepSeek-V3.2's tiny random checkpoint (published FP8, dequantised to BF16).
TEST(ExpertFormats, DeepseekV32) {
  const std::string dir = Temp("deepseek_v32");
  fs::remove_all(dir);
  const std::string write = "/usr/bin/python3 " + Root() + "/tools/reference/families/deepseek_v32.py write --out " +
                            dir + " --layers 3 --index-topk 8 2>&1";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  std::vector<int> prompt;
  uint64_t s = 7;
  while (prompt.size() < 20) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    prompt.push_back(static_cast<int>((s >> 33) % 1000));
  }
  auto bf16 = Load(dir, std::nullopt), at_load = Load(dir, ExpertFormat::kMxfp4);
  ASSERT_TRUE(bf16 && at_load);
  const std::string out = Converted(dir, "deepseek_v32_mxfp4");
  auto mx = Load(out, std::nullopt);
  ASSERT_TRUE(mx);
  EXPECT_EQ(mx->config().expert_format, ExpertFormat::kMxfp4);
  ExpectSameLogits(*at_load, *mx, prompt, "the converted directory against the requantisation at load");
  const Regression r = Measure(*bf16, *mx, prompt, 24);
  Print("deepseek_v32 (tiny random)", r);
  EXPECT_GT(r.worst_rel, 0);
  // Measured (AVX-512): mean 0.049, worst 0.165, argmax 39 of 44, greedy 3 of 24.
  const Bounds b{.mean_rel = 0.10, .worst_rel = 0.30, .argmax_share = 0.75, .greedy_same = 2};
  for (const std::string& why : Outside(r, b)) ADD_FAILURE() << why;
  ExpectCorruptScalesCaught(*bf16, out, prompt, 24, b, "deepseek_v32");
  fs::remove_all(out);
  fs::remove_all(dir);
}

// gpt-oss: the published MXFP4 experts through the engine's kernels against
// the fp32 reference on their decoded (BF16-exact) values.
TEST(ExpertFormats, GptOss) {
  const std::string dir = Temp("gpt_oss");
  fs::remove_all(dir);
  const std::string script = "/usr/bin/python3 " + Root() + "/tools/reference/gpt_oss.py ";
  const std::string write = script + "write --out " + dir + " --layers 2 --vocab 1000 2>&1";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  auto model = GptOssModel::Load(dir, kernels::BestIsa());
  ASSERT_TRUE(model) << model.error().ToString();
  const int V = (*model)->config().vocab;
  std::vector<int> prompt;
  uint64_t s = 11;
  while (prompt.size() < 24) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    prompt.push_back(static_cast<int>((s >> 33) % static_cast<uint64_t>(V)));
  }
  constexpr int kSteps = 16;
  std::string ids;
  for (int t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string ref = dir + "_ref";
  const std::string run = script + "run --model " + dir + " --tokens " + ids + " --decode " + std::to_string(kSteps) +
                          " --out " + ref + " 2>&1";
  ASSERT_EQ(std::system(run.c_str()), 0) << run;
  std::ifstream mf(ref + "/meta.json");
  const auto meta = nlohmann::json::parse(mf);
  const std::vector<int> tokens = meta["tokens"].get<std::vector<int>>();
  const std::vector<int> greedy = meta["greedy_tokens"].get<std::vector<int>>();
  std::vector<float> want(tokens.size() * static_cast<size_t>(V));
  std::ifstream lf(ref + "/logits.f32", std::ios::binary);
  lf.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
  ASSERT_EQ(lf.gcount(), static_cast<std::streamsize>(want.size() * 4));

  SoloSequence seq(**model);
  std::vector<float> got;
  ASSERT_TRUE(seq.Forward(tokens, true, &got));
  Regression r;
  CompareLogits(want, got, static_cast<size_t>(V), &r);
  // The engine's own greedy tokens against the reference's (its first is
  // the prompt's next token, then one per decode step).
  SoloSequence g(**model);
  std::vector<int> next = prompt, own;
  std::vector<float> part;
  for (size_t i = 0; i < greedy.size(); ++i) {
    ASSERT_TRUE(g.Forward(next, false, &part));
    own.push_back(static_cast<int>(std::max_element(part.begin(), part.end()) - part.begin()));
    next = {own.back()};
  }
  r.greedy_steps = static_cast<int>(greedy.size());
  r.greedy_same = static_cast<int>(std::mismatch(greedy.begin(), greedy.end(), own.begin()).first - greedy.begin());
  Print("gpt-oss (tiny random, published MXFP4)", r);
  EXPECT_GE(r.greedy_steps, kSteps);
  // Measured (AVX-512): mean 2.5e-6, worst 5.4e-6 of max|logit|; every argmax and greedy token the reference's.
  const Bounds b{.mean_rel = 1e-3, .worst_rel = 1e-3, .argmax_share = 1.0, .greedy_same = kSteps};
  for (const std::string& why : Outside(r, b)) ADD_FAILURE() << why;

  // A copy whose expert 0 has its scales raised by 2 in every layer, against
  // the reference on the published values: outside the bounds.
  const std::string bad = dir + "_corrupt";
  fs::remove_all(bad);
  fs::copy(dir, bad, fs::copy_options::recursive);
  const int layers = (*model)->config().layers;
  for (int layer = 0; layer < layers; ++layer)
    for (const char* w : {"gate_up_proj_scales", "down_proj_scales"})
      CorruptScales(bad, "model.layers." + std::to_string(layer) + ".mlp.experts." + w);
  auto corrupt = GptOssModel::Load(bad, kernels::BestIsa());
  ASSERT_TRUE(corrupt) << corrupt.error().ToString();
  SoloSequence cs(**corrupt);
  ASSERT_TRUE(cs.Forward(tokens, true, &got));
  Regression c;
  CompareLogits(want, got, static_cast<size_t>(V), &c);
  c.greedy_steps = r.greedy_steps;
  c.greedy_same = r.greedy_same;  // the logits alone must show it
  Print("gpt-oss with expert 0's scales raised by 2", c);
  EXPECT_FALSE(Outside(c, b).empty()) << "gpt-oss: a corrupted MXFP4 scale stays within the bounds";
  fs::remove_all(bad);
  fs::remove_all(ref);
  fs::remove_all(dir);
}

// A NaN or an infinity among the BF16 experts cannot be requantised: at
// load and at publish the error names the tensor as the checkpoint names
// it, the expert and the element (row, column), and no converted directory
// is left behind.
TEST(ExpertFormats, NonFiniteExpertValuesAreNamed) {
  const auto refused = [](const std::string& dir, const std::vector<std::string>& parts) {
    auto m = LoadLayerGraph(dir, ModelOptions{.experts = ExpertFormat::kMxfp4});
    ASSERT_FALSE(m) << dir;
    for (const std::string& part : parts)
      EXPECT_NE(m.error().ToString().find(part), std::string::npos) << "'" << part << "' in: " << m.error().ToString();
    auto family = FindFamily(dir);
    ASSERT_TRUE(family);
    const std::string out = dir + ".mxfp4";
    auto st = (*family)->write_converted(dir, out, ConversionOptions{.experts = ExpertFormat::kMxfp4});
    ASSERT_FALSE(st) << dir;
    for (const std::string& part : parts)
      EXPECT_NE(st.error().ToString().find(part), std::string::npos) << "'" << part << "' in: " << st.error().ToString();
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".partial"));
  };

  // moe-dsa-v1: the tiny agent's BF16 experts, expert 3 of layer 2's w2
  // ([16, 128, 128]) holding +inf at row 2, column 7.
  const std::string agent = Temp("agent_inf");
  fs::remove_all(agent);
  fs::copy(Root() + "/models/tiny-agent/bf16", agent);
  SetBf16(agent, "layers.2.ffn.experts.w2.weight", 3 * 128 * 128 + 2 * 128 + 7, 0x7F80);
  refused(agent, {"layers.2.ffn.experts.w2.weight", "expert 3", "element 49415 (row 2, column 7)", "not finite"});
  fs::remove_all(agent);

  // Qwen3-Next: a NaN in expert 1's down_proj ([64, 32]) at row 1, column 5.
  const std::string qwen = Temp("qwen3_nan");
  fs::remove_all(qwen);
  const std::string write = "/usr/bin/python3 " + Root() + "/tools/reference/families/qwen3_next.py write --out " + qwen +
                            " --vocab 4096 --layers 2 2>&1";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  SetBf16(qwen, "model.layers.0.mlp.experts.1.down_proj.weight", 37, 0x7FC0);
  refused(qwen, {"model.layers.0.mlp.experts.1.down_proj.weight", "element 37 (row 1, column 5)", "not finite"});
  fs::remove_all(qwen);
}

}  // namespace
}  // namespace moeserve::engine
