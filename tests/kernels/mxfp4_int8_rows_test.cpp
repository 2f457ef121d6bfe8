// The MXFP4 products over int8-quantised activations at many rows (prefill):
// the family mxfp4_matvec_rows (mxfp4_gemm_vnni.cpp's tiles of rows on
// AVX-512, the matrix-vector block elsewhere), and the sets of
// KernelsWithDecodeActivationBits, which take it at every row count from
// kMxfp4GemmMinRows on, so each row's result must be, bit for bit,
// the scalar matrix-vector block's on that row's quantised activations, and
// the one the row gets when multiplied alone. Shapes cross the kernel's
// k chunks (32 blocks), row panels (96 rows), tiles (6, 8 or 12 rows, with
// every tail) and a partial last group of outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/mxfp4_activation_bits.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {
namespace {

struct Matrix {
  size_t out, in;
  std::vector<uint8_t, WeightAllocator<uint8_t>> codes;  // 64-byte aligned, as the kernels load them
  std::vector<uint8_t> scales;
  Mxfp4PackedView view() const { return {codes.data(), scales.data(), out, in}; }
};

Matrix RandomMatrix(size_t out, size_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> blocks(out * in / 2), file_scales(out * in / 32);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : file_scales) s = static_cast<uint8_t>(118 + rng() % 16);
  Matrix m{out, in, {}, std::vector<uint8_t>(Mxfp4PackedScaleBytes(out, in))};
  m.codes.resize(Mxfp4PackedCodeBytes(out, in));
  PackMxfp4(blocks.data(), file_scales.data(), out, in, m.codes.data(), m.scales.data());
  return m;
}

std::vector<float> RandomActivations(size_t n, size_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * in);
  // Blocks and rows of different magnitudes, and a few outliers.
  for (size_t k = 0; k < x.size(); ++k) {
    x[k] = nd(rng) * std::ldexp(1.0f, static_cast<int>((k / 32 + k / in) % 9) - 4);
    if (rng() % 97 == 0) x[k] *= 30.0f;
  }
  return x;
}

// The scalar building block, row by row: the expected bits.
std::vector<float> ScalarRows(const Matrix& m, const std::vector<float>& x, size_t n, int parts) {
  const KernelSet& s = Kernels(Isa::kScalar);
  std::vector<float> y(n * m.out);
  Mxfp4ActivationBuffer buffer;
  for (size_t t = 0; t < n; ++t) {
    const Mxfp4Activations& a = buffer.Quantize(x.data() + t * m.in, 1, m.in, s.mxfp4_quantize.fn, parts);
    s.mxfp4_matvec(m.view(), a, y.data() + t * m.out, 0, Mxfp4PackedGroups(m.out), 0, m.in / 32);
  }
  return y;
}

TEST(Mxfp4Int8Rows, EveryRowCountGivesTheScalarBlocksBitsRowByRow) {
  struct Shape {
    size_t out, in;
    std::vector<size_t> rows;
  };
  // 200 x 2048: 13 groups (the last of 8 rows), 64 blocks = two k chunks,
  // tiles with every tail; 40 x 1088: 34 blocks (a chunk and a remainder of
  // 2), row counts past one and two panels.
  for (const Shape& s : {Shape{200, 2048, {8, 9, 13, 23}}, Shape{40, 1088, {97, 203}}}) {
    const Matrix m = RandomMatrix(s.out, s.in, static_cast<uint32_t>(s.out * 7 + s.in));
    for (int parts : {1, 2}) {
      const int bits = Mxfp4ActBits(parts);
      for (size_t n : s.rows) {
        const std::vector<float> x = RandomActivations(n, s.in, static_cast<uint32_t>(n + parts));
        const std::vector<float> want = ScalarRows(m, x, n, parts);
        size_t checked = 0;
        for (Isa isa : SupportedIsas()) {
          if (isa == Isa::kReference) continue;
          const KernelSet& k = KernelsWithDecodeActivationBits(isa, bits);
          std::vector<float> y(n * s.out, -1.0f);
          k.matmul_mxfp4(m.view(), x.data(), n, y.data());
          for (size_t t = 0; t < n; ++t)
            ASSERT_EQ(0, std::memcmp(y.data() + t * s.out, want.data() + t * s.out, s.out * sizeof(float)))
                << k.matmul_mxfp4.name << " bits " << bits << " n " << n << " row " << t << " out " << s.out;
          ++checked;
        }
        EXPECT_GE(checked, 1u);
      }
    }
  }
}

// The family itself (mxfp4_matvec_rows of every set this CPU runs) on one
// quantised batch, whole and in two ranges of blocks (the second adds to
// the first's sums in Y, as a k-split caller would), and on part of the
// groups, against the scalar matrix-vector block on the same activations.
TEST(Mxfp4Int8Rows, TheFamilyGivesTheMatrixVectorBlocksBits) {
  const size_t out = 200, in = 2048, n = 29, groups = Mxfp4PackedGroups(out), nb = in / 32;
  const Matrix m = RandomMatrix(out, in, 77);
  const std::vector<float> x = RandomActivations(n, in, 78);
  const KernelSet& s = Kernels(Isa::kScalar);
  for (int parts : {1, 2, 3}) {
    Mxfp4ActivationBuffer buffer;
    const Mxfp4Activations& a = buffer.Quantize(x.data(), n, in, s.mxfp4_quantize.fn, parts);
    std::vector<float> want(n * out, -1.0f);
    s.mxfp4_matvec(m.view(), a, want.data(), 0, groups, 0, nb);
    for (Isa isa : SupportedIsas()) {
      const KernelSet& k = Kernels(isa);
      const std::string what = std::string(k.mxfp4_matvec_rows.name) + " parts " + std::to_string(parts);
      std::vector<float> y(n * out, -2.0f);
      k.mxfp4_matvec_rows(m.view(), a, y.data(), 0, groups, 0, nb);
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float))) << what;
      std::fill(y.begin(), y.end(), -3.0f);
      k.mxfp4_matvec_rows(m.view(), a, y.data(), 0, groups, 0, 40);
      k.mxfp4_matvec_rows(m.view(), a, y.data(), 0, groups, 40, nb);
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float))) << what << " in two block ranges";
      std::fill(y.begin(), y.end(), -4.0f);
      k.mxfp4_matvec_rows(m.view(), a, y.data(), 3, 9, 0, nb);
      for (size_t t = 0; t < n; ++t)
        for (size_t o = 0; o < out; ++o) {
          const bool inside = o >= 3 * 16 && o < 9 * 16;
          ASSERT_EQ(y[t * out + o], inside ? want[t * out + o] : -4.0f) << what << " groups 3-9, row " << t << " out " << o;
        }
    }
  }
}

TEST(Mxfp4Int8Rows, ARowInABatchGetsTheBitsItGetsAlone) {
  const Matrix m = RandomMatrix(320, 2880, 21);
  const size_t n = 40;
  const std::vector<float> x = RandomActivations(n, 2880, 5);
  for (Isa isa : SupportedIsas()) {
    if (isa == Isa::kReference) continue;
    const KernelSet& k = KernelsWithDecodeActivationBits(isa, 16);
    std::vector<float> batch(n * 320), alone(320);
    k.matmul_mxfp4(m.view(), x.data(), n, batch.data());
    for (size_t t = 0; t < n; ++t) {
      k.matmul_mxfp4(m.view(), x.data() + t * 2880, 1, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + t * 320, sizeof(float) * 320))
          << k.matmul_mxfp4.name << " row " << t;
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels
