// The layer kinds of model.md section 5 and 6, one function each. Inputs are
// the normed hidden states of every token in the batch, [N, D] row-major; the
// batch is a list of segments (consecutive token rows of one sequence).
#pragma once

#include <span>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
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
  KvPool& pool;
  std::span<const SegmentRows> segments;
  int layer;
  size_t cache_offset;                 // this layer's floats within a token row
  const std::vector<float>& rope_freqs;
  float mla_scale;
  ForwardTrace* trace;
};

// Linear helpers over the batch: Y[N, W.rows] = X[N, W.cols] W^T. kFast runs
// the dispatched, threaded CPU kernels (cpu_kernels.hpp); kReference the plain
// reference loops.
void Linear(const Matrix& W, const float* X, int n, float* Y, KernelChoice kernels = KernelChoice::kFast);
// Several Linears over n rows each, as one parallel pass when they are all
// BF16 matrix-vector products (decode): the projections of one input are
// small, and a pool hand-off per product costs more than their imbalance.
// Same results as one Linear per job.
struct LinearJob {
  const Matrix* W;
  const float* X;
  float* Y;
};
void LinearMany(std::initializer_list<LinearJob> jobs, int n, KernelChoice kernels = KernelChoice::kFast);
// RMSNorm of one row of length d, by the chosen kernels.
void RmsNormRow(const float* x, const float* w, float eps, int d, float* y, KernelChoice kernels);
// out = silu(a) * b and out = sigmoid(a) * b over n floats (out may alias a
// or b): vectorised with the fast kernels, the scalar forms with the reference.
void SiluMulRow(const float* a, const float* b, float* out, size_t n, KernelChoice kc);
void SigmoidMulRow(const float* a, const float* b, float* out, size_t n, KernelChoice kc);

// Gated MLA / DSA (5.1, 5.2): writes [N, D] into out.
void MlaAttention(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
// Gated DeltaNet (5.3).
void GatedDeltaNet(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
// Dense SwiGLU (3) and MoE (6).
void DenseFfn(const LayerWeights& w, const float* x, int n, float* out, KernelChoice kernels = KernelChoice::kFast);
void MoeFfn(const ModelConfig& config, const LayerWeights& w, const float* x, int n, float* out,
            std::vector<uint64_t>* expert_tokens, KernelChoice kernels = KernelChoice::kFast);

// RoPE (4): YaRN frequencies and the two pairings.
std::vector<float> RopeFrequencies(const ModelConfig& config);
float MlaSoftmaxScale(const ModelConfig& config);
void RopeInterleaved(float* x, int dim, int64_t pos, const std::vector<float>& freqs);
void RopeHalfSplit(float* x, int dim, int64_t pos, const std::vector<float>& freqs);

}  // namespace moeserve::engine
