// Weights in the layout the CPU kernels use: dense tensors as fp32, BF16 or
// FP8 with block scales (see Matrix), MXFP4 experts repacked for the integer dot-product kernels,
// BF16 experts as stored (ExpertStack).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/family.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tensor_source.hpp"
#include "moeserve/kernels/fp8_block.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/weight_memory.hpp"

namespace moeserve::engine {

// A dense matrix [rows, cols], held one of three ways. Matrices only ever
// used through Linear() keep the checkpoint's BF16 (decode reads half the
// bytes) or its FP8 E4M3 codes with their 128 x 128 fp32 block scales
// (kernels/fp8_block.hpp: one byte a weight, and exact for any float scale,
// which a BF16 conversion is not); ones whose elements the layers index
// directly (wkv_b, conv weights, the embedding) are fp32.
struct Matrix {
  std::vector<float> w;            // fp32 elements, or empty when bf16 or fp8 is used
  // BF16 elements / E4M3 codes [rows, cols] held by ModelWeights::arena: in
  // its memory, or in place in a checkpoint shard's mapping it keeps alive
  // (WeightArena::KeepMapped: any alignment); null when not held so.
  const uint16_t* bf16 = nullptr;
  const uint8_t* fp8 = nullptr;
  const float* fp8_scales = nullptr;  // with fp8: [ceil(rows/128), ceil(cols/128)] in the arena
  int rows = 0, cols = 0;
  kernels::Fp8BlockView fp8_view() const {
    return {fp8, fp8_scales, static_cast<size_t>(rows), static_cast<size_t>(cols)};
  }
  size_t bytes() const {
    const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
    return w.size() * 4 + (bf16 ? n * 2 : 0) +
           (fp8 ? n + kernels::Fp8BlockScaleCount(static_cast<size_t>(rows), static_cast<size_t>(cols)) * 4 : 0);
  }
};

// Routed experts [experts, rows, cols] in the checkpoint's expert format
// (model.md 1.2). MXFP4: repacked at load for the CPU kernels (lossless; see
// kernels/mxfp4_packed.hpp); the file layout is not kept, the reference
// kernels unpack an expert when they need it. BF16: kept as stored (in
// huge-page memory of its own, so that a rank's share is what it holds), and
// multiplied by the BF16 kernels the dense matrices use.
struct ExpertStack {
  ExpertFormat format = ExpertFormat::kMxfp4;
  kernels::Mxfp4PackedStack packed;  // format mxfp4
  // format bf16: [experts, rows, cols] BF16 in weight memory (the converting
  // source's buffer itself when a load converted the experts).
  kernels::WeightBuffer bf16;
  int experts = 0, rows = 0, cols = 0;
  kernels::Mxfp4PackedView expert(int e) const { return packed.matrix(static_cast<size_t>(e)); }
  const uint16_t* expert_bf16(int e) const {
    return reinterpret_cast<const uint16_t*>(bf16.data()) +
           static_cast<size_t>(e) * static_cast<size_t>(rows) * static_cast<size_t>(cols);
  }
  size_t bytes() const { return packed.bytes() + bf16.size(); }
};

// gated_deltanet.cpp: the DeltaNet heads whose q and k are computed once.
struct DeltaDistinctHeads;
struct LayerWeights;
// Finds them for a DeltaNet layer of `heads` heads of head_k_dim (sets
// delta_distinct): Model::Load calls it after the weights, so that the
// copies it makes are not first touched in a prompt's time to first token.
void FindDeltaDistinctHeads(const LayerWeights& w, int heads, int head_k_dim);

struct LayerWeights {
  LayerKind kind;
  std::vector<float> attn_norm, ffn_norm;
  // MLA / DSA
  Matrix wq_a, wq_b, wkv_a, wkv_b, wo, wg;
  // The absorbed form's per-head products (either kernel set): q_abs = W_uk^T
  // q_nope and o = W_uv lat. When the checkpoint holds wkv_b in BF16 they read
  // BF16, as stored (wkv_b_bf16: wkv_b's rows, W_uv being each head's last
  // v_head_dim of them; w_uk_t_bf16: W_uk^T per head [H][kv_lora][nope],
  // transposed at load, exact). Otherwise w_uk_t holds W_uk^T in fp32 and
  // wkv_b.w serves W_uv.
  const uint16_t* wkv_b_bf16 = nullptr;
  const uint16_t* w_uk_t_bf16 = nullptr;
  std::vector<float> w_uk_t;
  std::vector<float> q_norm, kv_norm;
  // Gated GQA (LayerKind::kGqa): q [H hd, D], k and v [Hkv hd, D]; the
  // output gate in wg [H hd, D], the output in wo [D, H hd], the per-head q
  // norm in q_norm [hd] and the k norm in k_norm [hd].
  Matrix wq, wk, wv;
  std::vector<float> k_norm;
  // DSA indexer
  Matrix idx_wq_b, idx_wk, idx_weights_proj;
  std::vector<float> idx_k_norm_w, idx_k_norm_b;
  // Gated DeltaNet
  Matrix q_proj, k_proj, v_proj, a_proj, b_proj, g_proj, o_proj, q_conv, k_conv, v_conv;
  std::vector<float> A_log, dt_bias, o_norm;
  // q_proj and k_proj with each set of heads that repeat one another's rows
  // (and conv rows) once: Qwen3-Next's value heads share their key head's q
  // and k. Set by FindDeltaDistinctHeads (gated_deltanet.cpp) at load.
  mutable std::shared_ptr<const DeltaDistinctHeads> delta_distinct;
  // FFN
  bool moe = false;
  Matrix w1, w3, w2;                   // dense SwiGLU
  Matrix gate;                          // [E, D]
  std::vector<float> gate_bias;         // [E]
  ExpertStack w13, w2e;                 // routed experts: this rank's only
  int first_expert = 0;                 // global index of w13.expert(0)
  Matrix shared_w1, shared_w3, shared_w2;
  Matrix shared_gate;                   // [1, D] when the shared expert is gated (Qwen3-Next), else empty
};

// The vision tower (model.md 14.3): matrices through Linear(), norms and
// biases fp32.
struct VisionBlockWeights {
  std::vector<float> norm1, norm2, qkv_bias, proj_bias;
  Matrix qkv, proj, w1, w3, w2;
};
struct VisionWeights {
  Matrix patch_embed;
  std::vector<float> patch_bias;
  std::vector<VisionBlockWeights> blocks;
  std::vector<float> norm;
  Matrix proj1, proj2;
  std::vector<float> proj1_bias, proj2_bias;
};

// The multi-token-prediction module (model.md 15): h' = eh_proj(concat(
// RMSNorm(embed[t]; enorm), RMSNorm(h; hnorm))), then `block` (one decoder
// block of the graph), then RMSNorm(; norm) before the model's own head.
struct MtpWeights {
  std::vector<float> enorm, hnorm, norm;
  Matrix eh_proj;  // [D, 2D]: the embedding half first
  LayerWeights block;
};

struct ModelWeights {
  // Holds every BF16 matrix (huge pages: see kernels/weight_memory.hpp).
  std::shared_ptr<kernels::WeightArena> arena = std::make_shared<kernels::WeightArena>();
  Matrix embed, head;
  std::vector<float> norm;
  std::vector<LayerWeights> layers;
  std::unique_ptr<VisionWeights> vision;  // with config.vision
  std::unique_ptr<MtpWeights> mtp;        // when asked for and the checkpoint holds it
};

// Loads the dense weights and the experts expert-parallel rank ep_rank of
// ep_world owns (model.md 6: expert e lives on rank e / (E / world)). mtp:
// also the multi-token-prediction module when the config names one and the
// source holds it (its first tensor absent: none, not an error).
Result<ModelWeights> LoadWeights(const Checkpoint& checkpoint, const ModelConfig& config, int ep_rank = 0, int ep_world = 1,
                                 bool mtp = false);
// The same from any source (one tensor held at a time).
Result<ModelWeights> LoadWeights(TensorSource& source, const ModelConfig& config, int ep_rank = 0, int ep_world = 1,
                                 bool mtp = false);
// What the loaded weights keep in memory (the arena's allocations and
// adopted buffers, fp32 copies, experts).
size_t ResidentWeightBytes(const ModelWeights& weights);
// Of those, the routed experts' (w13 and w2 of every MoE layer): the part
// expert parallelism divides among the ranks.
size_t RoutedExpertBytes(const ModelWeights& weights);
// What a decode step reads of them (family.hpp): every matrix and vector of
// the layers, the final norm and the head; one embedding row; one routed
// expert (w13 and w2, mean over the MoE layers). wkv_b counts once, as the
// absorbed form reads it (W_uk^T and W_uv, BF16 when the checkpoint holds
// BF16); the vision tower is not a decode step's, nor is the MTP module
// (its reads belong to speculation's accounting).
DecodeWeightBytes DecodeReadBytes(const ModelWeights& weights, int experts_per_token);
// Bytes and multiplied elements of a matrix (added into *bytes, *weights).
void AddMatrix(const Matrix& m, double* bytes, double* weights);

}  // namespace moeserve::engine
