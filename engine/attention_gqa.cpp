// Gated grouped-query attention (LayerKind::kGqa, GqaConfig): Qwen3-Next's
// full-attention layers on the shared layer graph.
#include <algorithm>
#include <cmath>

#include "layers.hpp"
#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::engine {

std::vector<float> GqaRopeFrequencies(const GqaConfig& g) {
  // inv_freq_j = theta^(-2j / rotary_dim), j < rotary_dim / 2.
  std::vector<float> freqs;
  for (int j = 0; j < g.rotary_dim / 2; ++j)
    freqs.push_back(static_cast<float>(1.0 / std::pow(g.rope_theta, (2.0 * j) / g.rotary_dim)));
  return freqs;
}

// q, k per-head RMSNorm, rotary on the first rotary_dim dims of each head
// (half-split pairs), causal softmax attention over the cached k, v (GQA:
// head h reads kv head h / (H / Hkv)), o *= sigmoid(gate), then wo.
void GatedGqaAttention(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out) {
  const GqaConfig& c = ctx.config.gqa;
  const kernels::KernelSet& k = ctx.kernels;
  KvPool& pool = ctx.pool;
  const std::span<const SegmentRows> segs = ctx.segments;
  const size_t offset = ctx.cache_offset;
  const std::vector<float>& freqs = ctx.rope_freqs;
  PartClock& clock = ctx.clock;
  const int H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim, group = H / Hkv;
  const size_t qd = static_cast<size_t>(H) * hd, kd = static_cast<size_t>(Hkv) * hd;
  ScratchFloats q(static_cast<size_t>(n) * qd), gate(q.size()), kk(static_cast<size_t>(n) * kd), vv(kk.size());
  LinearMany({{&w.wq, x, q.data()}, {&w.wg, x, gate.data()}, {&w.wk, x, kk.data()}, {&w.wv, x, vv.data()}}, n, k);
  clock.Mark(ProfilePart::kProjections, LinearFlops({&w.wq, &w.wg, &w.wk, &w.wv}, n));
  const float eps = static_cast<float>(ctx.config.rms_norm_eps);
  for (const SegmentRows& s : segs) {
    ForRows(s.n, [&](int j) {
      const int t = s.row0 + j;
      const int64_t pos = s.pos0 + j;
      for (int h = 0; h < H; ++h) {
        float* qh = &q[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
        k.rms_norm(qh, w.q_norm.data(), eps, static_cast<size_t>(hd), qh);
        RopeHalfSplit(qh, c.rotary_dim, pos, freqs);
      }
      float* row = CachePart(pool, *s.cache, pos, offset, 2 * kd);
      for (int h = 0; h < Hkv; ++h) {
        float* kh = &kk[static_cast<size_t>(t) * kd + static_cast<size_t>(h) * hd];
        k.rms_norm(kh, w.k_norm.data(), eps, static_cast<size_t>(hd), kh);
        RopeHalfSplit(kh, c.rotary_dim, pos, freqs);
      }
      std::copy_n(&kk[static_cast<size_t>(t) * kd], kd, row);
      std::copy_n(&vv[static_cast<size_t>(t) * kd], kd, row + kd);
    });
  }
  clock.Mark(ProfilePart::kGlue);
  // Attention per (row, head), rows of a segment seeing positions 0 .. pos.
  ScratchFloats o(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  double flops = 0;
  // Every (row, head) of every segment in one parallel pass: a decode step
  // of many sequences hands off once per layer, not once per sequence. Each
  // job's result does not depend on where it runs.
  std::vector<std::vector<const float*>> seg_rows(segs.size());
  std::vector<size_t> first_job(segs.size() + 1, 0);
  // A prefill segment (kFlashRows rows or more) runs the tiled online-softmax
  // kernel (kernels::GqaSinkAttention with no sink: each key/value head's
  // rows read once per block of queries, the heads sharing it as the vector
  // lanes); the per-(row, head) loop below ran Qwen3-Next's 512-token
  // prefill attention at 2.5 GFLOP/s, 12 % of the prefill. Decode rows, the
  // batch-invariant set (one row's bits whatever its batch) and the
  // reference kernels keep the loop.
  constexpr int kFlashRows = 16;
  const bool flash_ok = !ctx.options.deterministic && k.isa != kernels::Isa::kReference;
  std::vector<char> flash(segs.size(), 0);
  for (size_t si = 0; si < segs.size(); ++si) {
    const SegmentRows& s = segs[si];
    const int64_t last = s.pos0 + s.n;
    seg_rows[si].resize(static_cast<size_t>(last));
    CachePartRows(pool, *s.cache, last, offset, 2 * kd, seg_rows[si].data());
    flash[si] = flash_ok && s.n >= kFlashRows;
    first_job[si + 1] = first_job[si] + (flash[si] ? 0 : static_cast<size_t>(s.n) * H);
    for (int j = 0; j < s.n; ++j) flops += 4.0 * H * hd * static_cast<double>(s.pos0 + j + 1);
  }
  // No sink: a logit of -1e30 starts each softmax (e^(-1e30 - max) is 0 in
  // fp32, and unlike -inf it leaves the kernel's padding lanes finite).
  std::vector<float> no_sinks(static_cast<size_t>(H), -1e30f);
  const kernels::GqaSinkShape shape{H, Hkv, hd, scale, no_sinks.data(), 0, kd};
  for (size_t si = 0; si < segs.size(); ++si) {
    if (!flash[si]) continue;
    const SegmentRows& s = segs[si];
    std::vector<int> first(static_cast<size_t>(s.n), 0), last(static_cast<size_t>(s.n));
    for (int j = 0; j < s.n; ++j) last[static_cast<size_t>(j)] = static_cast<int>(s.pos0 + j);
    float* o0 = &o[static_cast<size_t>(s.row0) * qd];
    kernels::GqaSinkAttention(shape, s.n, &q[static_cast<size_t>(s.row0) * qd], seg_rows[si].data(), first.data(),
                              last.data(), o0, k.isa);
    const float* g0 = &gate[static_cast<size_t>(s.row0) * qd];
    ForRows(s.n, [&](int j) {
      for (size_t i = static_cast<size_t>(j) * qd; i < static_cast<size_t>(j + 1) * qd; ++i)
        o0[i] *= kernels::Sigmoid(g0[i]);
    });
  }
  kernels::DefaultThreadPool().ParallelFor(first_job.back(), [&](size_t all_job) {
    const size_t si =
        static_cast<size_t>(std::upper_bound(first_job.begin(), first_job.end(), all_job) - first_job.begin()) - 1;
    const SegmentRows& s = segs[si];
    const std::vector<const float*>& rows = seg_rows[si];
    const size_t job = all_job - first_job[si];
    const int j = static_cast<int>(job / H), h = static_cast<int>(job % H);
    const int t = s.row0 + j, kvh = h / group;
    const int64_t visible = s.pos0 + j + 1;
    const float* qh = &q[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
    std::vector<float> sc(static_cast<size_t>(visible));
    float mx = -INFINITY;
    for (int64_t p = 0; p < visible; ++p) {
      const float* kp = rows[static_cast<size_t>(p)] + static_cast<size_t>(kvh) * hd;
      float d = 0;
      for (int i = 0; i < hd; ++i) d += qh[i] * kp[i];
      sc[static_cast<size_t>(p)] = d * scale;
      mx = std::max(mx, sc[static_cast<size_t>(p)]);
    }
    float sum = 0;
    for (float& v : sc) sum += (v = std::exp(v - mx));
    float* oh = &o[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
    std::fill(oh, oh + hd, 0.0f);
    for (int64_t p = 0; p < visible; ++p) {
      const float* vp = rows[static_cast<size_t>(p)] + kd + static_cast<size_t>(kvh) * hd;
      const float wgt = sc[static_cast<size_t>(p)] / sum;
      for (int i = 0; i < hd; ++i) oh[i] += wgt * vp[i];
    }
    const float* gh = &gate[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
    for (int i = 0; i < hd; ++i) oh[i] *= kernels::Sigmoid(gh[i]);
  });
  clock.Mark(ProfilePart::kAttention, flops);
  Linear(w.wo, o.data(), n, out, k);
  clock.Mark(ProfilePart::kProjections, LinearFlops({&w.wo}, n));
}

}  // namespace moeserve::engine
