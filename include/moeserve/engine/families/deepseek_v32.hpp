// DeepSeek-V3.2 as published on Hugging Face (config.json model_type
// "deepseek_v32"): its config parsed into the engine's ModelConfig, and its
// sharded FP8 checkpoint converted into the engine's tensor names and dtypes
// (docs/model-format.md, "DeepSeek-V3.2").
//
// Mapping onto the moe-dsa-v1 graph: every layer is `dsa` (MLA with the
// lightning indexer) without the output gate; the first
// first_k_dense_replace layers have a dense SwiGLU FFN; the others sigmoid
// group-limited routing with e_score_correction_bias and shared experts; the
// indexer's Hadamard rotation and FP8 rounding of its queries and keys are
// DsaConfig::index_fp8. The multi-token-prediction layers
// (model.layers.{num_hidden_layers}...) are not loaded.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"

namespace moeserve::engine::deepseek_v32 {

inline constexpr const char* kModelType = "deepseek_v32";

struct Config {
  ModelConfig model;                 // the engine's form (architecture "deepseek_v32")
  int num_nextn_predict_layers = 0;  // MTP layers stored after the model's own
  bool fp8 = false;                  // quantization_config: fp8 e4m3 with 128x128 blocks
  int bos_token_id = -1, eos_token_id = -1;
  // Set in a directory WriteConverted made (config.json's
  // "moeserve_converted": {"routed_experts": "mxfp4" | "bf16"}): its tensors
  // are already the engine's (model.md 1.1, 1.2), the routed experts in this
  // format, and load with no conversion.
  std::optional<ExpertFormat> converted_experts;
};

// Parses and validates config.json; every failure names the field
// ("config.json: n_group: 5 must divide n_routed_experts (8)").
Result<Config> ParseConfig(const std::string& text, const std::string& source = "config.json");

// dir/config.json, parsed.
Result<Config> LoadConfig(const std::string& dir);

// Whether dir/config.json says model_type "deepseek_v32" (false when it is
// missing or unreadable: the caller's own open reports that).
bool IsModelDir(const std::string& dir);

// Opens a DeepSeek-V3.2 directory: config.json, the shards of
// model.safetensors.index.json (or one model.safetensors), every tensor the
// config needs checked (dtype, shape, FP8 scales) and converted: FP8 weights
// dequantised block by block (fp8 * weight_scale_inv in fp32, rounded to
// BF16, as DeepSeek's weight_dequant), routed experts stacked into the
// engine's BF16 expert tensors (or, with `experts` kMxfp4, requantised from
// those BF16 values into MXFP4 blocks and scales, model.md section 7). The
// result holds the converted checkpoint in memory as one safetensors image,
// each tensor converted straight into its place (peak: the image, plus one
// expert's fp32 values when requantising); what was skipped (MTP),
// dequantised and requantised is said in `warnings`. Its `tokenizer` member
// only carries the vocabulary size (the forward needs nothing else); text
// goes through the checkpoint's own tokenizer.json, which the daemon's
// DeepSeek-V3.2 chat format loads (daemon/deepseek_request.cpp).
Result<ModelDir> OpenDir(const std::string& dir, std::optional<ExpertFormat> experts = std::nullopt);

// The same checks, but nothing converted yet: the ModelDir's `source`
// converts each tensor when Model::Load asks for it, so a load holds the
// loaded weights plus one converted tensor (the largest: one layer's
// stacked routed experts), never the whole converted checkpoint. Its
// `checkpoint` is empty; each request to the source converts anew.
//
// Both, given a directory WriteConverted made, map its checkpoint as it is
// (checked against the config like a moe-dsa-v1 one, model.md section 1);
// `experts`, when set, must then be the format it holds.
Result<ModelDir> OpenDirStreamed(const std::string& dir, std::optional<ExpertFormat> experts = std::nullopt);

// Writes dir's checkpoint converted, with the routed experts in `experts`,
// as a new directory `out` (refused if it exists; written as out.partial and
// renamed when complete): config.json as published plus
// "moeserve_converted", the engine's tensors in safetensors shards of at
// most about `max_shard_bytes` with model.safetensors.index.json, and every
// other regular file of dir's top level (tokenizer files, templates) copied;
// the published shards, their index and manifest.json are not. One recipe's
// tensors are in memory at a time. `moe-daemon publish --experts` uses it so
// that a node loads the requantised experts without converting.
Status WriteConverted(const std::string& dir, const std::string& out, ExpertFormat experts,
                      uint64_t max_shard_bytes = 4ull << 30);

}  // namespace moeserve::engine::deepseek_v32
