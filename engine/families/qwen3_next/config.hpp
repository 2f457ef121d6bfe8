// config.json of a Qwen3-Next checkpoint as published on Hugging Face
// (model_type "qwen3_next"), parsed and validated. Every failure names the
// field: "config.json: linear_num_value_heads: 6 is not a multiple of
// linear_num_key_heads (4)".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine::qwen3_next {

struct Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  std::vector<bool> full_attention;  // per layer: gated full attention, else Gated DeltaNet
  std::vector<bool> sparse;          // per layer: MoE, else the dense MLP
  // Gated full attention (GQA).
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor
  double rope_theta = 10000.0;
  // Gated DeltaNet.
  int linear_k_heads = 0, linear_v_heads = 0, linear_k_dim = 0, linear_v_dim = 0, conv_kernel = 4;
  // FFNs.
  int intermediate_size = 0;  // dense MLP layers
  int num_experts = 0, experts_per_token = 0, moe_intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  std::vector<int> eos_token_ids;
};

Result<Config> ParseConfig(const std::string& text, const std::string& source = "config.json");
Result<Config> LoadConfig(const std::string& dir);

}  // namespace moeserve::engine::qwen3_next
