// moe-model-gen writes complete, deterministic model directories; the loader
// refuses checkpoints that do not match the config, naming file and tensor.
#include "moeserve/engine/model_gen.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "moeserve/engine/context_bytes.hpp"
#include "moeserve/engine/manifest.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/tensor_layout.hpp"
#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& tag) {
  std::string d = testing::TempDir() + "/model_gen_" + tag + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelGenOptions TinyOptions(uint64_t seed) {
  ModelGenOptions o;
  o.config = *PresetConfig("tiny");
  o.seed = seed;
  o.max_shard_bytes = 2ull << 20;
  return o;
}

class GeneratedTiny : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("tiny"));
    auto st = GenerateModel(TinyOptions(1), *dir_);
    ASSERT_TRUE(st) << st.error().ToString();
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* GeneratedTiny::dir_ = nullptr;

TEST_F(GeneratedTiny, OpensValidatesAndVerifies) {
  OpenModelOptions opts;
  opts.verify_manifest = true;
  auto m = OpenModelDir(*dir_, opts);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_TRUE(m->warnings.empty());
  EXPECT_GT(m->checkpoint.shards().size(), 1u);  // the index path is exercised
  EXPECT_TRUE(fs::exists(fs::path(*dir_) / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(*dir_ + ".partial"));
  auto s = Summarize(m->checkpoint, m->config);
  EXPECT_EQ(s.layers_by_kind["mla"], 2);
  EXPECT_EQ(s.layers_by_kind["dsa"], 2);
  EXPECT_EQ(s.layers_by_kind["delta"], 2);
  EXPECT_EQ(s.layers_by_kind["moe_ffn"], 5);
  // Routed experts: 5 layers x 16 experts x 3 x 256 x 128 parameters, a quarter active.
  const int64_t experts = 5ll * 16 * 3 * 256 * 128;
  EXPECT_EQ(s.total_params - s.active_params, experts - experts / 4);
  EXPECT_EQ(s.bytes_by_dtype["U8"], static_cast<uint64_t>(experts / 2 + experts / 32));
}

TEST_F(GeneratedTiny, ManifestListsEveryOtherFile) {
  auto m = ParseManifest(ReadFile(fs::path(*dir_) / "manifest.json"));
  ASSERT_TRUE(m) << m.error().ToString();
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(*dir_)) files += e.path().filename() != "manifest.json";
  EXPECT_EQ(m->files.size(), files);
  EXPECT_TRUE(VerifyManifest(*m, *dir_));
}

TEST_F(GeneratedTiny, ExpertsDecodeToFiniteValues) {
  auto m = OpenModelDir(*dir_);
  ASSERT_TRUE(m);
  const TensorView* b = m->checkpoint.Find("layers.1.ffn.experts.w13.blocks");
  const TensorView* s = m->checkpoint.Find("layers.1.ffn.experts.w13.scales");
  ASSERT_TRUE(b && s);
  std::vector<float> row(256);
  kernels::Mxfp4DecodeMatrix(b->data, s->data, 1, 256, row.data());
  double sumsq = 0;
  for (float v : row) {
    ASSERT_TRUE(std::isfinite(v));
    sumsq += v * v;
  }
  EXPECT_NEAR(std::sqrt(sumsq / 256), 1.0 / 16, 0.03);  // ~N(0, 1/256) draws
}

TEST(ModelGen, DeterministicFromSeed) {
  std::string a = TempDir("a"), b = TempDir("b"), c = TempDir("c");
  ASSERT_TRUE(GenerateModel(TinyOptions(7), a));
  ASSERT_TRUE(GenerateModel(TinyOptions(7), b));
  ASSERT_TRUE(GenerateModel(TinyOptions(8), c));
  EXPECT_EQ(ReadFile(fs::path(a) / "manifest.json"), ReadFile(fs::path(b) / "manifest.json"));
  EXPECT_NE(ReadFile(fs::path(a) / "manifest.json"), ReadFile(fs::path(c) / "manifest.json"));
  // Refuses to overwrite.
  auto again = GenerateModel(TinyOptions(7), a);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message().find("already exists"), std::string::npos);
  for (auto& d : {a, b, c}) fs::remove_all(d);
}

TEST(ModelGen, IndexTopkVariantKeepsTheWeights) {
  std::string a = TempDir("k2048"), b = TempDir("k16");
  auto o = TinyOptions(3);
  ASSERT_TRUE(GenerateModel(o, a));
  o.config.dsa.index_topk = 16;
  ASSERT_TRUE(GenerateModel(o, b));
  auto ma = OpenModelDir(a), mb = OpenModelDir(b);
  ASSERT_TRUE(ma && mb);
  EXPECT_EQ(mb->config.dsa.index_topk, 16);
  for (const TensorView* t : ma->checkpoint.AllTensors()) {
    const TensorView* u = mb->checkpoint.Find(t->name);
    ASSERT_NE(u, nullptr);
    ASSERT_EQ(t->nbytes, u->nbytes);
    EXPECT_EQ(std::memcmp(t->data, u->data, t->nbytes), 0) << t->name;
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

// The long-context preset: six DeltaNet and two DSA layers at tiny's widths,
// MXFP4 experts; it loads, and its cache costs what docs/model-format.md 5.4
// says (896 bytes per token, 6 x 38,912 bytes of DeltaNet state).
TEST(ModelGen, LongPresetLoadsWithItsCacheCost) {
  std::string d = TempDir("long");
  ModelGenOptions o;
  o.config = *PresetConfig("long");
  o.seed = 5;
  ASSERT_TRUE(GenerateModel(o, d));
  OpenModelOptions opts;
  opts.verify_manifest = true;
  auto m = OpenModelDir(d, opts);
  ASSERT_TRUE(m) << m.error().ToString();
  auto s = Summarize(m->checkpoint, m->config);
  EXPECT_EQ(s.layers_by_kind["delta"], 6);
  EXPECT_EQ(s.layers_by_kind["dsa"], 2);
  EXPECT_EQ(s.layers_by_kind["mla"], 0);
  EXPECT_EQ(s.layers_by_kind["moe_ffn"], 7);
  EXPECT_EQ(m->config.expert_format, ExpertFormat::kMxfp4);
  const int64_t experts = 7ll * 16 * 3 * 256 * 128;
  EXPECT_EQ(s.bytes_by_dtype["U8"], static_cast<uint64_t>(experts / 2 + experts / 32));
  ModelOptions mo;
  auto model = Model::Load(*m, mo);
  ASSERT_TRUE(model) << model.error().ToString();
  EXPECT_EQ((*model)->cache_floats_per_token() * 4, 896u);
  const ContextBytes million = ContextCost(**model, 64, 1 << 20);
  EXPECT_EQ(million.pool_bytes, int64_t{896} << 20);
  EXPECT_EQ(million.state_bytes, 6 * 38912);
  fs::remove_all(d);
}

// Rewrites a single-file copy of the tiny checkpoint with one edit applied.
std::string CorruptedCopy(const std::string& tag, const std::function<void(SafetensorsWriter&, const TensorView&)>& copy) {
  std::string src = TempDir(tag + "_src"), dst = TempDir(tag);
  auto o = TinyOptions(1);
  o.max_shard_bytes = 1ull << 40;  // one shard
  EXPECT_TRUE(GenerateModel(o, src));
  auto f = SafetensorsFile::Open(src + "/model.safetensors");
  EXPECT_TRUE(f);
  SafetensorsWriter w;
  for (const auto& t : (*f)->tensors()) copy(w, t);
  fs::create_directories(dst);
  EXPECT_TRUE(w.WriteFile(dst + "/model.safetensors"));
  fs::copy(src + "/config.json", dst + "/config.json");
  fs::copy(src + "/tokenizer.json", dst + "/tokenizer.json");
  fs::remove_all(src);
  return dst;
}

std::vector<uint8_t> BytesOf(const TensorView& t) { return {t.data, t.data + t.nbytes}; }

std::string OpenError(const std::string& dir) {
  auto m = OpenModelDir(dir);
  fs::remove_all(dir);
  if (m) return "";
  return m.error().message();
}

TEST(ModelGen, LoaderRefusesMismatchedTensors) {
  auto missing = CorruptedCopy("missing", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name != "layers.3.attn.indexer.wk.weight") {
      ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, BytesOf(t)));
    }
  });
  std::string msg = OpenError(missing);
  EXPECT_NE(msg.find("model.safetensors: tensor 'layers.3.attn.indexer.wk.weight' is missing"), std::string::npos) << msg;

  auto shape = CorruptedCopy("shape", [](SafetensorsWriter& w, const TensorView& t) {
    auto s = t.shape;
    if (t.name == "norm.weight") s = {128, 2};
    ASSERT_TRUE(w.Add(t.name, t.dtype, s, BytesOf(t)));
  });
  msg = OpenError(shape);
  EXPECT_NE(msg.find("tensor 'norm.weight': shape [128, 2] but the config needs [256]"), std::string::npos) << msg;

  auto dtype = CorruptedCopy("dtype", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name == "layers.0.attn_norm.weight") {  // norms must be F32
      std::vector<uint8_t> half(t.nbytes / 2);
      ASSERT_TRUE(w.Add(t.name, DType::kBF16, t.shape, half));
    } else {
      ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, BytesOf(t)));
    }
  });
  msg = OpenError(dtype);
  EXPECT_NE(msg.find("tensor 'layers.0.attn_norm.weight': dtype BF16 is not allowed here (expected F32)"), std::string::npos) << msg;

  auto nan_scale = CorruptedCopy("nan", [](SafetensorsWriter& w, const TensorView& t) {
    auto b = BytesOf(t);
    if (t.name == "layers.2.ffn.experts.w2.scales") b[5] = 255;
    ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, b));
  });
  msg = OpenError(nan_scale);
  EXPECT_NE(msg.find("tensor 'layers.2.ffn.experts.w2.scales': scale byte 5 is 255"), std::string::npos) << msg;

  auto f32_ok = CorruptedCopy("f32", [](SafetensorsWriter& w, const TensorView& t) {
    if (t.name == "head.weight") {  // F32 is accepted where BF16 is listed
      std::vector<uint8_t> wide(t.nbytes * 2);
      ASSERT_TRUE(w.Add(t.name, DType::kF32, t.shape, wide));
    } else {
      ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, BytesOf(t)));
    }
  });
  EXPECT_EQ(OpenError(f32_ok), "");
}

TEST(ModelGen, ManifestDetectsCorruption) {
  std::string d = TempDir("manifest");
  ASSERT_TRUE(GenerateModel(TinyOptions(1), d));
  {
    std::fstream f(d + "/config.json", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('#');
  }
  OpenModelOptions opts;
  opts.verify_manifest = true;
  auto m = OpenModelDir(d, opts);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("config.json: sha256"), std::string::npos) << m.error().message();
  fs::remove_all(d);
}

// A file that is a symlink (a Hugging Face cache snapshot links every file
// into its blob store) is listed under its own name with its target's bytes.
TEST(ModelGen, ManifestNamesSymlinkedFilesByTheirOwnName) {
  std::string d = TempDir("manifest_links");
  std::string blobs = TempDir("manifest_blobs");
  fs::create_directories(blobs);
  { std::ofstream(blobs + "/abc123") << "weights"; }
  fs::create_directories(d + "/sub");
  fs::create_symlink(blobs + "/abc123", d + "/sub/model.safetensors");
  { std::ofstream(d + "/config.json") << "{}"; }
  auto m = BuildManifest(d + "/");  // a trailing separator, as a user may type it
  ASSERT_TRUE(m) << m.error().ToString();
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files[0].path, "config.json");
  EXPECT_EQ(m->files[1].path, "sub/model.safetensors");
  EXPECT_EQ(m->files[1].size, 7u);
  EXPECT_TRUE(VerifyManifest(*m, d));
  fs::remove_all(d);
  fs::remove_all(blobs);
}

}  // namespace
}  // namespace moeserve::engine
