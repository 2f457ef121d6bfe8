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

// kGqa: gated grouped-query attention with partial rotary (Qwen3-Next's full
// attention layers, GqaConfig); never in a moe-dsa-v1 config.json.
enum class LayerKind { kMla, kDsa, kDelta, kGqa };
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

// Gated grouped-query attention (LayerKind::kGqa): per-head RMSNorm of q and
// k, rotary on the first rotary_dim dims of each head (half-split pairs,
// theta^(-2j / rotary_dim)), causal softmax attention over the cached k and
// v (head h reads kv head h / (num_heads / num_kv_heads)), the output times
// sigmoid(gate) elementwise, then wo. A token row keeps k | v of every kv head.
struct GqaConfig {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;
  double rope_theta = 10000.0;
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
  // The shared expert's output times sigmoid(shared gate . x) (Qwen3-Next:
  // ffn.shared.gate.weight [1, D]); its width is then the shared tensors'
  // own, not num_shared_experts * moe_intermediate_size.
  bool shared_expert_gate = false;
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
  GqaConfig gqa;
  MoeConfig moe;
  RopeConfig rope;
  int64_t max_position_embeddings = 0;
  ThinkingBudgets thinking_budgets;
  ExpertFormat expert_format = ExpertFormat::kMxfp4;  // mxfp4 when "quantization" is absent
  std::optional<VisionConfig> vision;                 // the "vision" object: a vision tower (section 14)
  // Which layers have an MoE FFN, when a family says so layer by layer
  // (Qwen3-Next's mlp_only_layers and decoder_sparse_step); empty: every
  // layer from first_dense_layers on.
  std::vector<bool> moe_layers;
  // Multi-token prediction (model.md 15): config.json's
  // "num_nextn_predict_layers", 0 (none) or 1. The module is one decoder
  // block of kind mtp_kind, with an MoE FFN when mtp_moe, else a dense
  // SwiGLU of intermediate_size (moe-dsa-v1: mla and dense; families that
  // map their checkpoints set their own), plus its input projection and
  // final norm. Whether the checkpoint holds its tensors is the loader's
  // question: a config that names one and a checkpoint without it loads
  // with no drafts.
  int num_nextn_predict_layers = 0;
  LayerKind mtp_kind = LayerKind::kMla;
  bool mtp_moe = false;

  bool HasKind(LayerKind k) const;
  // Whether an MLA/DSA layer's parameters are needed: a trunk layer of that
  // kind, or an MTP block of it.
  bool NeedsMla() const {
    return HasKind(LayerKind::kMla) || HasKind(LayerKind::kDsa) ||
           (num_nextn_predict_layers > 0 && (mtp_kind == LayerKind::kMla || mtp_kind == LayerKind::kDsa));
  }
  bool IsMoeLayer(int layer) const {
    if (!moe_layers.empty()) return moe_layers[static_cast<size_t>(layer)];
    return layer >= first_dense_layers;
  }
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

// The presets of moe-model-gen: "tiny" (model.md section 2), "small" and
// "long" (tiny's widths, six DeltaNet and two DSA layers: long-context runs).
Result<ModelConfig> PresetConfig(const std::string& name);

}  // namespace moeserve::engine
