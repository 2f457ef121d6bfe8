// The fixed tensor names, shapes and dtypes of a moe-dsa-v1 checkpoint
// (model.md section 1.1), derived from a ModelConfig. One list serves the
// loader (what must be present) and the generator (what to write).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/safetensors.hpp"

namespace moeserve::engine {

enum class TensorClass {
  kFloat32,       // norms, k_norm.bias, A_log, dt_bias, ffn.gate.bias: F32 only
  kBf16,          // every other dense tensor: BF16 (F32 also accepted; a matrix also as F8_E4M3
                  // with F32 128x128 block scales in "<name>_scale_inv")
  kMxfp4Blocks,   // U8 [..., rows, cols/32, 16]
  kMxfp4Scales,   // U8 [..., rows, cols/32]
  kBf16Experts,   // routed experts in the "bf16" format: BF16 only, [E, rows, cols]
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorClass cls;
  int layer = -1;          // -1 for embed/norm/head
  bool routed_expert = false;  // counted as active only for experts_per_token of num_experts
  // For initialisation: the fan-in of a matrix (its input dimension).
  int64_t fan_in = 0;
  // Part of the multi-token-prediction module (model.md 15): optional as a
  // whole (a checkpoint holds all of them or none), checked like the rest
  // when present.
  bool mtp = false;
};

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Checks a checkpoint against the layout: every tensor present, of an allowed
// dtype and the exact shape, no MXFP4 scale equal to 255 (NaN), and an FP8
// matrix's block scales present, of their shape and positive. Errors
// name the shard file and the tensor. A routed-expert tensor of the other
// expert format (a .blocks where the config says bf16, a .weight where it
// says mxfp4) is an error: config and weights disagree. Other extra tensors
// are reported as warnings. The multi-token-prediction tensors (TensorSpec::mtp)
// may all be absent; once one is present, all are required.
Status ValidateCheckpoint(const Checkpoint& checkpoint, const ModelConfig& config,
                          std::vector<std::string>* warnings = nullptr);

struct ModelSummary {
  std::map<std::string, int> layers_by_kind;  // "mla" -> 2, "dense_ffn" -> 1, "moe_ffn" -> 5
  int64_t total_params = 0;
  int64_t active_params = 0;   // per token: all dense tensors + experts_per_token routed experts
  std::map<std::string, uint64_t> bytes_by_dtype;
  uint64_t total_bytes = 0;
};

ModelSummary Summarize(const Checkpoint& checkpoint, const ModelConfig& config);
std::string FormatSummary(const ModelSummary& s, const ModelConfig& config);

}  // namespace moeserve::engine
