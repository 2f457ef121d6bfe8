// The layer kinds of model.md section 5 and 6, one function each. Inputs are
// the normed hidden states of every token in the batch, [N, D] row-major; the
// batch is a list of segments (consecutive token rows of one sequence).
#pragma once

#include <span>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "weights.hpp"

namespace moeserve::engine {

// One segment's rows within the batch: rows [row0, row0 + n) hold positions
// [pos0, pos0 + n) of `cache`.
struct SegmentRows {
  SequenceCache* cache;
  int row0;
  int n;
  int64_t pos0;
};

struct LayerContext {
  const ModelConfig& config;
  const ModelOptions& options;
  // The model's kernels, chosen once at load (Model::set_options).
  const kernels::KernelSet& kernels;
  // Whether multi-token segments run MLA in the absorbed form (model.hpp,
  // MlaForm), resolved with the kernels.
  bool absorbed_prefill;
  KvPool& pool;
  std::span<const SegmentRows> segments;
  int layer;
  size_t cache_offset;                 // this layer's floats within a token row
  const std::vector<float>& rope_freqs;
  float mla_scale;
  ForwardTrace* trace;
};

// Linear helpers over the batch: Y[N, W.rows] = X[N, W.cols] W^T, by the
// given kernels' BF16 or fp32 product.
void Linear(const Matrix& W, const float* X, int n, float* Y, const kernels::KernelSet& k);
// Several Linears over n rows each, as one parallel pass when they are all
// BF16 matrix-vector products (decode): the projections of one input are
// small, and a pool hand-off per product costs more than their imbalance.
// Same results as one Linear per job.
struct LinearJob {
  const Matrix* W;
  const float* X;
  float* Y;
};
void LinearMany(std::initializer_list<LinearJob> jobs, int n, const kernels::KernelSet& k);

// Gated MLA / DSA (5.1, 5.2): writes [N, D] into out.
void MlaAttention(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
// Gated DeltaNet (5.3).
void GatedDeltaNet(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
// Dense SwiGLU (3) and MoE (6).
void DenseFfn(const LayerWeights& w, const float* x, int n, float* out, const kernels::KernelSet& k);
void MoeFfn(const ModelConfig& config, const LayerWeights& w, const float* x, int n, float* out,
            std::vector<uint64_t>* expert_tokens, const kernels::KernelSet& k);

// The MoE's parts, shared by MoeFfn and the expert-parallel form
// (moe_parallel.cpp). RouteToken: one token's router logits [E] -> its
// experts and weights (model.md 6), in selection order.
void RouteToken(const ModelConfig& config, const LayerWeights& w, const float* logits,
                std::vector<std::pair<int, float>>& picks);
// One expert's rows: ne input rows at x [ne, D]; RunExperts fills ye [ne, D]
// with SwiGLU_e of each row (h13, act are scratch). e is the global expert
// index; w holds experts from w.first_expert on.
struct ExpertRows {
  int e, ne;
  const float* x;
  std::vector<float> h13, act, ye;
};
void RunExperts(const LayerWeights& w, std::vector<ExpertRows>& work, int D, int I, const kernels::KernelSet& k);

// RoPE (4): YaRN frequencies and the two pairings.
std::vector<float> RopeFrequencies(const ModelConfig& config);
float MlaSoftmaxScale(const ModelConfig& config);
void RopeInterleaved(float* x, int dim, int64_t pos, const std::vector<float>& freqs);
void RopeHalfSplit(float* x, int dim, int64_t pos, const std::vector<float>& freqs);

}  // namespace moeserve::engine
