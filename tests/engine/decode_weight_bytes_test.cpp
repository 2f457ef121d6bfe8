// FamilyModel::decode_weight_bytes (what bench_batch_curve and moe-run
// divide the read bandwidth by) against counts derived independently: from
// moe-dsa-v1's tensor list (tensor_layout.hpp) for the shared layer graph,
// and from the published shapes of a tiny gpt-oss checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "moeserve/engine/family.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/engine/tensor_layout.hpp"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;

std::string Temp(const std::string& tag) {
  return ::testing::TempDir() + "/moe_decode_bytes_" + tag + "_" + std::to_string(::getpid());
}

std::string Root() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
}

// What a decode step reads by the checkpoint's tensor list, as the engine
// holds it (docs/model-format.md): the embedding fp32 (one row read), BF16
// matrices as BF16 except the conv weights (widened to fp32), every other
// tensor fp32, routed experts as stored (MXFP4 blocks and scales: a byte
// each; BF16: two).
struct FromTensorList {
  double dense = 0, embed_row = 0, routed = 0, dense_weights = 0;
};

FromTensorList CountTensorList(const ModelConfig& cfg) {
  FromTensorList c;
  for (const TensorSpec& t : ExpectedTensors(cfg)) {
    double n = 1;
    for (auto d : t.shape) n *= static_cast<double>(d);
    if (t.name == "embed.weight") {
      c.embed_row = 4.0 * cfg.hidden_size;
    } else if (t.routed_expert) {
      c.routed += (t.cls == TensorClass::kBf16Experts ? 2.0 : 1.0) * n;
    } else {
      c.dense += (t.cls == TensorClass::kBf16 && t.name.find("conv1d") == std::string::npos ? 2.0 : 4.0) * n;
      if (t.shape.size() >= 2) c.dense_weights += n;
    }
  }
  return c;
}

void CheckPreset(const std::string& tag, ExpertFormat format) {
  auto cfg = PresetConfig("tiny");
  ASSERT_TRUE(cfg) << cfg.error().ToString();
  cfg->expert_format = format;
  const std::string dir = Temp(tag);
  fs::remove_all(dir);
  ModelGenOptions go;
  go.config = *cfg;
  ASSERT_TRUE(GenerateModel(go, dir));
  auto opened = OpenModelDir(dir);
  ASSERT_TRUE(opened) << opened.error().ToString();
  auto model = Model::Load(*opened);
  ASSERT_TRUE(model) << model.error().ToString();
  const DecodeWeightBytes w = (*model)->decode_weight_bytes();
  const FromTensorList want = CountTensorList(opened->config);
  int moe_layers = 0;
  for (int e : (*model)->ExpertCounts()) moe_layers += e > 0;
  ASSERT_GT(moe_layers, 0);
  EXPECT_EQ(w.moe_layers, moe_layers);
  EXPECT_EQ(w.experts_per_token, opened->config.moe.experts_per_token);
  EXPECT_DOUBLE_EQ(w.dense, want.dense);
  EXPECT_DOUBLE_EQ(w.embed_row, want.embed_row);
  EXPECT_DOUBLE_EQ(w.expert * moe_layers * opened->config.moe.num_experts, want.routed);
  EXPECT_DOUBLE_EQ(w.dense_weights, want.dense_weights);
  // A routed expert multiplies its three matrices' elements.
  EXPECT_DOUBLE_EQ(w.expert_weights, 3.0 * opened->config.moe.moe_intermediate_size * opened->config.hidden_size);
  EXPECT_DOUBLE_EQ(w.PerToken(), w.dense + w.embed_row + moe_layers * opened->config.moe.experts_per_token * w.expert);
  fs::remove_all(dir);
}

TEST(DecodeWeightBytes, LayerGraphMatchesTheTensorListMxfp4) { CheckPreset("mxfp4", ExpertFormat::kMxfp4); }

TEST(DecodeWeightBytes, LayerGraphMatchesTheTensorListBf16Experts) { CheckPreset("bf16", ExpertFormat::kBf16); }

TEST(DecodeWeightBytes, GptOssFromItsPublishedShapes) {
  // tools/reference/gpt_oss.py's tiny shapes: hidden 64, intermediate 64,
  // 4 query and 2 key/value heads of 16, 4 experts (top-2); untied head.
  const int L = 2, V = 1000, D = 64, I = 64, H = 4, KV = 2, d = 16, E = 4, K = 2;
  const std::string dir = Temp("gptoss");
  fs::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + Root() + "/tools/reference/gpt_oss.py write --out " + dir +
                          " --layers " + std::to_string(L) + " --vocab " + std::to_string(V) + " --seed 3 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto model = GptOssModel::Load(dir, kernels::Isa::kReference);
  ASSERT_TRUE(model) << model.error().ToString();
  const DecodeWeightBytes w = (*model)->decode_weight_bytes();
  // Dense: BF16 matrices (head, q, k, v, o, router); fp32 norms, biases, sinks.
  const double matrices = double{V} * D + L * (2.0 * H * d * D + 2.0 * KV * d * D + double{E} * D);
  const double vectors = D + L * (2.0 * D + H * d + 2.0 * KV * d + D + H + E);
  EXPECT_DOUBLE_EQ(w.dense_weights, matrices);
  EXPECT_DOUBLE_EQ(w.dense, 2.0 * matrices + 4.0 * vectors);
  EXPECT_DOUBLE_EQ(w.embed_row, 2.0 * D);
  // One expert: gate_up [2I, D] and down [D, I] in MXFP4 (17 bytes per 32
  // weights), its biases fp32.
  EXPECT_DOUBLE_EQ(w.expert, 3.0 * I * D * 17 / 32 + 4.0 * (2 * I + D));
  EXPECT_DOUBLE_EQ(w.expert_weights, 3.0 * I * D);
  EXPECT_EQ(w.moe_layers, L);
  EXPECT_EQ(w.experts_per_token, K);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::engine
