// BF16 weights: the fast front door (matvec below 8 rows, widened GEMM above)
// against the reference, on odd shapes; the reference against fp32 on the
// widened weights (conversion is exact).
#include "moeserve/kernels/bf16_matmul.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "moeserve/kernels/cpu_ops.hpp"

namespace moeserve::kernels {
namespace {

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TEST(Bf16MatMul, FastMatchesReferenceAndFp32) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto [out, in, n] : {std::tuple{1, 1, 1}, std::tuple{7, 33, 1}, std::tuple{130, 257, 3}, std::tuple{64, 1024, 7},
                            std::tuple{100, 96, 8}, std::tuple{301, 515, 19}, std::tuple{1, 4096, 1}}) {
    std::vector<uint16_t> W(static_cast<size_t>(out) * in);
    std::vector<float> Wf(W.size()), X(static_cast<size_t>(n) * in);
    for (size_t i = 0; i < W.size(); ++i) {
      W[i] = ToBf16(d(rng));
      uint32_t u = static_cast<uint32_t>(W[i]) << 16;
      std::memcpy(&Wf[i], &u, 4);
    }
    for (auto& x : X) x = d(rng);
    std::vector<float> ref(static_cast<size_t>(n) * out), fast(ref.size()), f32(ref.size());
    MatMulBf16Ref(W.data(), out, in, X.data(), n, ref.data());
    MatMulBf16(W.data(), out, in, X.data(), n, fast.data());
    MatMulF32Ref(Wf.data(), out, in, X.data(), n, f32.data());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(ref[i], f32[i]) << "reference must equal fp32 on widened weights";
      EXPECT_NEAR(fast[i], ref[i], 1e-4 * std::sqrt(static_cast<double>(in)) + 1e-5) << out << "x" << in << " n " << n;
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels
