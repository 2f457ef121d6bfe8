// BF16 routed experts (model.md 1.2): what moe-model-gen writes, what the
// loader refuses (naming the tensor or field), and the engine on BF16 experts
// against the same model with MXFP4 experts. The comparison with the PyTorch
// reference is in forward_reference_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tensor_layout.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;
using testing_util::TempPath;

// The tiny preset in one safetensors file (so a copy can be rewritten as one).
std::string SingleFileTiny(const std::string& tag, ExpertFormat format, uint64_t seed = 1) {
  const std::string dir = TempPath("bf16x_" + tag);
  fs::remove_all(dir);
  ModelGenOptions o;
  o.config = *PresetConfig("tiny");
  o.config.expert_format = format;
  o.seed = seed;
  o.max_shard_bytes = 1ull << 40;
  auto st = GenerateModel(o, dir);
  EXPECT_TRUE(st) << st.error().ToString();
  return dir;
}

std::vector<uint8_t> BytesOf(const TensorView& t) { return {t.data, t.data + t.nbytes}; }

// A copy of src (one safetensors file) with each tensor passed through `copy`
// and config.json through `config` (nothing written for it when it returns
// an empty string: the source's is copied).
std::string RewrittenCopy(const std::string& src, const std::string& tag,
                          const std::function<void(SafetensorsWriter&, const TensorView&)>& copy,
                          const std::function<std::string(const ModelConfig&)>& config = nullptr) {
  const std::string dst = TempPath("bf16x_copy_" + tag);
  fs::remove_all(dst);
  fs::create_directories(dst);
  auto f = SafetensorsFile::Open(src + "/model.safetensors");
  EXPECT_TRUE(f);
  SafetensorsWriter w;
  for (const auto& t : (*f)->tensors()) copy(w, t);
  EXPECT_TRUE(w.WriteFile(dst + "/model.safetensors"));
  fs::copy(src + "/tokenizer.json", dst + "/tokenizer.json");
  std::string text;
  if (config) {
    auto c = LoadModelConfig(src + "/config.json");
    EXPECT_TRUE(c);
    text = config(*c);
  }
  if (text.empty()) {
    fs::copy(src + "/config.json", dst + "/config.json");
  } else {
    std::ofstream(dst + "/config.json") << text;
  }
  return dst;
}

void Keep(SafetensorsWriter& w, const TensorView& t) { ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, BytesOf(t))); }

std::string OpenError(const std::string& dir) {
  auto m = OpenModelDir(dir);
  fs::remove_all(dir);
  if (m) return "";
  return m.error().message();
}

// An MXFP4 weight [E, rows, cols/32, 16] decoded and written as BF16 [E,
// rows, cols] under NAME.weight: exact, since an E2M1 value times a power of
// two has at most two significant bits.
void AddDecodedAsBf16(SafetensorsWriter& w, const TensorView& blocks, const TensorView& scales, const std::string& base) {
  const size_t E = static_cast<size_t>(blocks.shape[0]), rows = static_cast<size_t>(blocks.shape[1]);
  const size_t cols = static_cast<size_t>(blocks.shape[2] * 32);
  std::vector<float> v(E * rows * cols);
  kernels::Mxfp4DecodeMatrix(blocks.data, scales.data, E * rows, cols, v.data());
  std::vector<uint8_t> bytes(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = F32ToBf16(v[i]);
    ASSERT_EQ(Bf16ToF32(b), v[i]) << base << " element " << i << " is not exact in BF16";
    std::memcpy(&bytes[2 * i], &b, 2);
  }
  ASSERT_TRUE(w.Add(base + ".weight", DType::kBF16,
                    {static_cast<int64_t>(E), static_cast<int64_t>(rows), static_cast<int64_t>(cols)}, std::move(bytes)));
}

// Logits of a 40-token prefill and 8 teacher-forced decode steps (tokens
// fixed, so both models see the same sequence), [48, V].
std::vector<float> Logits(const std::string& model_dir, KernelChoice kernels) {
  auto dir = OpenModelDir(model_dir);
  EXPECT_TRUE(dir) << dir.error().ToString();
  if (!dir) return {};
  ModelOptions mo;
  mo.kernels = kernels;
  auto model = Model::Load(*dir, mo);
  EXPECT_TRUE(model) << model.error().ToString();
  if (!model) return {};
  KvPool pool(16, 16, (*model)->cache_floats_per_token());
  SequenceCache cache = (*model)->NewSequence();
  const std::vector<int> prompt = testing_util::TestPrompt(48, 11);
  std::vector<float> all, logits;
  EXPECT_TRUE(EnsureBlocks(pool, cache, 40));
  const std::vector<int> head(prompt.begin(), prompt.begin() + 40);
  ForwardSegment seg{&cache, head, true};
  EXPECT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &all));
  for (int p = 40; p < 48; ++p) {
    EXPECT_TRUE(EnsureBlocks(pool, cache, cache.length + 1));
    const std::vector<int> tok = {prompt[static_cast<size_t>(p)]};
    ForwardSegment one{&cache, tok, false};
    EXPECT_TRUE((*model)->Forward(pool, std::span(&one, 1), &logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// Worst over rows of max|a - b| / max|b| (ids 0..267), and how many rows'
// argmax differ.
struct Difference {
  double worst_ratio = 0;
  int argmax_differs = 0, rows = 0;
};
Difference Compare(const std::vector<float>& a, const std::vector<float>& b, int V) {
  Difference d;
  EXPECT_EQ(a.size(), b.size());
  d.rows = static_cast<int>(std::min(a.size(), b.size()) / static_cast<size_t>(V));
  for (int r = 0; r < d.rows; ++r) {
    const float* x = &a[static_cast<size_t>(r) * V];
    const float* y = &b[static_cast<size_t>(r) * V];
    double max_ref = 0, max_diff = 0;
    for (int v = 0; v < 268; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(y[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(x[v]) - y[v]));
    }
    d.worst_ratio = std::max(d.worst_ratio, max_diff / max_ref);
    d.argmax_differs += (std::max_element(x, x + 268) - x) != (std::max_element(y, y + 268) - y);
  }
  return d;
}

TEST(Bf16Experts, GeneratorWritesTheMxfp4DrawInBf16) {
  const std::string mx = testing_util::TinyModel(1, 2048, ExpertFormat::kMxfp4);
  const std::string bf = testing_util::TinyModel(1, 2048, ExpertFormat::kBf16);
  OpenModelOptions verify;
  verify.verify_manifest = true;
  auto a = OpenModelDir(mx), b = OpenModelDir(bf, verify);
  ASSERT_TRUE(a) << a.error().ToString();
  ASSERT_TRUE(b) << b.error().ToString();
  EXPECT_TRUE(b->warnings.empty());
  EXPECT_EQ(b->config.expert_format, ExpertFormat::kBf16);
  EXPECT_NE(b->config.ToJson().find("\"format\": \"bf16\""), std::string::npos) << b->config.ToJson();
  EXPECT_EQ(b->checkpoint.Find("layers.1.ffn.experts.w13.blocks"), nullptr);
  const TensorView* w13 = b->checkpoint.Find("layers.1.ffn.experts.w13.weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->dtype, DType::kBF16);
  EXPECT_EQ(w13->shape, (std::vector<int64_t>{16, 256, 256}));

  // Every other tensor is byte-identical.
  int compared = 0;
  for (const TensorView* t : a->checkpoint.AllTensors()) {
    if (t->name.find(".ffn.experts.") != std::string::npos) continue;
    const TensorView* u = b->checkpoint.Find(t->name);
    ASSERT_NE(u, nullptr) << t->name;
    ASSERT_EQ(t->nbytes, u->nbytes) << t->name;
    EXPECT_EQ(std::memcmp(t->data, u->data, t->nbytes), 0) << t->name;
    ++compared;
  }
  EXPECT_GT(compared, 50);

  // The experts are one draw: MXFP4's decoded values are within its
  // quantisation error of the BF16 ones (a random draw of another seed would
  // be ~140% off), and not equal to them.
  for (const char* name : {"layers.1.ffn.experts.w13", "layers.5.ffn.experts.w2"}) {
    const TensorView* blocks = a->checkpoint.Find(std::string(name) + ".blocks");
    const TensorView* scales = a->checkpoint.Find(std::string(name) + ".scales");
    const TensorView* weight = b->checkpoint.Find(std::string(name) + ".weight");
    ASSERT_TRUE(blocks && scales && weight) << name;
    const size_t n = static_cast<size_t>(weight->numel());
    std::vector<float> decoded(n);
    kernels::Mxfp4DecodeMatrix(blocks->data, scales->data, n / static_cast<size_t>(weight->shape[2]),
                               static_cast<size_t>(weight->shape[2]), decoded.data());
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, weight->data + 2 * i, 2);
      const double v = Bf16ToF32(h);
      err += (decoded[i] - v) * (decoded[i] - v);
      norm += v * v;
    }
    const double rel = std::sqrt(err / norm);
    std::printf("%s: rms(MXFP4 - BF16) / rms(BF16) = %.4f\n", name, rel);
    EXPECT_GT(rel, 0.01) << name;
    EXPECT_LT(rel, 0.2) << name;
  }

  auto sa = Summarize(a->checkpoint, a->config), sb = Summarize(b->checkpoint, b->config);
  EXPECT_EQ(sb.total_params, sa.total_params);
  EXPECT_EQ(sb.active_params, sa.active_params);
  EXPECT_EQ(sb.bytes_by_dtype.count("U8"), 0u);
  EXPECT_NE(FormatSummary(sb, b->config).find("experts        bf16"), std::string::npos);
}

TEST(Bf16Experts, LoaderRefusesBadExpertTensorsNamingThem) {
  const std::string src = SingleFileTiny("src", ExpertFormat::kBf16);
  ASSERT_EQ(OpenError(RewrittenCopy(src, "ok", Keep)), "");

  auto dtype = RewrittenCopy(src, "dtype", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name != "layers.1.ffn.experts.w13.weight") return Keep(w, t);
    ASSERT_TRUE(w.Add(t.name, DType::kF32, t.shape, std::vector<uint8_t>(t.nbytes * 2)));  // F32 is not BF16
  });
  std::string msg = OpenError(dtype);
  EXPECT_NE(msg.find("tensor 'layers.1.ffn.experts.w13.weight': dtype F32 is not allowed here (expected BF16"),
            std::string::npos)
      << msg;

  auto u8 = RewrittenCopy(src, "u8", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name != "layers.2.ffn.experts.w2.weight") return Keep(w, t);
    ASSERT_TRUE(w.Add(t.name, DType::kU8, t.shape, std::vector<uint8_t>(t.nbytes / 2)));
  });
  msg = OpenError(u8);
  EXPECT_NE(msg.find("tensor 'layers.2.ffn.experts.w2.weight': dtype U8 is not allowed here"), std::string::npos) << msg;

  auto shape = RewrittenCopy(src, "shape", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name != "layers.3.ffn.experts.w13.weight") return Keep(w, t);
    ASSERT_TRUE(w.Add(t.name, t.dtype, {16, 128, 512}, BytesOf(t)));  // same bytes, wrong shape
  });
  msg = OpenError(shape);
  EXPECT_NE(msg.find("tensor 'layers.3.ffn.experts.w13.weight': shape [16, 128, 512] but the config needs [16, 256, 256]"),
            std::string::npos)
      << msg;

  auto missing = RewrittenCopy(src, "missing", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name != "layers.4.ffn.experts.w2.weight") Keep(w, t);
  });
  msg = OpenError(missing);
  EXPECT_NE(msg.find("tensor 'layers.4.ffn.experts.w2.weight' is missing"), std::string::npos) << msg;

  // MXFP4 tensors beside BF16 ones: config and weights disagree.
  auto other = RewrittenCopy(src, "other", [](SafetensorsWriter& w, const TensorView& t) {
    Keep(w, t);
    if (t.name == "layers.1.ffn.experts.w13.weight") {
      ASSERT_TRUE(w.Add("layers.1.ffn.experts.w13.blocks", DType::kU8, {16, 256, 8, 16}, std::vector<uint8_t>(16 * 256 * 8 * 16)));
    }
  });
  msg = OpenError(other);
  EXPECT_NE(msg.find("tensor 'layers.1.ffn.experts.w13.blocks' holds routed experts in another format than config.json's "
                     "quantization.format \"bf16\""),
            std::string::npos)
      << msg;

  // BF16 experts under a config that says mxfp4: the MXFP4 pair is missing.
  auto says_mxfp4 = RewrittenCopy(src, "says_mxfp4", Keep, [](const ModelConfig& c) {
    ModelConfig m = c;
    m.expert_format = ExpertFormat::kMxfp4;
    return m.ToJson();
  });
  msg = OpenError(says_mxfp4);
  EXPECT_NE(msg.find("tensor 'layers.1.ffn.experts.w13.blocks' is missing"), std::string::npos) << msg;

  // And the other way round: an MXFP4 checkpoint with a stray BF16 expert tensor.
  const std::string mx = SingleFileTiny("src_mx", ExpertFormat::kMxfp4);
  auto stray = RewrittenCopy(mx, "stray", [](SafetensorsWriter& w, const TensorView& t) {
    Keep(w, t);
    if (t.name == "layers.2.ffn.experts.w2.scales") {
      ASSERT_TRUE(w.Add("layers.2.ffn.experts.w2.weight", DType::kBF16, {16, 256, 128}, std::vector<uint8_t>(16 * 256 * 128 * 2)));
    }
  });
  msg = OpenError(stray);
  EXPECT_NE(msg.find("tensor 'layers.2.ffn.experts.w2.weight' holds routed experts in another format than config.json's "
                     "quantization.format \"mxfp4\""),
            std::string::npos)
      << msg;
  fs::remove_all(src);
  fs::remove_all(mx);
}

TEST(Bf16Experts, ConfigFormatsAreCheckedNamingTheField) {
  using nlohmann::json;
  json j = json::parse(PresetConfig("tiny")->ToJson());
  const auto refusal = [](const json& cfg) {
    auto r = ParseModelConfig(cfg.dump(), "m/config.json");
    return r ? std::string() : r.error().message();
  };
  j["quantization"] = {{"format", "bf16"}};
  auto c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->expert_format, ExpertFormat::kBf16);
  auto again = ParseModelConfig(c->ToJson());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->expert_format, ExpertFormat::kBf16);
  j["quantization"]["applies_to"] = {"experts"};
  EXPECT_EQ(refusal(j), "");
  j.erase("quantization");
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->expert_format, ExpertFormat::kMxfp4);  // the default

  j["quantization"] = {{"format", "fp8"}};
  EXPECT_NE(refusal(j).find("m/config.json: quantization.format: 'fp8' is not supported (expected \"mxfp4\" or \"bf16\")"),
            std::string::npos)
      << refusal(j);
  j["quantization"] = {{"format", "bf16"}, {"block_size", 32}};
  EXPECT_NE(refusal(j).find("m/config.json: quantization.block_size: has no meaning for format \"bf16\""), std::string::npos)
      << refusal(j);
  j["quantization"] = {{"format", "bf16"}, {"applies_to", {"experts", "attention"}}};
  EXPECT_NE(refusal(j).find("m/config.json: quantization.applies_to: must be [\"experts\"]"), std::string::npos) << refusal(j);
}

// BF16 experts that hold exactly the MXFP4 model's decoded values: the engine
// must compute the same function through either format's kernels. The
// reference kernels differ only by summation order; the fast MXFP4 kernels
// also quantise activations (kernels/mxfp4_packed.hpp), within model.md
// section 10's engine bound.
TEST(Bf16Experts, SameValuesAsMxfp4GiveTheSameLogits) {
  const std::string mx = SingleFileTiny("same_mx", ExpertFormat::kMxfp4, 4);
  auto src = SafetensorsFile::Open(mx + "/model.safetensors");
  ASSERT_TRUE(src);
  const std::string bf = RewrittenCopy(
      mx, "same_bf",
      [&](SafetensorsWriter& w, const TensorView& t) {
        if (t.name.ends_with(".scales")) return;
        if (!t.name.ends_with(".blocks")) return Keep(w, t);
        const std::string base = t.name.substr(0, t.name.size() - 7);
        const TensorView* scales = (*src)->Find(base + ".scales");
        ASSERT_NE(scales, nullptr);
        AddDecodedAsBf16(w, t, *scales, base);
      },
      [](const ModelConfig& c) {
        ModelConfig b = c;
        b.expert_format = ExpertFormat::kBf16;
        return b.ToJson();
      });
  const int V = PresetConfig("tiny")->vocab_size;
  for (KernelChoice k : {KernelChoice::kReference, KernelChoice::kFast}) {
    const std::vector<float> a = Logits(mx, k), b = Logits(bf, k);
    ASSERT_EQ(a.size(), static_cast<size_t>(48) * V);
    const Difference d = Compare(b, a, V);
    const bool ref = k == KernelChoice::kReference;
    std::printf("%s kernels: BF16 copy vs MXFP4: worst max|diff|/max|ref| = %.3g, argmax differs at %d of %d rows\n",
                ref ? "reference" : "fast", d.worst_ratio, d.argmax_differs, d.rows);
    EXPECT_LE(d.worst_ratio, ref ? 1e-4 : 1e-3);
    EXPECT_EQ(d.argmax_differs, 0);
  }
  fs::remove_all(mx);
  fs::remove_all(bf);
}

// Cosine similarity of two rows' logits over ids 0..267.
double Cosine(const float* x, const float* y) {
  double dot = 0, nx = 0, ny = 0;
  for (int v = 0; v < 268; ++v) {
    dot += static_cast<double>(x[v]) * y[v];
    nx += static_cast<double>(x[v]) * x[v];
    ny += static_cast<double>(y[v]) * y[v];
  }
  return dot / std::sqrt(nx * ny);
}

// The generator's pair of one seed: BF16 experts and MXFP4 experts encoded
// from the same draw (11.5% rms weight error, printed by the first test). A
// random model amplifies it: measured, the logits' rows have a mean cosine
// of 0.90 with the BF16 model's (0.69 the lowest; a model of another seed
// has about 0), the largest row difference is 0.96 of max|logit| and the
// argmax differs at 23 of 48 rows. Judging quantisation needs a trained
// model (model.md 1.2); this test bounds the plumbing: the same weights,
// quantised, must stay far closer to the BF16 model than another model is.
TEST(Bf16Experts, Mxfp4AgainstBf16OfTheSameDraw) {
  const int V = PresetConfig("tiny")->vocab_size;
  const std::vector<float> bf = Logits(testing_util::TinyModel(1, 2048, ExpertFormat::kBf16), KernelChoice::kFast);
  const std::vector<float> mx = Logits(testing_util::TinyModel(1, 2048, ExpertFormat::kMxfp4), KernelChoice::kFast);
  ASSERT_EQ(bf.size(), static_cast<size_t>(48) * V);
  ASSERT_EQ(mx.size(), bf.size());
  const Difference d = Compare(mx, bf, V);
  double mean_cos = 0, min_cos = 1;
  for (int r = 0; r < 48; ++r) {
    const double c = Cosine(&mx[static_cast<size_t>(r) * V], &bf[static_cast<size_t>(r) * V]);
    mean_cos += c / 48;
    min_cos = std::min(min_cos, c);
  }
  std::printf("MXFP4 vs BF16 experts of one draw: mean cosine %.3f (lowest %.3f), worst max|diff|/max|bf16| = %.3g, "
              "argmax differs at %d of %d rows\n",
              mean_cos, min_cos, d.worst_ratio, d.argmax_differs, d.rows);
  EXPECT_GT(d.worst_ratio, 1e-3);  // the formats really differ
  EXPECT_GT(mean_cos, 0.75);
  EXPECT_GT(min_cos, 0.4);
}

}  // namespace
}  // namespace moeserve::engine
