// Gated DeltaNet (model.md 5.3): causal depthwise convs, then per head the
// gated delta rule over a [head_k_dim, head_v_dim] state, in two equal forms:
// the recurrent step (decode) and the chunked WY form (prefill).
#include <algorithm>
#include <cmath>

#include "layers.hpp"
#include "moeserve/kernels/cpu_ops.hpp"

namespace moeserve::engine {

namespace {

// One head's gated delta rule over T tokens, recurrent form:
//   S = exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t
void DeltaRuleRecurrent(const float* q, const float* k, const float* v, const float* beta, const float* g, int T,
                        int dk, int dv, size_t qk_stride, size_t v_stride, float* S, float* o, size_t o_stride) {
  std::vector<float> u(static_cast<size_t>(dv));
  for (int t = 0; t < T; ++t) {
    const float* qt = q + t * qk_stride;
    const float* kt = k + t * qk_stride;
    const float* vt = v + t * v_stride;
    const float decay = std::exp(g[t]);
    for (int i = 0; i < dk * dv; ++i) S[i] *= decay;
    for (int j = 0; j < dv; ++j) {
      float ks = 0.0f;
      for (int i = 0; i < dk; ++i) ks += S[i * dv + j] * kt[i];
      u[j] = beta[t] * (vt[j] - ks);
    }
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j) S[i * dv + j] += kt[i] * u[j];
    float* ot = o + t * o_stride;
    for (int j = 0; j < dv; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < dk; ++i) acc += S[i * dv + j] * qt[i];
      ot[j] = acc;
    }
  }
}

// The same over chunks of C tokens (the WY representation). Within a chunk,
// with G_i the cumulative log-decay and S0 the state entering the chunk:
//   u_i = beta_i (v_i - e^{G_i} S0^T k_i) - sum_{j<i} beta_i e^{G_i-G_j} (k_i.k_j) u_j
//   o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i-G_j} (q_i.k_j) u_j
//   S_C = e^{G_C} S0 + sum_j e^{G_C-G_j} k_j u_j^T
// Intra-chunk work is dense [C, C] products instead of C sequential state
// updates, which is what makes the form fast on wide hardware.
void DeltaRuleChunked(const float* q, const float* k, const float* v, const float* beta, const float* g, int T, int dk,
                      int dv, size_t qk_stride, size_t v_stride, float* S, float* o, size_t o_stride, int C) {
  std::vector<float> G, KK, QK, U, S0q, S0k;
  for (int c0 = 0; c0 < T; c0 += C) {
    const int n = std::min(C, T - c0);
    G.assign(static_cast<size_t>(n), 0.0f);
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) G[i] = (acc += g[c0 + i]);
    KK.assign(static_cast<size_t>(n) * n, 0.0f);
    QK.assign(static_cast<size_t>(n) * n, 0.0f);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) {
        const float* ki = k + (c0 + i) * qk_stride;
        const float* kj = k + (c0 + j) * qk_stride;
        const float* qi = q + (c0 + i) * qk_stride;
        float dkk = 0.0f, dqk = 0.0f;
        for (int d = 0; d < dk; ++d) {
          dkk += ki[d] * kj[d];
          dqk += qi[d] * kj[d];
        }
        KK[i * n + j] = dkk;
        QK[i * n + j] = dqk;
      }
    // S0^T k_i and S0^T q_i for every token of the chunk.
    S0k.assign(static_cast<size_t>(n) * dv, 0.0f);
    S0q.assign(static_cast<size_t>(n) * dv, 0.0f);
    for (int i = 0; i < n; ++i) {
      const float* ki = k + (c0 + i) * qk_stride;
      const float* qi = q + (c0 + i) * qk_stride;
      for (int d = 0; d < dk; ++d)
        for (int j = 0; j < dv; ++j) {
          S0k[i * dv + j] += S[d * dv + j] * ki[d];
          S0q[i * dv + j] += S[d * dv + j] * qi[d];
        }
    }
    // Forward substitution for U (unit lower-triangular system).
    U.assign(static_cast<size_t>(n) * dv, 0.0f);
    for (int i = 0; i < n; ++i) {
      const float b = beta[c0 + i];
      const float eGi = std::exp(G[i]);
      const float* vi = v + (c0 + i) * v_stride;
      float* ui = &U[i * dv];
      for (int j = 0; j < dv; ++j) ui[j] = b * (vi[j] - eGi * S0k[i * dv + j]);
      for (int jj = 0; jj < i; ++jj) {
        const float a = b * std::exp(G[i] - G[jj]) * KK[i * n + jj];
        const float* uj = &U[jj * dv];
        for (int j = 0; j < dv; ++j) ui[j] -= a * uj[j];
      }
    }
    // Outputs.
    for (int i = 0; i < n; ++i) {
      float* oi = o + (c0 + i) * o_stride;
      const float eGi = std::exp(G[i]);
      for (int j = 0; j < dv; ++j) oi[j] = eGi * S0q[i * dv + j];
      for (int jj = 0; jj <= i; ++jj) {
        const float a = std::exp(G[i] - G[jj]) * QK[i * n + jj];
        const float* uj = &U[jj * dv];
        for (int j = 0; j < dv; ++j) oi[j] += a * uj[j];
      }
    }
    // State leaving the chunk.
    const float eGn = std::exp(G[n - 1]);
    for (int d = 0; d < dk * dv; ++d) S[d] *= eGn;
    for (int jj = 0; jj < n; ++jj) {
      const float a = std::exp(G[n - 1] - G[jj]);
      const float* kj = k + (c0 + jj) * qk_stride;
      const float* uj = &U[jj * dv];
      for (int d = 0; d < dk; ++d)
        for (int j = 0; j < dv; ++j) S[d * dv + j] += a * kj[d] * uj[j];
    }
  }
}

}  // namespace

void GatedDeltaNet(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out) {
  const DeltaConfig& d = ctx.config.delta;
  const int Hd = d.num_heads, dk = d.head_k_dim, dv = d.head_v_dim, K = d.conv_size;
  const int Cq = Hd * dk, Cv = Hd * dv, C = 2 * Cq + Cv;  // conv channels: q | k | v

  // 1. Projections for the whole batch: [n, q|k|v] pre-conv, a, b, g.
  std::vector<float> pre(static_cast<size_t>(n) * C), tmp_q(static_cast<size_t>(n) * Cq), tmp_k(tmp_q.size()),
      tmp_v(static_cast<size_t>(n) * Cv), a(static_cast<size_t>(n) * Hd), b(a.size()), gp(static_cast<size_t>(n) * Cv);
  Linear(w.q_proj, x, n, tmp_q.data(), ctx.options.kernels);
  Linear(w.k_proj, x, n, tmp_k.data(), ctx.options.kernels);
  Linear(w.v_proj, x, n, tmp_v.data(), ctx.options.kernels);
  Linear(w.a_proj, x, n, a.data(), ctx.options.kernels);
  Linear(w.b_proj, x, n, b.data(), ctx.options.kernels);
  Linear(w.g_proj, x, n, gp.data(), ctx.options.kernels);
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
    for (int h = 0; h < Hd; ++h) {
      const float* qh = &conv[static_cast<size_t>(h) * dk];
      const float* kh = &conv[static_cast<size_t>(Cq + h * dk)];
      const float* vh = &conv[static_cast<size_t>(2 * Cq + h * dv)];
      float* S = &st.S[static_cast<size_t>(h) * dk * dv];
      float* oh = &o[static_cast<size_t>(seg.row0) * Cv + static_cast<size_t>(h) * dv];
      if (chunked)
        DeltaRuleChunked(qh, kh, vh, &beta[static_cast<size_t>(h) * T], &g[static_cast<size_t>(h) * T], T, dk, dv, C, C, S, oh,
                         Cv, std::max(1, ctx.options.delta_chunk));
      else
        DeltaRuleRecurrent(qh, kh, vh, &beta[static_cast<size_t>(h) * T], &g[static_cast<size_t>(h) * T], T, dk, dv, C, C, S,
                           oh, Cv);
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
