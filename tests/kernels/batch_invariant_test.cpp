// KernelsBatchInvariant(isa): each row of a product, and each element of a
// gate, is the same bits whatever other rows share the call (1 to 21 rows:
// across the switch to the GEMM at kGemmMinRows), and the same as the set's
// own kernels give one row. Every Isa this CPU supports.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

#include "random_inputs.hpp"

namespace moeserve::kernels {
namespace {

bool SameBits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

constexpr size_t kOut = 100, kIn = 544;  // large enough for the threaded paths
const size_t kRows[] = {1, 2, 7, 8, 9, 15, 21};

// product(X, n, Y) of the invariant set against one(X, 1, Y) of the plain set, row by row.
template <class Product, class One>
void ExpectRowByRow(Product product, One one, const std::string& what) {
  std::mt19937 rng(11);
  for (size_t n : kRows) {
    const std::vector<float> X = Random(n * kIn, rng);
    std::vector<float> Y(n * kOut), y(kOut);
    product(X.data(), n, Y.data());
    for (size_t t = 0; t < n; ++t) {
      one(X.data() + t * kIn, 1, y.data());
      EXPECT_TRUE(SameBits(&Y[t * kOut], y.data(), kOut)) << what << ": row " << t << " of " << n;
    }
  }
}

TEST(BatchInvariantKernels, EachRowAsAlone) {
  std::mt19937 rng(5);
  const std::vector<float> W = Random(kOut * kIn, rng);
  std::vector<uint16_t> Wb(W.size());
  for (size_t i = 0; i < W.size(); ++i) Wb[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(W[i]) >> 16);
  std::vector<uint8_t> blocks(kOut * kIn / 2), scales(kOut * kIn / 32);
  ASSERT_EQ(Mxfp4EncodeMatrix(W.data(), kOut, kIn, blocks.data(), scales.data()), -1);
  const Mxfp4PackedStack packed(blocks.data(), scales.data(), 1, kOut, kIn);
  const Mxfp4PackedView w = packed.matrix(0);
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const KernelSet& inv = KernelsBatchInvariant(isa);
    const KernelSet& own = Kernels(isa);
    EXPECT_NE(std::string(inv.matmul_mxfp4.name).find("+rows"), std::string::npos);
    ExpectRowByRow([&](const float* X, size_t n, float* Y) { inv.matmul_f32(W.data(), kOut, kIn, X, n, Y); },
                   [&](const float* X, size_t n, float* Y) { own.matmul_f32(W.data(), kOut, kIn, X, n, Y); },
                   "matmul_f32");
    ExpectRowByRow([&](const float* X, size_t n, float* Y) { inv.matmul_bf16(Wb.data(), kOut, kIn, X, n, Y); },
                   [&](const float* X, size_t n, float* Y) { own.matmul_bf16(Wb.data(), kOut, kIn, X, n, Y); },
                   "matmul_bf16");
    ExpectRowByRow([&](const float* X, size_t n, float* Y) { inv.matmul_mxfp4(w, X, n, Y); },
                   [&](const float* X, size_t n, float* Y) { own.matmul_mxfp4(w, X, n, Y); }, "matmul_mxfp4");
  }
}

// Rows of 37 gated together: a row's tail falls anywhere in the vectors.
TEST(BatchInvariantKernels, GatesElementByElement) {
  std::mt19937 rng(9);
  constexpr size_t kWidth = 37;
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const KernelSet& inv = KernelsBatchInvariant(isa);
    for (size_t n : kRows) {
      const std::vector<float> a = Random(n * kWidth, rng), b = Random(n * kWidth, rng);
      std::vector<float> silu(a.size()), sig(a.size()), one(kWidth);
      inv.silu_mul(a.data(), b.data(), silu.data(), a.size());
      inv.sigmoid_mul(a.data(), b.data(), sig.data(), a.size());
      for (size_t t = 0; t < n; ++t) {
        inv.silu_mul(&a[t * kWidth], &b[t * kWidth], one.data(), kWidth);
        EXPECT_TRUE(SameBits(&silu[t * kWidth], one.data(), kWidth)) << "silu_mul row " << t << " of " << n;
        inv.sigmoid_mul(&a[t * kWidth], &b[t * kWidth], one.data(), kWidth);
        EXPECT_TRUE(SameBits(&sig[t * kWidth], one.data(), kWidth)) << "sigmoid_mul row " << t << " of " << n;
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels
