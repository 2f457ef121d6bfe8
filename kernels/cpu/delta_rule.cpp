// Gated delta rule kernels (model.md 5.3); see delta_rule.hpp.
#include "moeserve/kernels/delta_rule.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "variants.hpp"

namespace moeserve::kernels {

// One head's gated delta rule over T tokens, recurrent form:
//   S = exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t
// Two passes over S per token, both along its rows (contiguous): the first
// gathers S^T k, the second decays, updates and gathers S^T q at once. The
// decay is applied to S^T k instead of to S first (the same product, in
// another rounding order).
//
// Its loops run along rows, every sum in a fixed order, and the
// delta_rule_recurrent family's AVX2 and AVX-512 variants below are the same
// body vectorised by the compiler for that ISA. Without FMA in the target
// (baseline, AVX2) that gives the reference's bits; the AVX-512 target has
// FMA, and g++ contracts a * b + c into it in C++ (-ffp-contract=fast is its
// default there, whatever -std says), so that variant differs by rounding.
namespace {

[[gnu::always_inline]] inline void Recurrent(const float* q, const float* k, const float* v, const float* beta,
                                             const float* g, int T, int dk, int dv, size_t qk_stride,
                                             size_t v_stride, float* S, float* o, size_t o_stride) {
  std::vector<float> u(static_cast<size_t>(dv));
  for (int t = 0; t < T; ++t) {
    const float* qt = q + t * qk_stride;
    const float* kt = k + t * qk_stride;
    const float* vt = v + t * v_stride;
    float* ot = o + t * o_stride;
    const float decay = std::exp(g[t]);
    std::fill(u.begin(), u.end(), 0.0f);
    for (int i = 0; i < dk; ++i) {
      const float* row = S + static_cast<size_t>(i) * dv;
      const float ki = kt[i];
      for (int j = 0; j < dv; ++j) u[j] += row[j] * ki;
    }
    for (int j = 0; j < dv; ++j) {
      u[j] = beta[t] * (vt[j] - decay * u[j]);
      ot[j] = 0.0f;
    }
    for (int i = 0; i < dk; ++i) {
      float* row = S + static_cast<size_t>(i) * dv;
      const float ki = kt[i], qi = qt[i];
      for (int j = 0; j < dv; ++j) {
        row[j] = decay * row[j] + ki * u[j];
        ot[j] += row[j] * qi;
      }
    }
  }
}

}  // namespace

void DeltaRuleRecurrent(const float* q, const float* k, const float* v, const float* beta, const float* g, int T,
                        int dk, int dv, size_t qk_stride, size_t v_stride, float* S, float* o, size_t o_stride) {
  Recurrent(q, k, v, beta, g, T, dk, dv, qk_stride, v_stride, S, o, o_stride);
}

#if defined(__x86_64__)
namespace cpu {
__attribute__((target("avx2"))) void delta_rule_recurrent_avx2(const float* q, const float* k, const float* v,
                                                               const float* beta, const float* g, int T, int dk,
                                                               int dv, size_t qk_stride, size_t v_stride, float* S,
                                                               float* o, size_t o_stride) {
  Recurrent(q, k, v, beta, g, T, dk, dv, qk_stride, v_stride, S, o, o_stride);
}
__attribute__((target("avx512f"))) void delta_rule_recurrent_avx512(const float* q, const float* k, const float* v,
                                                                    const float* beta, const float* g, int T, int dk,
                                                                    int dv, size_t qk_stride, size_t v_stride,
                                                                    float* S, float* o, size_t o_stride) {
  Recurrent(q, k, v, beta, g, T, dk, dv, qk_stride, v_stride, S, o, o_stride);
}
}  // namespace cpu
#endif

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


}  // namespace moeserve::kernels
