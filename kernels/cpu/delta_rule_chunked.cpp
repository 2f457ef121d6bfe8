// The chunked gated delta rule (delta_rule_chunked family) as blocked small
// GEMMs; DeltaRuleChunked (delta_rule.cpp) is its reference. Per chunk of n
// tokens, with G_i the cumulative log-decay, E_ij = e^{G_i - G_j} (j <= i)
// and S0 the state entering the chunk:
//   KK = K K^T, QK = Q K^T                     [n, n], lower triangles only
//   U  = beta (V - e^G S0^T K), then (I + L) U = U with L_ij = beta_i E_ij KK_ij
//        (j < i): a unit lower-triangular solve, blocked along rows
//   O  = e^G S0^T Q + M U,  M_ij = E_ij QK_ij (j <= i)
//   S  = e^{G_n} S0 + (e^{G_n - G_j} K_j)^T U
// Every product runs on one register-tiled micro-kernel (Tile): rows of A
// broadcast, rows of B loaded as vectors, R x NV accumulators. The solve is
// the same micro-kernel over the rows already solved, then the block's own
// R rows in registers. Decays enter only as differences G_i - G_j <= 0 (G
// falls along the chunk), so no factor overflows however strong the decay.
//
// One body for every Isa, written with GCC vector types of W floats
// (vector_ext.hpp) and compiled for the variant's target: W = 16 (AVX-512),
// 8 (AVX2+FMA), 4 (the scalar set). Buffers are padded to 16 floats per row
// so every W tiles them. Single-threaded: the engine runs heads in parallel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "moeserve/kernels/delta_rule.hpp"
#include "variants.hpp"
#include "vector_ext.hpp"

namespace moeserve::kernels::cpu {
namespace {

// The micro-kernel's shape per vector width: rows x vectors of
// accumulators, within the register file (16 of 32 zmm; 8 of 16 ymm / xmm).
template <int W>
struct Shape {
  static constexpr int kRows = 4, kVecs = W == 16 ? 4 : 2;
};

constexpr int kPad = 16;  // row padding of every scratch buffer, in floats
constexpr int Padded(int x) { return (x + kPad - 1) / kPad * kPad; }

// Y rows [0, R) (of stride ldy), columns [0, NV * W):
//   acc = kLoad ? Y : 0;  acc += A[:, 0:kend] B[0:kend, :]
// and with kSolve, then in row order acc_r += sum_{r' < r} A[r, i0 + r'] acc_r'
// (the block's own rows of (I - A) Y = Y0, A strictly lower-triangular).
// A is row-major with stride lda, B with ldb.
template <int W, int R, int NV, bool kLoad, bool kSolve>
[[gnu::always_inline]] inline void Tile(const float* A, size_t lda, const float* B, size_t ldb, int kend, float* Y,
                                        size_t ldy, int i0) {
  using V = typename vec::Of<W>::F;
  V acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = V{};
      if (kLoad) vec::Load(acc[r][v], Y + r * ldy + v * W);
    }
  for (int p = 0; p < kend; ++p) {
    V b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) vec::Load(b[v], B + p * ldb + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float a = A[r * lda + p];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  if constexpr (kSolve) {
#pragma GCC unroll 8
    for (int r = 1; r < R; ++r)
#pragma GCC unroll 8
      for (int s = 0; s < r; ++s) {
        const float a = A[r * lda + i0 + s];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] += a * acc[s][v];
      }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) vec::Store(Y + r * ldy + v * W, acc[r][v]);
}

// Which k each block of rows [i0, i0 + rows) sums over, and which columns it
// computes.
enum class Span {
  kAll,           // k < K, all columns
  kThroughBlock,  // k < i0 + rows (A zero above its diagonal), all columns
  kBeforeBlock,   // k < i0, then the block's own rows (kSolve)
  kLowerColumns,  // k < K, columns below i0 + rows (rounded up to the padding)
};

// Rows [i0, i0 + Rb) of Gemm below. (Helpers are always_inline templates,
// never lambdas: a lambda's body would be compiled for the baseline ISA, not
// the variant's target.)
template <int W, int Rb, bool kLoad, bool kSolve>
[[gnu::always_inline]] inline void RowBlock(int i0, int cols, int K, Span span, const float* A, size_t lda,
                                            const float* B, size_t ldb, float* Y, size_t ldy) {
  constexpr int NV = Shape<W>::kVecs;
  const int kend = span == Span::kThroughBlock ? std::min(K, i0 + Rb) : span == Span::kBeforeBlock ? i0 : K;
  const int cend = span == Span::kLowerColumns ? std::min(cols, Padded(i0 + Rb)) : cols;
  const float* a = A + static_cast<size_t>(i0) * lda;
  float* y = Y + static_cast<size_t>(i0) * ldy;
  int c = 0;
  for (; c + NV * W <= cend; c += NV * W) Tile<W, Rb, NV, kLoad, kSolve>(a, lda, B + c, ldb, kend, y + c, ldy, i0);
  for (; c < cend; c += W) Tile<W, Rb, 1, kLoad, kSolve>(a, lda, B + c, ldb, kend, y + c, ldy, i0);
}

// Y[m, cols] (+)= A[m, K] B[K, cols] over Tiles, spans as above.
template <int W, bool kLoad, bool kSolve>
[[gnu::always_inline]] inline void Gemm(int m, int cols, int K, Span span, const float* A, size_t lda,
                                        const float* B, size_t ldb, float* Y, size_t ldy) {
  constexpr int R = Shape<W>::kRows;
  int i0 = 0;
  for (; i0 + R <= m; i0 += R) RowBlock<W, R, kLoad, kSolve>(i0, cols, K, span, A, lda, B, ldb, Y, ldy);
  if constexpr (R > 4)
    for (; i0 + 4 <= m; i0 += 4) RowBlock<W, 4, kLoad, kSolve>(i0, cols, K, span, A, lda, B, ldb, Y, ldy);
  if constexpr (R > 2)
    for (; i0 + 2 <= m; i0 += 2) RowBlock<W, 2, kLoad, kSolve>(i0, cols, K, span, A, lda, B, ldb, Y, ldy);
  for (; i0 < m; ++i0) RowBlock<W, 1, kLoad, kSolve>(i0, cols, K, span, A, lda, B, ldb, Y, ldy);
}

struct ScratchDeleter {
  void operator()(float* p) const { FreeScratch(p); }
};

template <int W>
[[gnu::always_inline]] inline void Chunked(const float* q, const float* k, const float* v, const float* beta,
                                           const float* g, int T, int dk, int dv, size_t qk_stride, size_t v_stride,
                                           float* S, float* o, size_t o_stride, int C) {
  if (T <= 0) return;
  C = std::max(1, std::min(C, T));
  const int dkp = Padded(dk), dvp = Padded(dv), Cp = Padded(C);
  // Scratch, every row padded: the state, Q and K of the chunk, K^T, the
  // [C, C] products (then L and M), U, S0^T Q (then O), and per-token rows.
  const size_t nS = static_cast<size_t>(dkp) * dvp, nQK = static_cast<size_t>(Cp) * dkp,
               nKT = static_cast<size_t>(dkp) * Cp, nCC = static_cast<size_t>(Cp) * Cp,
               nU = static_cast<size_t>(Cp) * dvp;
  const size_t total = nS + 2 * nQK + nKT + 2 * nCC + 2 * nU + 4 * static_cast<size_t>(Cp);
  std::unique_ptr<float, ScratchDeleter> scratch(AllocScratch(total));
  float* const Sp = scratch.get();
  std::fill(Sp, Sp + total, 0.0f);  // the padding stays zero throughout
  float* const Qp = Sp + nS;
  float* const Kp = Qp + nQK;
  float* const KT = Kp + nQK;
  float* const L = KT + nKT;
  float* const M = L + nCC;
  float* const U = M + nCC;
  float* const O = U + nU;
  float* const G = O + nU;
  float* const eG = G + Cp;
  float* const E = eG + Cp;
  float* const decay = E + Cp;

  for (int d = 0; d < dk; ++d) std::copy(S + static_cast<size_t>(d) * dv, S + static_cast<size_t>(d + 1) * dv, Sp + d * dvp);

  for (int c0 = 0; c0 < T; c0 += C) {
    const int n = std::min(C, T - c0);
    for (int i = 0; i < n; ++i) {
      const float* qi = q + (c0 + i) * qk_stride;
      const float* ki = k + (c0 + i) * qk_stride;
      std::copy(qi, qi + dk, Qp + i * dkp);
      std::copy(ki, ki + dk, Kp + i * dkp);
      for (int d = 0; d < dk; ++d) KT[d * Cp + i] = ki[d];
    }
    // The next chunk's rows, while this one computes: q, k, v are rows of a
    // wider matrix (all heads' channels), a stride apart, which the hardware
    // prefetchers do not run ahead on.
    for (int i = c0 + n; i < std::min(T, c0 + n + C); ++i) {
      for (int d = 0; d < dk; d += 16) {
        __builtin_prefetch(q + i * qk_stride + d);
        __builtin_prefetch(k + i * qk_stride + d);
      }
      for (int d = 0; d < dv; d += 16) __builtin_prefetch(v + i * v_stride + d);
    }
    // Decays: G cumulative (in the reference's order), e^{G_i}, and
    // e^{G_{n-1} - G_j} for the state update.
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) G[i] = (acc += g[c0 + i]);
    for (int i = 0; i < Cp; ++i) {
      eG[i] = i < n ? G[i] : 0.0f;
      decay[i] = i < n ? G[n - 1] - G[i] : 0.0f;
    }
    vec::ExpArray<W>(eG, Cp);
    vec::ExpArray<W>(decay, Cp);

    // KK and QK (lower triangles), S0^T K and S0^T Q.
    Gemm<W, false, false>(n, Cp, dk, Span::kLowerColumns, Kp, dkp, KT, Cp, L, Cp);
    Gemm<W, false, false>(n, Cp, dk, Span::kLowerColumns, Qp, dkp, KT, Cp, M, Cp);
    Gemm<W, false, false>(n, dvp, dk, Span::kAll, Kp, dkp, Sp, dvp, U, dvp);
    Gemm<W, false, false>(n, dvp, dk, Span::kAll, Qp, dkp, Sp, dvp, O, dvp);

    for (int i = 0; i < n; ++i) {
      // L_ij = -beta_i E_ij KK_ij (j < i), M_ij = E_ij QK_ij (j <= i), zero
      // elsewhere (so the products may run past the diagonal).
      for (int j = 0; j < Cp; ++j) E[j] = G[i] - (j < n ? G[j] : 0.0f);
      vec::ExpArray<W>(E, Cp);
      const float b = beta[c0 + i];
      float* Li = L + i * Cp;
      float* Mi = M + i * Cp;
      for (int j = 0; j < Cp; ++j) {
        Li[j] = j < i ? -b * E[j] * Li[j] : 0.0f;
        Mi[j] = j <= i ? E[j] * Mi[j] : 0.0f;
      }
      // U_i = beta_i (v_i - e^{G_i} S0^T k_i);  O_i = e^{G_i} S0^T q_i.
      const float* vi = v + (c0 + i) * v_stride;
      float* Ui = U + i * dvp;
      float* Oi = O + i * dvp;
      for (int j = 0; j < dv; ++j) Ui[j] = b * (vi[j] - eG[i] * Ui[j]);
      for (int j = 0; j < dv; ++j) Oi[j] *= eG[i];
    }
    // The solve: L holds -beta_i E_ij KK_ij, so U = U0 + L U, row block by
    // row block; then O += M U.
    Gemm<W, true, true>(n, dvp, n, Span::kBeforeBlock, L, Cp, U, dvp, U, dvp);
    Gemm<W, true, false>(n, dvp, n, Span::kThroughBlock, M, Cp, U, dvp, O, dvp);
    for (int i = 0; i < n; ++i) std::copy(O + i * dvp, O + i * dvp + dv, o + (c0 + i) * o_stride);
    // S = e^{G_{n-1}} S0 + (decay K)^T U.
    for (int d = 0; d < dk; ++d)
      for (int j = 0; j < n; ++j) KT[d * Cp + j] *= decay[j];
    const float eGn = eG[n - 1];
    for (size_t i = 0; i < nS; ++i) Sp[i] *= eGn;
    Gemm<W, true, false>(dk, dvp, n, Span::kAll, KT, Cp, U, dvp, Sp, dvp);
  }

  for (int d = 0; d < dk; ++d) std::copy(Sp + d * dvp, Sp + d * dvp + dv, S + static_cast<size_t>(d) * dv);
}

}  // namespace

void delta_rule_chunked_scalar(const float* q, const float* k, const float* v, const float* beta, const float* g,
                               int T, int dk, int dv, size_t qk_stride, size_t v_stride, float* S, float* o,
                               size_t o_stride, int C) {
  Chunked<4>(q, k, v, beta, g, T, dk, dv, qk_stride, v_stride, S, o, o_stride, C);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void delta_rule_chunked_avx2(const float* q, const float* k, const float* v,
                                                                 const float* beta, const float* g, int T, int dk,
                                                                 int dv, size_t qk_stride, size_t v_stride, float* S,
                                                                 float* o, size_t o_stride, int C) {
  Chunked<8>(q, k, v, beta, g, T, dk, dv, qk_stride, v_stride, S, o, o_stride, C);
}
__attribute__((target("avx512f,fma"))) void delta_rule_chunked_avx512(const float* q, const float* k,
                                                                      const float* v, const float* beta,
                                                                      const float* g, int T, int dk, int dv,
                                                                      size_t qk_stride, size_t v_stride, float* S,
                                                                      float* o, size_t o_stride, int C) {
  Chunked<16>(q, k, v, beta, g, T, dk, dv, qk_stride, v_stride, S, o, o_stride, C);
}
#endif

}  // namespace moeserve::kernels::cpu
