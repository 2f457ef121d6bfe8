// The Qwen3-Next layer graph as a FamilyModel (family.hpp): Gated DeltaNet
// layers (the engine's GatedDeltaNet, fed from the published fused
// projections) interleaved with gated GQA full attention, zero-centred
// RMSNorms, and a softmax-routed MoE with a sigmoid-gated shared expert.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "families/qwen3_next/config.hpp"
#include "moeserve/engine/family.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/safetensors.hpp"

namespace moeserve::engine {
struct ModelWeights;
}  // namespace moeserve::engine

namespace moeserve::kernels {
struct KernelSet;
}

namespace moeserve::engine::qwen3_next {

// One gated full-attention layer's own weights (the rest are LayerWeights').
struct AttentionWeights;

class Model final : public FamilyModel {
 public:
  // Parses DIR/config.json and loads DIR's (sharded) safetensors.
  static Result<std::unique_ptr<Model>> Load(const std::string& dir, const ModelOptions& options);
  ~Model() override;

  int vocab_size() const override { return config_.vocab_size; }
  int64_t max_position() const override { return config_.max_position_embeddings; }
  size_t cache_floats_per_token() const override { return floats_per_token_; }
  SequenceCache NewSequence() const override;
  Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits,
                 ForwardTrace* trace = nullptr,
                 std::vector<std::vector<uint64_t>>* expert_tokens = nullptr) const override;
  std::vector<int> ExpertCounts() const override;
  // The shared graph's accounting (weights.hpp DecodeReadBytes) plus the
  // gated attention layers' own weights.
  DecodeWeightBytes decode_weight_bytes() const override;
  const Config& config() const { return config_; }

 private:
  Model() = default;
  Config config_;
  ModelConfig shared_config_;  // what the shared layer pieces read (delta, moe, hidden_size)
  ModelOptions options_;
  const kernels::KernelSet* kernels_ = nullptr;
  std::unique_ptr<ModelWeights> weights_;
  std::vector<std::unique_ptr<AttentionWeights>> attention_;  // per layer; null for DeltaNet layers
  std::vector<size_t> layer_offset_;
  size_t floats_per_token_ = 1;
  std::vector<float> rope_freqs_;
};

}  // namespace moeserve::engine::qwen3_next
