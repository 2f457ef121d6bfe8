// Gated DeltaNet (model.md 5.3): causal depthwise convs, then per head the
// gated delta rule over a [head_k_dim, head_v_dim] state, in two equal forms:
// the recurrent step (decode) and the chunked WY form (prefill).
#include <algorithm>
#include <cmath>

#include "layers.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/delta_rule.hpp"

namespace moeserve::engine {

void GatedDeltaNet(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out) {
  const DeltaConfig& d = ctx.config.delta;
  const int Hd = d.num_heads, dk = d.head_k_dim, dv = d.head_v_dim, K = d.conv_size;
  const int Cq = Hd * dk, Cv = Hd * dv, C = 2 * Cq + Cv;  // conv channels: q | k | v

  // 1. Projections for the whole batch: [n, q|k|v] pre-conv, a, b, g.
  std::vector<float> pre(static_cast<size_t>(n) * C), tmp_q(static_cast<size_t>(n) * Cq), tmp_k(tmp_q.size()),
      tmp_v(static_cast<size_t>(n) * Cv), a(static_cast<size_t>(n) * Hd), b(a.size()), gp(static_cast<size_t>(n) * Cv);
  LinearMany({{&w.q_proj, x, tmp_q.data()},
              {&w.k_proj, x, tmp_k.data()},
              {&w.v_proj, x, tmp_v.data()},
              {&w.a_proj, x, a.data()},
              {&w.b_proj, x, b.data()},
              {&w.g_proj, x, gp.data()}},
             n, ctx.options.kernels);
  for (int t = 0; t < n; ++t) {
    std::copy_n(&tmp_q[static_cast<size_t>(t) * Cq], Cq, &pre[static_cast<size_t>(t) * C]);
    std::copy_n(&tmp_k[static_cast<size_t>(t) * Cq], Cq, &pre[static_cast<size_t>(t) * C + Cq]);
    std::copy_n(&tmp_v[static_cast<size_t>(t) * Cv], Cv, &pre[static_cast<size_t>(t) * C + 2 * Cq]);
  }

  std::vector<float> o(static_cast<size_t>(n) * Cv);
  for (const SegmentRows& seg : ctx.segments) {
    DeltaLayerState& st = seg.cache->delta[static_cast<size_t>(ctx.layer)];
    const int T = seg.n;
    // 2. Causal depthwise conv over [tail (K-1 rows) ; new rows], then silu.
    std::vector<float> ext(static_cast<size_t>(K - 1 + T) * C);
    std::copy(st.conv_tail.begin(), st.conv_tail.end(), ext.begin());
    std::copy_n(&pre[static_cast<size_t>(seg.row0) * C], static_cast<size_t>(T) * C, ext.begin() + static_cast<long>(K - 1) * C);
    std::vector<float> conv(static_cast<size_t>(T) * C);
    for (int t = 0; t < T; ++t)
      for (int ch = 0; ch < C; ++ch) {
        const Matrix& W = ch < Cq ? w.q_conv : ch < 2 * Cq ? w.k_conv : w.v_conv;
        const int wc = ch < Cq ? ch : ch < 2 * Cq ? ch - Cq : ch - 2 * Cq;
        float acc = 0.0f;
        for (int j = 0; j < K; ++j) acc += W.w[static_cast<size_t>(wc) * K + j] * ext[static_cast<size_t>(t + j) * C + ch];
        conv[static_cast<size_t>(t) * C + ch] = kernels::Silu(acc);
      }
    std::copy(ext.end() - static_cast<long>(K - 1) * C, ext.end(), st.conv_tail.begin());

    // 3. L2-normalise q and k per head (q also scaled by dk^-0.5); beta and g.
    const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2 * Hd; ++h) {
        float* vec = &conv[static_cast<size_t>(t) * C + static_cast<size_t>(h) * dk];
        float ss = 0.0f;
        for (int i = 0; i < dk; ++i) ss += vec[i] * vec[i];
        float inv = 1.0f / std::sqrt(ss + 1e-6f);
        if (h < Hd) inv *= qscale;
        for (int i = 0; i < dk; ++i) vec[i] *= inv;
      }
    std::vector<float> beta(static_cast<size_t>(T) * Hd), g(beta.size());
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < Hd; ++h) {
        const size_t r = static_cast<size_t>(seg.row0 + t) * Hd + h;
        beta[static_cast<size_t>(h) * T + t] = kernels::Sigmoid(b[r]);
        g[static_cast<size_t>(h) * T + t] = -std::exp(w.A_log[h]) * kernels::Softplus(a[r] + w.dt_bias[h]);
      }

    // 4. The delta rule per head.
    const bool chunked = ctx.options.delta_form == DeltaForm::kChunked ||
                         (ctx.options.delta_form == DeltaForm::kAuto && T > 1);
    auto head = [&](size_t hs) {
      const int h = static_cast<int>(hs);
      const float* qh = &conv[static_cast<size_t>(h) * dk];
      const float* kh = &conv[static_cast<size_t>(Cq + h * dk)];
      const float* vh = &conv[static_cast<size_t>(2 * Cq + h * dv)];
      float* S = &st.S[static_cast<size_t>(h) * dk * dv];
      float* oh = &o[static_cast<size_t>(seg.row0) * Cv + static_cast<size_t>(h) * dv];
      if (chunked)
        kernels::DeltaRuleChunked(qh, kh, vh, &beta[static_cast<size_t>(h) * T], &g[static_cast<size_t>(h) * T], T, dk, dv, C, C, S, oh,
                         Cv, std::max(1, ctx.options.delta_chunk));
      else
        kernels::DeltaRuleRecurrent(qh, kh, vh, &beta[static_cast<size_t>(h) * T], &g[static_cast<size_t>(h) * T], T, dk, dv, C, C, S,
                           oh, Cv);
    };
    // Heads are independent: in parallel with the fast kernels.
    if (ctx.options.kernels == KernelChoice::kFast) {
      kernels::DefaultThreadPool().ParallelFor(static_cast<size_t>(Hd), head);
    } else {
      for (int h = 0; h < Hd; ++h) head(static_cast<size_t>(h));
    }
  }

  // 5. Gated RMSNorm per head, then the output projection.
  const float eps = static_cast<float>(d.norm_eps);
  std::vector<float> normed(dv);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < Hd; ++h) {
      float* oh = &o[static_cast<size_t>(t) * Cv + static_cast<size_t>(h) * dv];
      RmsNormRow(oh, w.o_norm.data(), eps, dv, normed.data(), ctx.options.kernels);
      for (int j = 0; j < dv; ++j) oh[j] = normed[j] * kernels::Silu(gp[static_cast<size_t>(t) * Cv + h * dv + j]);
    }
  Linear(w.o_proj, o.data(), n, out, ctx.options.kernels);
}

}  // namespace moeserve::engine
