// The FFNs: dense SwiGLU (model.md 3) and the MoE with group-limited sigmoid
// routing and shared experts (6).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "layers.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"

namespace moeserve::engine {

void Linear(const Matrix& W, const float* X, int n, float* Y, KernelChoice kc) {
  if (!W.bf16.empty()) {
    if (kc == KernelChoice::kReference)
      kernels::MatMulBf16Ref(W.bf16.data(), static_cast<size_t>(W.rows), static_cast<size_t>(W.cols), X, static_cast<size_t>(n), Y);
    else
      kernels::MatMulBf16(W.bf16.data(), static_cast<size_t>(W.rows), static_cast<size_t>(W.cols), X, static_cast<size_t>(n), Y);
    return;
  }
  if (kc == KernelChoice::kReference)
    kernels::MatMulF32Ref(W.w.data(), static_cast<size_t>(W.rows), static_cast<size_t>(W.cols), X, static_cast<size_t>(n), Y);
  else
    kernels::MatMulF32(W.w.data(), static_cast<size_t>(W.rows), static_cast<size_t>(W.cols), X, static_cast<size_t>(n), Y);
}

void RmsNormRow(const float* x, const float* w, float eps, int d, float* y, KernelChoice kc) {
  if (kc == KernelChoice::kReference) kernels::RmsNormRef(x, w, eps, static_cast<size_t>(d), y);
  else kernels::RmsNorm(x, w, eps, static_cast<size_t>(d), y);
}

namespace {

// SwiGLU(x) = w2(silu(w1 x) * (w3 x)), accumulated into out with a weight.
void SwiGlu(const Matrix& w1, const Matrix& w3, const Matrix& w2, const float* x, int n, float* out, KernelChoice kc) {
  std::vector<float> h1(static_cast<size_t>(n) * w1.rows), h3(h1.size());
  Linear(w1, x, n, h1.data(), kc);
  Linear(w3, x, n, h3.data(), kc);
  for (size_t i = 0; i < h1.size(); ++i) h1[i] = kernels::Silu(h1[i]) * h3[i];
  Linear(w2, h1.data(), n, out, kc);
}

// Indices of the k largest values, ties to the lower index, in rank order.
std::vector<int> TopK(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace

void DenseFfn(const LayerWeights& w, const float* x, int n, float* out, KernelChoice kc) {
  SwiGlu(w.w1, w.w3, w.w2, x, n, out, kc);
}

void MoeFfn(const ModelConfig& cfg, const LayerWeights& w, const float* x, int n, float* out,
            std::vector<uint64_t>* expert_tokens, KernelChoice kc) {
  std::vector<uint8_t> ref_blocks, ref_scales;  // the reference path's unpacked expert
  const auto mxfp4_matmul = [&](const kernels::Mxfp4PackedView& W, const float* X, int n, float* Y) {
    if (kc != KernelChoice::kReference) return kernels::MatMulMxfp4(W, X, static_cast<size_t>(n), Y);
    ref_blocks.resize(W.out * W.in / 2);
    ref_scales.resize(W.out * W.in / 32);
    kernels::UnpackMxfp4(W, ref_blocks.data(), ref_scales.data());
    kernels::MatMulMxfp4Ref(ref_blocks.data(), ref_scales.data(), W.out, W.in, X, static_cast<size_t>(n), Y);
  };
  const MoeConfig& m = cfg.moe;
  const int D = cfg.hidden_size, E = m.num_experts, I = m.moe_intermediate_size;
  const int per_group = E / m.n_group;

  // 1. Routing per token: sigmoid scores; the bias only selects.
  std::vector<float> logits(static_cast<size_t>(n) * E);
  Linear(w.gate, x, n, logits.data(), kc);
  std::vector<std::vector<std::pair<int, float>>> by_expert(static_cast<size_t>(E));  // (token, weight)
  for (int t = 0; t < n; ++t) {
    std::vector<float> s(static_cast<size_t>(E)), sb(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      s[e] = kernels::Sigmoid(logits[static_cast<size_t>(t) * E + e]);
      sb[e] = s[e] + w.gate_bias[e];
    }
    if (m.n_group > 1) {
      std::vector<float> group_score(static_cast<size_t>(m.n_group));
      for (int gi = 0; gi < m.n_group; ++gi) {
        std::vector<float> members(sb.begin() + gi * per_group, sb.begin() + (gi + 1) * per_group);
        std::partial_sort(members.begin(), members.begin() + 2, members.end(), std::greater<float>());
        group_score[gi] = members[0] + members[1];
      }
      std::vector<int> keep = TopK(group_score, m.topk_group);
      std::vector<bool> kept(static_cast<size_t>(m.n_group), false);
      for (int gi : keep) kept[gi] = true;
      for (int e = 0; e < E; ++e)
        if (!kept[e / per_group]) sb[e] = -std::numeric_limits<float>::infinity();
    }
    std::vector<int> idx = TopK(sb, m.experts_per_token);
    float sum = 0.0f;
    for (int e : idx) sum += s[e];
    for (int e : idx) {
      by_expert[e].push_back({t, s[e] / sum * static_cast<float>(m.routed_scaling_factor)});
      if (expert_tokens) (*expert_tokens)[e]++;
    }
  }

  // 2. Shared experts for every token.
  if (m.num_shared_experts > 0) {
    SwiGlu(w.shared_w1, w.shared_w3, w.shared_w2, x, n, out, kc);
  } else {
    std::fill(out, out + static_cast<size_t>(n) * D, 0.0f);
  }

  // 3. Routed experts, grouped: one pass per expert over the tokens routed to it.
  std::vector<float> xe, h13, act, ye;
  for (int e = 0; e < E; ++e) {
    const auto& routed = by_expert[e];
    if (routed.empty()) continue;
    const int ne = static_cast<int>(routed.size());
    xe.resize(static_cast<size_t>(ne) * D);
    for (int r = 0; r < ne; ++r) std::copy_n(x + static_cast<size_t>(routed[r].first) * D, D, &xe[static_cast<size_t>(r) * D]);
    h13.resize(static_cast<size_t>(ne) * 2 * I);
    mxfp4_matmul(w.w13.expert(e), xe.data(), ne, h13.data());
    act.resize(static_cast<size_t>(ne) * I);
    for (int r = 0; r < ne; ++r)
      for (int j = 0; j < I; ++j)
        act[static_cast<size_t>(r) * I + j] =
            kernels::Silu(h13[static_cast<size_t>(r) * 2 * I + j]) * h13[static_cast<size_t>(r) * 2 * I + I + j];
    ye.resize(static_cast<size_t>(ne) * D);
    mxfp4_matmul(w.w2e.expert(e), act.data(), ne, ye.data());
    for (int r = 0; r < ne; ++r) {
      float* o = out + static_cast<size_t>(routed[r].first) * D;
      const float wt = routed[r].second;
      for (int j = 0; j < D; ++j) o[j] += wt * ye[static_cast<size_t>(r) * D + j];
    }
  }
}

}  // namespace moeserve::engine
