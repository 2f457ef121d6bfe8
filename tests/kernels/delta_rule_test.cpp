// The recurrent gated delta rule (delta_rule_recurrent family): every
// variant this CPU supports against the reference (the same loops vectorised
// by the compiler for each Isa, every sum in the same order: the same bits,
// except where the target has FMA, AVX-512, whose contractions round
// differently); one step from a zero state against its closed form; the
// chunked form against the recurrent one.
#include "moeserve/kernels/delta_rule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "each_variant.hpp"

namespace moeserve::kernels {
namespace {

struct Inputs {
  int T, dk, dv;
  size_t qk_stride, v_stride, o_stride;
  std::vector<float> q, k, v, beta, g, S;
};

Inputs Make(int T, int dk, int dv, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::uniform_real_distribution<float> u(0.05f, 0.95f), lg(-0.7f, -0.01f);
  // Strides past the row (tokens interleaved with other heads' data).
  Inputs in{T, dk, dv, static_cast<size_t>(dk) + 3, static_cast<size_t>(dv) + 1, static_cast<size_t>(dv) + 2, {}, {}, {}, {}, {}, {}};
  in.q.resize(static_cast<size_t>(T) * in.qk_stride);
  in.k.resize(in.q.size());
  in.v.resize(static_cast<size_t>(T) * in.v_stride);
  for (auto* vec : {&in.q, &in.k, &in.v})
    for (float& x : *vec) x = d(rng);
  for (int t = 0; t < T; ++t) {
    in.beta.push_back(u(rng));
    in.g.push_back(lg(rng));
  }
  in.S.resize(static_cast<size_t>(dk) * dv);
  for (float& x : in.S) x = d(rng);
  return in;
}

TEST(DeltaRule, EveryVariantMatchesTheReference) {
  std::mt19937 rng(3);
  for (auto [T, dk, dv] : {std::tuple{1, 1, 1}, std::tuple{3, 7, 9}, std::tuple{5, 16, 16}, std::tuple{2, 33, 65},
                           std::tuple{4, 128, 128}, std::tuple{1, 64, 17}}) {
    const Inputs in = Make(T, dk, dv, rng);
    std::vector<float> S_ref = in.S, o_ref(static_cast<size_t>(T) * in.o_stride, 0.0f);
    DeltaRuleRecurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), T, dk, dv, in.qk_stride,
                       in.v_stride, S_ref.data(), o_ref.data(), in.o_stride);
    ForEachVariant("delta_rule_recurrent", [&](const KernelSet& k) {
      SCOPED_TRACE(std::string(k.delta_rule_recurrent.name) + " T=" + std::to_string(T) + " dk=" + std::to_string(dk) +
                   " dv=" + std::to_string(dv));
      std::vector<float> S = in.S, o(o_ref.size(), 0.0f);
      k.delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), T, dk, dv,
                             in.qk_stride, in.v_stride, S.data(), o.data(), in.o_stride);
      // The AVX-512 variant (its row's, and the rows that fall back to it)
      // sums in another order; the others are the reference's loops.
      if (std::string(k.delta_rule_recurrent.name) != "delta_rule_recurrent_avx512") {
        EXPECT_EQ(std::memcmp(S.data(), S_ref.data(), S.size() * 4), 0) << "state";
        EXPECT_EQ(std::memcmp(o.data(), o_ref.data(), o.size() * 4), 0) << "output";
        return;
      }
      for (size_t i = 0; i < S.size(); ++i) ASSERT_NEAR(S[i], S_ref[i], 2e-4 + 1e-5 * std::fabs(S_ref[i])) << "S " << i;
      for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], o_ref[i], 2e-4 + 1e-5 * std::fabs(o_ref[i])) << "o " << i;
    });
  }
}

TEST(DeltaRule, OneStepFromZeroStateIsItsClosedForm) {
  // S0 = 0: u = beta v, S = k u^T, o = S^T q = (k . q) beta v.
  std::mt19937 rng(4);
  const int dk = 5, dv = 6;
  Inputs in = Make(1, dk, dv, rng);
  std::fill(in.S.begin(), in.S.end(), 0.0f);
  double kq = 0;
  for (int i = 0; i < dk; ++i) kq += static_cast<double>(in.k[i]) * in.q[i];
  ForEachVariant("delta_rule_recurrent", [&](const KernelSet& k) {
    std::vector<float> S = in.S, o(in.o_stride, 0.0f);
    k.delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), 1, dk, dv, in.qk_stride,
                           in.v_stride, S.data(), o.data(), in.o_stride);
    for (int j = 0; j < dv; ++j) {
      EXPECT_NEAR(o[j], kq * in.beta[0] * in.v[j], 1e-6) << j;
      for (int i = 0; i < dk; ++i) EXPECT_NEAR(S[i * dv + j], in.k[i] * in.beta[0] * in.v[j], 1e-6);
    }
  });
}

TEST(DeltaRule, ChunkedEqualsRecurrent) {
  std::mt19937 rng(5);
  for (int C : {1, 4, 64}) {
    const Inputs in = Make(37, 24, 20, rng);
    std::vector<float> S_rec = in.S, S_chunk = in.S, o_rec(37 * in.o_stride, 0.0f), o_chunk(o_rec.size(), 0.0f);
    DeltaRuleRecurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), 37, 24, 20, in.qk_stride,
                       in.v_stride, S_rec.data(), o_rec.data(), in.o_stride);
    DeltaRuleChunked(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), 37, 24, 20, in.qk_stride,
                     in.v_stride, S_chunk.data(), o_chunk.data(), in.o_stride, C);
    for (size_t i = 0; i < S_rec.size(); ++i) ASSERT_NEAR(S_chunk[i], S_rec[i], 1e-4) << "C=" << C << " S " << i;
    for (size_t i = 0; i < o_rec.size(); ++i) ASSERT_NEAR(o_chunk[i], o_rec[i], 1e-4) << "C=" << C << " o " << i;
  }
}

// The delta_rule_chunked family: every variant against the reference chunked
// form and the recurrent one, on both presets' head shapes and odd ones,
// lengths that are and are not multiples of the chunk, a carried-in state and
// a second call continuing the first's state (a prompt prefilled in pieces).
// The variants sum in another order than the reference (blocked products,
// FMA, a polynomial exp): within 2e-4 absolute + 2e-4 relative at these
// magnitudes (|o| up to a few units), where the reference itself is within
// about 1e-5 of the recurrent form.
TEST(DeltaRule, EveryChunkedVariantMatchesTheReferenceAndTheRecurrentForm) {
  std::mt19937 rng(6);
  for (auto [T, dk, dv, C] : {std::tuple{1, 64, 128, 64}, std::tuple{64, 64, 128, 64}, std::tuple{150, 64, 128, 64},
                              std::tuple{97, 64, 128, 32}, std::tuple{70, 32, 64, 64}, std::tuple{33, 32, 64, 16},
                              std::tuple{45, 24, 20, 8}, std::tuple{19, 7, 9, 5}, std::tuple{40, 33, 65, 64}}) {
    const Inputs in = Make(T, dk, dv, rng);
    const int T1 = T / 3;  // the first call's tokens; the second continues its state
    const auto run = [&](auto&& chunked, std::vector<float>& S, std::vector<float>& o) {
      chunked(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), T1, dk, dv, in.qk_stride,
              in.v_stride, S.data(), o.data(), in.o_stride, C);
      chunked(in.q.data() + T1 * in.qk_stride, in.k.data() + T1 * in.qk_stride, in.v.data() + T1 * in.v_stride,
              in.beta.data() + T1, in.g.data() + T1, T - T1, dk, dv, in.qk_stride, in.v_stride, S.data(),
              o.data() + T1 * in.o_stride, in.o_stride, C);
    };
    std::vector<float> S_ref = in.S, o_ref(static_cast<size_t>(T) * in.o_stride, 0.0f);
    run(DeltaRuleChunked, S_ref, o_ref);
    std::vector<float> S_rec = in.S, o_rec(o_ref.size(), 0.0f);
    DeltaRuleRecurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), T, dk, dv, in.qk_stride,
                       in.v_stride, S_rec.data(), o_rec.data(), in.o_stride);
    ForEachVariant("delta_rule_chunked", [&](const KernelSet& k) {
      SCOPED_TRACE(std::string(k.delta_rule_chunked.name) + " T=" + std::to_string(T) + " dk=" + std::to_string(dk) +
                   " dv=" + std::to_string(dv) + " C=" + std::to_string(C));
      // Past each output row (the stride's gap) must stay as it was.
      std::vector<float> S = in.S, o(o_ref.size(), -7.0f);
      for (int t = 0; t < T; ++t) std::fill_n(o.begin() + t * in.o_stride, dv, 0.0f);
      run(k.delta_rule_chunked, S, o);
      const auto near = [](float x, float want) { return std::fabs(x - want) <= 2e-4 + 2e-4 * std::fabs(want); };
      for (size_t i = 0; i < S.size(); ++i) {
        ASSERT_TRUE(near(S[i], S_ref[i])) << "S " << i << ": " << S[i] << " vs reference " << S_ref[i];
        ASSERT_TRUE(near(S[i], S_rec[i])) << "S " << i << ": " << S[i] << " vs recurrent " << S_rec[i];
      }
      for (int t = 0; t < T; ++t)
        for (size_t j = 0; j < in.o_stride; ++j) {
          const size_t i = t * in.o_stride + j;
          if (j >= static_cast<size_t>(dv)) {
            ASSERT_EQ(o[i], -7.0f) << "wrote past row " << t;
            continue;
          }
          ASSERT_TRUE(near(o[i], o_ref[i])) << "o " << t << "," << j << ": " << o[i] << " vs reference " << o_ref[i];
          ASSERT_TRUE(near(o[i], o_rec[i])) << "o " << t << "," << j << ": " << o[i] << " vs recurrent " << o_rec[i];
        }
    });
  }
}

TEST(DeltaRule, ChunkedVariantsKeepAStrongDecayFinite) {
  // Log-decays of -30 per token: over a chunk of 64, G reaches -1920, whose
  // e^{-G} would overflow a factored e^{G_i} e^{-G_j}; the differences form
  // stays finite. Each token then all but forgets the past: o_t tends to
  // beta_t (k_t . q_t) v_t, as from a zero state.
  std::mt19937 rng(7);
  const int T = 80, dk = 64, dv = 128;
  Inputs in = Make(T, dk, dv, rng);
  std::fill(in.g.begin(), in.g.end(), -30.0f);
  std::vector<float> S_ref = in.S, o_ref(static_cast<size_t>(T) * in.o_stride, 0.0f);
  DeltaRuleRecurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), T, dk, dv, in.qk_stride,
                     in.v_stride, S_ref.data(), o_ref.data(), in.o_stride);
  ForEachVariant("delta_rule_chunked", [&](const KernelSet& k) {
    std::vector<float> S = in.S, o(o_ref.size(), 0.0f);
    k.delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), T, dk, dv, in.qk_stride,
                         in.v_stride, S.data(), o.data(), in.o_stride, 64);
    for (size_t i = 0; i < S.size(); ++i) ASSERT_NEAR(S[i], S_ref[i], 1e-4) << "S " << i;
    for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], o_ref[i], 1e-4) << "o " << i;
  });
}

}  // namespace
}  // namespace moeserve::kernels
