// config.json of the moe-dsa-v1 family (model.md section 2), parsed and
// validated. Every failure names the field: "config.json: moe.topk_group: 5
// must be <= moe.n_group (4)".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::engine {

enum class LayerKind { kMla, kDsa, kDelta };
std::string_view LayerKindName(LayerKind k);

struct MlaConfig {
  int num_heads = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool output_gate = true;
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct DsaConfig {
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 2048;
  // DeepSeek-V3.2's indexer (engine/families/deepseek_v32): after RoPE, every
  // query head and the key are rotated by the orthonormal Hadamard matrix and
  // rounded to FP8 e4m3 in groups of 128 (scale amax/448; a power of two when
  // index_fp8_ue8m0), as its public inference code quantises them. Needs
  // index_head_dim a power of two and a multiple of 128. Never set by a
  // moe-dsa-v1 config.json (its indexer scores are plain fp32).
  bool index_fp8 = false;
  bool index_fp8_ue8m0 = false;
};

struct DeltaConfig {
  int num_heads = 0;
  int head_k_dim = 0;
  int head_v_dim = 0;
  int conv_size = 4;
  double norm_eps = 1e-5;
};

struct MoeConfig {
  int num_experts = 0;
  int experts_per_token = 0;
  int num_shared_experts = 0;
  int moe_intermediate_size = 0;
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  std::string score_func = "sigmoid";  // or "softmax" (families other than moe-dsa-v1)
  bool norm_topk_prob = true;           // softmax: renormalise the picked probabilities
};

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;  // "scaling": "yarn" (else "none")
  double factor = 1.0;
  int64_t original_max_position = 4096;
  double beta_fast = 32;
  double beta_slow = 1;
  double mscale = 1.0;
};

struct ThinkingBudgets {
  int low = 256;
  int medium = 2048;
  int high = 16384;
};

// How the routed experts are stored (model.md 1.2): "quantization.format".
enum class ExpertFormat { kMxfp4, kBf16 };
std::string_view ExpertFormatName(ExpertFormat f);  // "mxfp4", "bf16"

struct ModelConfig {
  std::string architecture;
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  std::vector<LayerKind> layer_types;
  int first_dense_layers = 0;
  int intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  MlaConfig mla;
  DsaConfig dsa;
  DeltaConfig delta;
  MoeConfig moe;
  RopeConfig rope;
  int64_t max_position_embeddings = 0;
  ThinkingBudgets thinking_budgets;
  ExpertFormat expert_format = ExpertFormat::kMxfp4;  // mxfp4 when "quantization" is absent
  std::optional<VisionConfig> vision;                 // the "vision" object: a vision tower (section 14)

  bool HasKind(LayerKind k) const;
  bool IsMoeLayer(int layer) const { return layer >= first_dense_layers; }
  int CountKind(LayerKind k) const;

  // The checkpoint's config.json form (inverse of ParseModelConfig).
  std::string ToJson() const;
};

// Parses and validates; `source` names the file in messages.
Result<ModelConfig> ParseModelConfig(const std::string& text, const std::string& source = "config.json");
Result<ModelConfig> LoadModelConfig(const std::string& path);
// Validation alone (used after programmatic edits, e.g. by moe-model-gen).
Status ValidateModelConfig(const ModelConfig& c, const std::string& source = "config.json");
// With expert parallelism: num_experts % world_size == 0.
Status ValidateWorldSize(const ModelConfig& c, int world_size);

// The two presets of moe-model-gen: "tiny" (model.md section 2) and "small".
Result<ModelConfig> PresetConfig(const std::string& name);

}  // namespace moeserve::engine
