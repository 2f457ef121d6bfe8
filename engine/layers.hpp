// The layer kinds of model.md section 5 and 6, one function each. Inputs are
// the normed hidden states of every token in the batch, [N, D] row-major; the
// batch is a list of segments (consecutive token rows of one sequence).
#pragma once

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <utility>
#include <span>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "weights.hpp"

namespace moeserve::engine {

// One segment's rows within the batch: rows [row0, row0 + n) hold positions
// [pos0, pos0 + n) of `cache`.
struct SegmentRows {
  SequenceCache* cache;
  int row0;
  int n;
  int64_t pos0;
  // ForwardSegment::state_trail: the recurrent state after each token (null: not kept).
  std::vector<std::vector<DeltaLayerState>>* state_trail = nullptr;
};

// Charges the time between marks to a part of a ForwardProfile (model.hpp):
// each Mark() gives the time since the previous one (or construction) to
// its part, so a layer's parts add up to its time. Without a profile every
// call is one null test.
class PartClock {
 public:
  PartClock(ForwardProfile* profile, int row) : p_(profile), row_(row) {
    if (p_) last_ = std::chrono::steady_clock::now();
  }
  bool on() const { return p_ != nullptr; }
  void Mark(ProfilePart part, double flops = 0, double bytes = 0) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    const int i = static_cast<int>(part);
    p_->seconds[row_][i] += std::chrono::duration<double>(now - last_).count();
    p_->flops[row_][i] += flops;
    p_->bytes[row_][i] += bytes;
    last_ = now;
  }
  // Restarts the clock without charging anyone (time others have timed).
  void Skip() {
    if (p_) last_ = std::chrono::steady_clock::now();
  }
  // Work without time (counted where the shapes are known, timed by a later Mark).
  void Add(ProfilePart part, double flops) {
    if (p_) p_->flops[row_][static_cast<int>(part)] += flops;
  }

 private:
  ForwardProfile* p_;
  int row_;
  std::chrono::steady_clock::time_point last_{};
};

// 2 n rows cols: the logical work of Linear(W) over n rows, summed over Ws.
inline double LinearFlops(std::initializer_list<const Matrix*> ws, int n) {
  double f = 0;
  for (const Matrix* w : ws) f += 2.0 * n * static_cast<double>(w->rows) * static_cast<double>(w->cols);
  return f;
}

// Where position pos of the sequence keeps the cache part at per-token offset
// part_offset, part_floats wide (KvPool::PartRow: a part's rows of a block
// are stored together).
inline float* CachePart(KvPool& pool, const SequenceCache& cache, int64_t pos, size_t part_offset, size_t part_floats) {
  const int bt = pool.block_tokens();
  return pool.PartRow(cache.blocks[static_cast<size_t>(pos / bt)], static_cast<int>(pos % bt), part_offset, part_floats);
}

// out[s] = CachePart(pool, cache, s, ...) for s < n, a block at a time
// (a decode step at 1M tokens builds such a table per layer: one division
// and product per position cost milliseconds there).
inline void CachePartRows(KvPool& pool, const SequenceCache& cache, int64_t n, size_t part_offset, size_t part_floats,
                          const float** out) {
  const int bt = pool.block_tokens();
  for (int64_t b = 0; b * bt < n; ++b) {
    const float* row = pool.PartRow(cache.blocks[static_cast<size_t>(b)], 0, part_offset, part_floats);
    const int64_t end = std::min<int64_t>(n - b * bt, bt);
    const float** o = out + b * bt;
    for (int64_t j = 0; j < end; ++j) o[j] = row + static_cast<size_t>(j) * part_floats;
  }
}

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
  size_t cache_offset;                 // this layer's first part's offset in the per-token floats (CachePart)
  const std::vector<float>& rope_freqs;  // this layer kind's: MLA/DSA (YaRN) or GQA
  float mla_scale;
  ForwardTrace* trace;
  PartClock& clock;  // this layer's timers (a no-op without a profile)
};

// Linear helpers over the batch: Y[N, W.rows] = X[N, W.cols] W^T, by the
// given kernels' BF16, FP8 block-scaled (matmul_fp8_block) or fp32 product.
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

// Scratch whose every element is written before it is read: a vector whose
// resize leaves new floats unset. (Value-initialising the layers' buffers
// was a serial memset of megabytes per layer and chunk in prefill, about a
// twentieth of the time.)
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using ScratchFloats = std::vector<float, UninitAllocator<float>>;

// fn(t) for each row t in [0, n), each row independent of the others: in
// blocks of kRowsPerTask on the pool in prefill, inline in decode (where a
// hand-off costs more than the rows). The per-row steps between the
// products (norms, RoPE, cache writes, routing) ran on one thread while the
// others waited: a tenth of a BF16 prefill.
inline constexpr int kRowsPerTask = 32;
template <class Fn>
void ForRows(int n, Fn&& fn) {
  if (n < 2 * kRowsPerTask) {
    for (int t = 0; t < n; ++t) fn(t);
    return;
  }
  kernels::DefaultThreadPool().ParallelFor(static_cast<size_t>((n + kRowsPerTask - 1) / kRowsPerTask), [&](size_t b) {
    const int t0 = static_cast<int>(b) * kRowsPerTask;
    for (int t = t0; t < std::min(n, t0 + kRowsPerTask); ++t) fn(t);
  });
}

// Gated MLA / DSA (5.1, 5.2): writes [N, D] into out.
void MlaAttention(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
// Gated DeltaNet (5.3).
void GatedDeltaNet(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
// Gated grouped-query attention (LayerKind::kGqa, GqaConfig; attention_gqa.cpp):
// ctx.rope_freqs are GqaRopeFrequencies, ctx.cache_offset this layer's k | v.
void GatedGqaAttention(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out);
std::vector<float> GqaRopeFrequencies(const GqaConfig& gqa);
// Dense SwiGLU (3) and MoE (6).
// clock: optional timers (PartClock).
void DenseFfn(const LayerWeights& w, const float* x, int n, float* out, const kernels::KernelSet& k,
              PartClock* clock = nullptr);
void MoeFfn(const ModelConfig& config, const LayerWeights& w, const float* x, int n, float* out,
            std::vector<uint64_t>* expert_tokens, const kernels::KernelSet& k, PartClock* clock = nullptr);

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
  ScratchFloats h13, act, ye;
};
void RunExperts(const LayerWeights& w, std::vector<ExpertRows>& work, int D, int I, const kernels::KernelSet& k);

// RoPE (4): YaRN frequencies and the two pairings.
std::vector<float> RopeFrequencies(const ModelConfig& config);
float MlaSoftmaxScale(const ModelConfig& config);
void RopeInterleaved(float* x, int dim, int64_t pos, const std::vector<float>& freqs);
void RopeHalfSplit(float* x, int dim, int64_t pos, const std::vector<float>& freqs);

// DsaConfig::index_fp8: x[dim] <- FP8-rounded (Hadamard(x) / sqrt(dim)), in
// place (index_fp8.cpp).
void IndexHadamardFp8(float* x, int dim, bool ue8m0);

}  // namespace moeserve::engine
