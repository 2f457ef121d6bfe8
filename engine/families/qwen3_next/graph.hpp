// Qwen3-Next on the shared layer graph (Model, engine/model.cpp): its config
// as a ModelConfig, and its published checkpoint read through a TensorSource
// that gives each tensor under the engine's name, in the layout the graph
// reads (model.md 1.1). Mapped, tensor by tensor as Model::Load asks:
//  * full-attention layers are LayerKind::kGqa: q_proj holds [q | gate] per
//    head, split into attn.wq and attn.wg; k_proj, v_proj, o_proj are
//    attn.wk, attn.wv, attn.wo; q_norm, k_norm the per-head norms;
//  * in_proj_qkvz / in_proj_ba group their rows by key head ([q k v z] and
//    [b a] of each key head's value heads); they are split into the
//    per-kind projections GatedDeltaNet reads, and q/k (and their conv
//    channels) repeated for each value head of the group, as the modeling
//    code's repeat_interleave does after the conv (the conv is depthwise and
//    the L2 norm per head, so repeating before them gives the same values);
//  * zero-centred RMSNorm weights w are given as 1 + w (fp32, exact as the
//    modeling code computes it); the DeltaNet output norm is a plain weight;
//  * the routed experts are stacked into ffn.experts.w13 ([gate | up] rows)
//    and ffn.experts.w2 as BF16, or with ModelOptions::experts kMxfp4
//    requantised from those BF16 values into MXFP4 blocks and scales
//    (model.md section 7; hidden_size and moe_intermediate_size multiples
//    of 32); the shared expert and its sigmoid gate are
//    ffn.shared.*; routing is softmax over the experts (no bias).
// The multi-token-prediction layer (mtp.*), when the checkpoint holds it,
// is the graph's MTP module (model.md 15): mtp.fc as eh_proj, the
// zero-centred pre_fc_norm_embedding / pre_fc_norm_hidden / norm as enorm /
// hnorm / norm, mtp.layers.0 (full attention, MoE) as its block; loaded
// only with ModelOptions::mtp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "families/qwen3_next/config.hpp"
#include "moeserve/common/status.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_config.hpp"

namespace moeserve::engine::qwen3_next {

// The graph's description of a parsed config (architecture "qwen3_next").
ModelConfig ToModelConfig(const Config& c);

// DIR's model on the graph: config.json parsed, the shards opened, the
// weights loaded through the mapping above (options.ep_rank / comm: only
// that rank's routed experts). Errors name the published tensor.
Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, const Config& config, const ModelOptions& options);
Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, const ModelOptions& options);

// DIR written converted into OUT (`moe-daemon publish --experts`): the
// tensors of the mapping above under the engine's names, the routed experts
// in `experts` (MXFP4: requantised from the published BF16 values), in
// shards of about max_shard_bytes; config.json as published plus
// "moeserve_converted": {"routed_experts": ...}. LoadModel maps such a
// directory as it is (no requantisation; another experts format asked of
// it is refused). Refused: OUT existing, DIR already converted.
Status WriteConverted(const std::string& dir, const std::string& out, ExpertFormat experts,
                      uint64_t max_shard_bytes = 4ull << 30);

// The routed experts' format of a directory WriteConverted wrote (nullopt
// for any other directory); errors name the file.
Result<std::optional<ExpertFormat>> ConvertedExperts(const std::string& dir);

}  // namespace moeserve::engine::qwen3_next
