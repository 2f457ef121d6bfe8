// DeltaNet's causal conv + silu (causal_conv_silu family): every variant
// this CPU supports against the reference, for channel counts that are and
// are not multiples of the vector widths, several tap counts, and a tail
// carried from earlier rows; and the reference against its definition.
#include "moeserve/kernels/causal_conv.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "each_variant.hpp"

namespace moeserve::kernels {
namespace {

struct ConvInputs {
  int T, n, K;
  size_t tail_stride, x_stride, out_stride;
  std::vector<float> tail, x, w;
};

ConvInputs MakeConv(int T, int n, int K, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  // Strides past the channels (a block of a wider row, as in the layer).
  ConvInputs in{T, n, K, static_cast<size_t>(n) + 5, static_cast<size_t>(n) + 3, static_cast<size_t>(n) + 7, {}, {}, {}};
  in.tail.resize(static_cast<size_t>(K - 1) * in.tail_stride);
  in.x.resize(static_cast<size_t>(T) * in.x_stride);
  in.w.resize(static_cast<size_t>(n) * K);
  for (auto* v : {&in.tail, &in.x, &in.w})
    for (float& f : *v) f = 2.0f * d(rng);
  return in;
}

TEST(CausalConv, ReferenceIsSiluOfTheTapSum) {
  std::mt19937 rng(11);
  const ConvInputs in = MakeConv(6, 5, 4, rng);
  std::vector<float> out(static_cast<size_t>(in.T) * in.out_stride, 0.0f);
  CausalConvSiluRef(in.tail.data(), in.tail_stride, in.x.data(), in.x_stride, in.T, in.n, in.w.data(), in.K, out.data(),
                    in.out_stride);
  for (int t = 0; t < in.T; ++t)
    for (int i = 0; i < in.n; ++i) {
      double acc = 0;
      for (int j = 0; j < in.K; ++j) {
        const int u = t + j;  // row of [tail ; x]
        const float xu = u < in.K - 1 ? in.tail[u * in.tail_stride + i] : in.x[(u - (in.K - 1)) * in.x_stride + i];
        acc += static_cast<double>(in.w[i * in.K + j]) * xu;
      }
      EXPECT_NEAR(out[t * in.out_stride + i], acc / (1.0 + std::exp(-acc)), 1e-5 * (1.0 + std::fabs(acc))) << t << "," << i;
    }
}

TEST(CausalConv, EveryVariantMatchesTheReference) {
  std::mt19937 rng(12);
  for (auto [T, n, K] : {std::tuple{1, 64, 4}, std::tuple{37, 128, 4}, std::tuple{5, 35, 4}, std::tuple{9, 16, 1},
                         std::tuple{12, 21, 3}, std::tuple{3, 48, 6}, std::tuple{4, 17, 10}}) {
    const ConvInputs in = MakeConv(T, n, K, rng);
    std::vector<float> ref(static_cast<size_t>(T) * in.out_stride, -3.0f);
    CausalConvSiluRef(in.tail.data(), in.tail_stride, in.x.data(), in.x_stride, T, n, in.w.data(), K, ref.data(),
                      in.out_stride);
    ForEachVariant("causal_conv_silu", [&](const KernelSet& k) {
      SCOPED_TRACE(std::string(k.causal_conv_silu.name) + " T=" + std::to_string(T) + " n=" + std::to_string(n) +
                   " K=" + std::to_string(K));
      std::vector<float> out(ref.size(), -3.0f);  // past each row's channels: left alone
      k.causal_conv_silu(in.tail.data(), in.tail_stride, in.x.data(), in.x_stride, T, n, in.w.data(), K, out.data(),
                         in.out_stride);
      // Sums in the same order; FMA contraction and the vector exp (2 ulp)
      // differ in the last bits.
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], ref[i], 2e-6 + 2e-6 * std::fabs(ref[i])) << "element " << i;
    });
  }
}

}  // namespace
}  // namespace moeserve::kernels
