// The FFNs: dense SwiGLU (model.md 3) and the MoE with group-limited sigmoid
// routing and shared experts (6).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "layers.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::engine {

namespace {

// An FP8 matrix times more than kSmallBatchMaxRows activation rows (prefill),
// the row count from which matmul_bf16 leaves its row-tile kernels for the
// fp32 GEMM. matmul_fp8_block has no GEMM tile (it re-reads and re-decodes
// the weights for every few rows), so here the weights are decoded to fp32 a
// block of output rows at a time (Fp8BlockToF32: code x scale rounded once,
// the very weights matmul_fp8_block and MatMulFp8BlockRef multiply by) and
// each block goes through the set's fp32 GEMM (f32_matmul_cols, what fp32
// matrices use), blocks in parallel. Only one block per thread is ever held
// in fp32 (widening the whole matrix, as the BF16 path does, would be four
// bytes a weight: 0.5 GiB for a 18432 x 7168 matrix). Decoding a block costs
// one pass over block x cols weights against n x block x cols FMAs.
// The batch-invariant set (deterministic) keeps matmul_fp8_block: the GEMM
// sums in another order than the row kernels, so a row's bits would depend on
// how many rows came with it; the reference set keeps its plain loops.
bool LinearFp8Gemm(const Matrix& W, const float* X, size_t n, float* Y, const kernels::KernelSet& k) {
  const size_t rows = static_cast<size_t>(W.rows), cols = static_cast<size_t>(W.cols);
  if (n <= kernels::kSmallBatchMaxRows || rows == 0 || cols == 0 || k.isa == kernels::Isa::kReference ||
      &k == &kernels::KernelsBatchInvariant(k.isa))
    return false;
  // The AVX-512 set: the same GEMM with each panel decoded from the codes as
  // it is packed (Fp8BlockGemm, the bits of the blocks below).
  if (kernels::IsaSupported(kernels::Isa::kAvx512) &&
      k.f32_matmul_cols.fn == kernels::Kernels(kernels::Isa::kAvx512).f32_matmul_cols.fn) {
    kernels::Fp8BlockGemm(W.fp8_view(), X, n, Y);
    return true;
  }
  kernels::ThreadPool& pool = kernels::DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  // 128 output rows a task (one scale row), halved down to 32 (the GEMM's
  // strip width) while that leaves fewer than two tasks a thread.
  size_t block = kernels::kFp8BlockSize;
  while (block > 32 && (rows + block - 1) / block < 2 * threads) block /= 2;
  const kernels::Fp8BlockView v = W.fp8_view();
  pool.ParallelFor((rows + block - 1) / block, [&](size_t t) {
    const size_t r0 = t * block, nr = std::min(block, rows - r0);
    thread_local std::vector<float> wb, yb;
    wb.resize(nr * cols);
    yb.resize(n * nr);
    kernels::Fp8BlockToF32(v, r0, r0 + nr, wb.data());
    k.f32_matmul_cols(wb.data(), nr, cols, X, n, yb.data(), 0, nr);
    for (size_t i = 0; i < n; ++i) std::copy_n(&yb[i * nr], nr, Y + i * rows + r0);
  });
  return true;
}

}  // namespace

void Linear(const Matrix& W, const float* X, int n, float* Y, const kernels::KernelSet& k) {
  if (W.bf16) return k.matmul_bf16(W.bf16, static_cast<size_t>(W.rows), static_cast<size_t>(W.cols), X, static_cast<size_t>(n), Y);
  // FP8 with block scales: a prefill chunk through the fp32 GEMM a block of
  // rows at a time (LinearFp8Gemm); one row in decode or a batch's rows with
  // the weights one byte each, scaled in fp32 as they are read.
  if (W.fp8) {
    if (LinearFp8Gemm(W, X, static_cast<size_t>(n), Y, k)) return;
    return k.matmul_fp8_block(W.fp8_view(), X, static_cast<size_t>(n), Y);
  }
  k.matmul_f32(W.w.data(), static_cast<size_t>(W.rows), static_cast<size_t>(W.cols), X, static_cast<size_t>(n), Y);
}

void LinearMany(std::initializer_list<LinearJob> jobs, int n, const kernels::KernelSet& k) {
  // A decode step's projections (up to kSmallBatchMaxRows rows) share one
  // parallel pass when every matrix is BF16. FP8 ones run one product each
  // (matmul_fp8_block splits each matrix's rows across the pool).
  bool batched = static_cast<size_t>(n) <= kernels::kSmallBatchMaxRows;
  for (const LinearJob& j : jobs) batched = batched && j.W->bf16 != nullptr;
  if (!batched) {
    for (const LinearJob& j : jobs) Linear(*j.W, j.X, n, j.Y, k);
    return;
  }
  std::vector<kernels::Bf16MatVecJob> kj;
  kj.reserve(jobs.size());
  for (const LinearJob& j : jobs)
    kj.push_back({j.W->bf16, static_cast<size_t>(j.W->rows), static_cast<size_t>(j.W->cols), j.X, j.Y});
  k.matvec_bf16_many(kj, static_cast<size_t>(n));
}

namespace {

// SwiGLU(x) = w2(silu(w1 x) * (w3 x)), accumulated into out with a weight.
void SwiGlu(const Matrix& w1, const Matrix& w3, const Matrix& w2, const float* x, int n, float* out,
            const kernels::KernelSet& k) {
  std::vector<float> h1(static_cast<size_t>(n) * w1.rows), h3(h1.size());
  LinearMany({{&w1, x, h1.data()}, {&w3, x, h3.data()}}, n, k);
  k.silu_mul(h1.data(), h3.data(), h1.data(), h1.size());
  Linear(w2, h1.data(), n, out, k);
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

namespace {

// One expert's product (w13 on x, or w2 on act) by the kernels of the
// experts' format.
void ExpertMatmul(const ExpertStack& stack, int first, const ExpertRows& r, const float* in, float* out,
                  const kernels::KernelSet& k) {
  if (stack.format == ExpertFormat::kMxfp4)
    return k.matmul_mxfp4(stack.expert(r.e - first), in, static_cast<size_t>(r.ne), out);
  k.matmul_bf16(stack.expert_bf16(r.e - first), static_cast<size_t>(stack.rows), static_cast<size_t>(stack.cols), in,
                static_cast<size_t>(r.ne), out);
}

// One product of every expert in `work` when each has at most
// kSmallBatchMaxRows (64) rows, the bound of both formats' decode kernels
// (a batched decode step): one parallel pass for all of them (the *_many
// kernels), each expert's weights read once for all its rows, instead of one
// hand-off per expert.
template <class In, class Out>
void ExpertMatVecs(const ExpertStack& stack, int first, std::vector<ExpertRows>& work, In in, Out out,
                   const kernels::KernelSet& k) {
  if (stack.format == ExpertFormat::kMxfp4) {
    std::vector<kernels::Mxfp4MatVecJob> jobs;
    for (ExpertRows& r : work) jobs.push_back({stack.expert(r.e - first), in(r), static_cast<size_t>(r.ne), out(r)});
    k.matvec_mxfp4_many(jobs);
    return;
  }
  const size_t rows = static_cast<size_t>(stack.rows), cols = static_cast<size_t>(stack.cols);
  // The BF16 pass takes one row count for all its jobs: one pass per count
  // present (a single one in single-sequence decode, where every expert has
  // 1 row).
  std::vector<kernels::Bf16MatVecJob> jobs;
  std::vector<bool> present(kernels::kSmallBatchMaxRows + 1, false);
  for (const ExpertRows& r : work) present[static_cast<size_t>(r.ne)] = true;
  for (size_t ne = 1; ne <= kernels::kSmallBatchMaxRows; ++ne) {
    if (!present[ne]) continue;
    jobs.clear();
    for (ExpertRows& r : work)
      if (static_cast<size_t>(r.ne) == ne) jobs.push_back({stack.expert_bf16(r.e - first), rows, cols, in(r), out(r)});
    k.matvec_bf16_many(jobs, ne);
  }
}

// act = silu(h1) * h3 for each row, h13 holding [h1 | h3] per row.
void SwiGluRows(ExpertRows& r, int I, const kernels::KernelSet& k) {
  for (int i = 0; i < r.ne; ++i) {
    const float* h = &r.h13[static_cast<size_t>(i) * 2 * I];
    k.silu_mul(h, h + I, &r.act[static_cast<size_t>(i) * I], static_cast<size_t>(I));
  }
}

}  // namespace

// The experts' gate/up products, SwiGLU, then their down products.
// Decode (every expert at most kSmallBatchMaxRows rows): each product one
// pass over all experts (ExpertMatVecs). Prefill:
// the experts side by side on the pool, each one's products and SwiGLU on
// one thread, largest first; an expert with more than its thread's share of
// the rows runs alone first, the pool splitting its columns. (One expert
// at a time, each split across the threads, cost two hand-offs per product
// and a serial SwiGLU, with a 512-token chunk's ~64 rows per expert.) Each
// expert's result is the same whichever thread computes it.
void RunExperts(const LayerWeights& w, std::vector<ExpertRows>& work, int D, int I, const kernels::KernelSet& k) {
  bool all_matvec = true;
  size_t total = 0;
  for (ExpertRows& r : work) {
    r.h13.resize(static_cast<size_t>(r.ne) * 2 * I);
    r.act.resize(static_cast<size_t>(r.ne) * I);
    r.ye.resize(static_cast<size_t>(r.ne) * D);
    all_matvec = all_matvec && static_cast<size_t>(r.ne) <= kernels::kSmallBatchMaxRows;
    total += static_cast<size_t>(r.ne);
  }
  const int first = w.first_expert;
  if (all_matvec) {
    ExpertMatVecs(w.w13, first, work, [](ExpertRows& r) { return r.x; }, [](ExpertRows& r) { return r.h13.data(); }, k);
    for (ExpertRows& r : work) SwiGluRows(r, I, k);
    ExpertMatVecs(
        w.w2e, first, work, [](ExpertRows& r) -> const float* { return r.act.data(); },
        [](ExpertRows& r) { return r.ye.data(); }, k);
    return;
  }
  const auto run = [&](ExpertRows& r) {
    ExpertMatmul(w.w13, first, r, r.x, r.h13.data(), k);
    SwiGluRows(r, I, k);
    ExpertMatmul(w.w2e, first, r, r.act.data(), r.ye.data(), k);
  };
  kernels::ThreadPool& pool = kernels::DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  std::vector<ExpertRows*> side;
  for (ExpertRows& r : work) {
    if (static_cast<size_t>(r.ne) * threads > total)
      run(r);
    else
      side.push_back(&r);
  }
  std::stable_sort(side.begin(), side.end(), [](const ExpertRows* a, const ExpertRows* b) { return a->ne > b->ne; });
  pool.ParallelFor(side.size(), [&](size_t i) { run(*side[i]); });
}

void RouteToken(const ModelConfig& cfg, const LayerWeights& w, const float* logits, std::vector<std::pair<int, float>>& picks) {
  const MoeConfig& m = cfg.moe;
  const int E = m.num_experts;
  const int per_group = E / m.n_group;
  std::vector<float> s(static_cast<size_t>(E)), sb(static_cast<size_t>(E));
  if (m.score_func == "softmax") {
    // Softmax over every expert, the top k by probability (ties: lower
    // index), renormalised over the k when norm_topk_prob (Qwen3-Next);
    // moe-dsa-v1's config parser admits only sigmoid.
    const float mx = *std::max_element(logits, logits + E);
    float total = 0.0f;
    for (int e = 0; e < E; ++e) total += (s[e] = std::exp(logits[e] - mx));
    for (int e = 0; e < E; ++e) s[e] /= total;
    std::vector<int> idx = TopK(s, m.experts_per_token);
    float sum = 0.0f;
    for (int e : idx) sum += s[e];
    const float norm = m.norm_topk_prob ? sum : 1.0f;
    picks.clear();
    for (int e : idx) picks.push_back({e, s[e] / norm * static_cast<float>(m.routed_scaling_factor)});
    return;
  }
  for (int e = 0; e < E; ++e) {
    s[e] = kernels::Sigmoid(logits[e]);
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
  picks.clear();
  for (int e : idx) picks.push_back({e, s[e] / sum * static_cast<float>(m.routed_scaling_factor)});
}

void DenseFfn(const LayerWeights& w, const float* x, int n, float* out, const kernels::KernelSet& k, PartClock* clock) {
  SwiGlu(w.w1, w.w3, w.w2, x, n, out, k);
  if (clock) clock->Mark(ProfilePart::kDenseFfn, LinearFlops({&w.w1, &w.w3, &w.w2}, n));
}

void MoeFfn(const ModelConfig& cfg, const LayerWeights& w, const float* x, int n, float* out,
            std::vector<uint64_t>* expert_tokens, const kernels::KernelSet& k, PartClock* clock) {
  PartClock off(nullptr, 0);
  PartClock& ck = clock ? *clock : off;
  const MoeConfig& m = cfg.moe;
  const int D = cfg.hidden_size, E = m.num_experts, I = m.moe_intermediate_size;

  // 1. Router logits and the shared experts' gate/up projections of x, as one
  // pass (LinearMany); routing per token: sigmoid scores, the bias only selects.
  ScratchFloats logits(static_cast<size_t>(n) * E), sh1, sh3;
  if (m.num_shared_experts > 0) {
    sh1.resize(static_cast<size_t>(n) * w.shared_w1.rows);
    sh3.resize(sh1.size());
    LinearMany({{&w.gate, x, logits.data()}, {&w.shared_w1, x, sh1.data()}, {&w.shared_w3, x, sh3.data()}}, n, k);
    ck.Mark(ProfilePart::kSharedExperts, LinearFlops({&w.gate, &w.shared_w1, &w.shared_w3}, n));
  } else {
    Linear(w.gate, x, n, logits.data(), k);
    ck.Mark(ProfilePart::kProjections, LinearFlops({&w.gate}, n));
  }
  std::vector<std::vector<std::pair<int, float>>> by_expert(static_cast<size_t>(E));  // (token, weight)
  std::vector<std::vector<std::pair<int, float>>> token_picks(static_cast<size_t>(n));
  ForRows(n, [&](int t) { RouteToken(cfg, w, &logits[static_cast<size_t>(t) * E], token_picks[static_cast<size_t>(t)]); });
  for (int t = 0; t < n; ++t) {
    for (const auto& [e, wt] : token_picks[static_cast<size_t>(t)]) {
      by_expert[e].push_back({t, wt});
      if (expert_tokens) (*expert_tokens)[e]++;
    }
  }

  ck.Mark(ProfilePart::kGlue);
  // 2. Shared experts for every token.
  if (m.num_shared_experts > 0) {
    k.silu_mul(sh1.data(), sh3.data(), sh1.data(), sh1.size());
    Linear(w.shared_w2, sh1.data(), n, out, k);
    if (w.shared_gate.rows == 1) {
      // A gated shared expert (Qwen3-Next): out *= sigmoid(shared_gate x).
      std::vector<float> sg(static_cast<size_t>(n));
      Linear(w.shared_gate, x, n, sg.data(), k);
      for (int t = 0; t < n; ++t) {
        const float gt = kernels::Sigmoid(sg[static_cast<size_t>(t)]);
        for (int j = 0; j < D; ++j) out[static_cast<size_t>(t) * D + j] *= gt;
      }
    }
    ck.Mark(ProfilePart::kSharedExperts, LinearFlops({&w.shared_w2, &w.shared_gate}, n));
  } else {
    std::fill(out, out + static_cast<size_t>(n) * D, 0.0f);
  }

  // 3. Routed experts, grouped: one pass per expert over the tokens routed to it.
  std::vector<ExpertRows> work;
  for (int e = 0; e < E; ++e)
    if (!by_expert[e].empty()) work.push_back({e, static_cast<int>(by_expert[e].size()), x, {}, {}, {}});
  // Tokens were routed in order, so an expert that has all of them reads x
  // as it is (always so in single-sequence decode); then the experts share
  // one input, which the MXFP4 pass quantises once. The others' rows are
  // gathered side by side on the pool.
  // (Decode, under 8 rows: inline, where a hand-off costs more than the copies.)
  const bool on_pool = n >= 8;
  const auto each = [&](size_t count, const std::function<void(size_t)>& fn) {
    if (on_pool) return kernels::DefaultThreadPool().ParallelFor(count, fn);
    for (size_t i = 0; i < count; ++i) fn(i);
  };
  std::vector<ScratchFloats> inputs(work.size());
  each(work.size(), [&](size_t wi) {
    ExpertRows& r = work[wi];
    if (r.ne == n) return;
    const auto& routed = by_expert[r.e];
    inputs[wi].resize(static_cast<size_t>(r.ne) * D);
    for (int i = 0; i < r.ne; ++i)
      std::copy_n(x + static_cast<size_t>(routed[i].first) * D, D, &inputs[wi][static_cast<size_t>(i) * D]);
    r.x = inputs[wi].data();
  });
  ck.Mark(ProfilePart::kGlue);
  RunExperts(w, work, D, I, k);
  double routed_rows = 0;
  for (const ExpertRows& r : work) routed_rows += r.ne;
  ck.Mark(ProfilePart::kExperts, 6.0 * routed_rows * D * I);  // w13 (2I x D) and w2 (D x I)
  // Each token's expert outputs added in expert order, tokens side by side
  // (in prefill) on the pool: the same sums in the same order either way.
  struct Part {
    const float* y;
    float wt;
  };
  std::vector<int> start(static_cast<size_t>(n) + 1, 0);
  for (const ExpertRows& r : work)
    for (int i = 0; i < r.ne; ++i) start[static_cast<size_t>(by_expert[r.e][i].first) + 1]++;
  for (int t = 0; t < n; ++t) start[t + 1] += start[t];
  std::vector<Part> parts(static_cast<size_t>(start[n]));
  std::vector<int> filled(start.begin(), start.end() - 1);
  for (const ExpertRows& r : work)
    for (int i = 0; i < r.ne; ++i) {
      const auto& [t, wt] = by_expert[r.e][i];
      parts[static_cast<size_t>(filled[t]++)] = {&r.ye[static_cast<size_t>(i) * D], wt};
    }
  constexpr int kTokensPerTask = 16;
  each(static_cast<size_t>((n + kTokensPerTask - 1) / kTokensPerTask), [&](size_t task) {
    for (int t = static_cast<int>(task) * kTokensPerTask; t < std::min(n, static_cast<int>(task + 1) * kTokensPerTask); ++t) {
      float* o = out + static_cast<size_t>(t) * D;
      for (int p = start[t]; p < start[t + 1]; ++p)
        for (int j = 0; j < D; ++j) o[j] += parts[p].wt * parts[p].y[j];
    }
  });
  ck.Mark(ProfilePart::kGlue);
}

}  // namespace moeserve::engine
