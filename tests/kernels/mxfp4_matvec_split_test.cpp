// The split-activation MXFP4 matrix-vector product (mxfp4_matvec_split.hpp):
// the quantiser's rounding bound, every variant this CPU runs bit-identical
// to the scalar reference, and each within its documented bound of the exact
// product over the same dequantised weights.
#include "moeserve/kernels/mxfp4_matvec_split.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {
namespace {

struct Matrix {
  size_t out, in;
  std::vector<uint8_t, WeightAllocator<uint8_t>> codes;  // 64-byte aligned, as the kernels load them
  std::vector<uint8_t> scales;
  std::vector<float> dense;  // [out][in], the dequantised values
  Mxfp4PackedView view() const { return {codes.data(), scales.data(), out, in}; }
};

// Random codes (every nibble) and scales around 2^0, packed.
Matrix RandomMatrix(size_t out, size_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> blocks(out * in / 2), file_scales(out * in / 32);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : file_scales) s = static_cast<uint8_t>(120 + rng() % 12);
  Matrix m{out, in, {}, std::vector<uint8_t>(Mxfp4PackedScaleBytes(out, in)), std::vector<float>(out * in)};
  m.codes.resize(Mxfp4PackedCodeBytes(out, in));
  PackMxfp4(blocks.data(), file_scales.data(), out, in, m.codes.data(), m.scales.data());
  for (size_t o = 0; o < out; ++o) DecodePackedRow(m.view(), o, 0, in / 32, m.dense.data() + o * in, 1);
  return m;
}

std::vector<float> RandomActivations(size_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(in);
  // Blocks of very different magnitudes: the scale is per block.
  for (size_t k = 0; k < in; ++k) x[k] = nd(rng) * std::ldexp(1.0f, static_cast<int>((k / 32) % 7) - 3);
  return x;
}

TEST(Mxfp4MatVecSplit, QuantiserRoundsWithinHalfAStep) {
  const std::vector<float> x = RandomActivations(256, 3);
  for (int parts : {1, 2}) {
    Mxfp4SplitActivations a;
    QuantizeMxfp4Split(x.data(), x.size(), parts, a);
    const int32_t qmax = Mxfp4SplitQmax(parts);
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0;
      for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[b * 32 + k]));
      int32_t sum = 0;
      for (size_t k = b * 32; k < b * 32 + 32; ++k) {
        const int32_t q = parts == 1 ? a.part(0)[k] : 256 * a.part(0)[k] + a.part(1)[k];
        ASSERT_LE(std::abs(q), qmax) << "parts " << parts << " k " << k;
        sum += q;
        // The kernels multiply by twice the E2M1 value: q * 2 * scale is x.
        EXPECT_LE(std::fabs(static_cast<float>(q) * 2.0f * a.scale[b] - x[k]), 0.5f * amax / qmax * 1.0001f)
            << "parts " << parts << " k " << k;
      }
      EXPECT_EQ(a.offset[b], 12 * sum);
    }
  }
}

TEST(Mxfp4MatVecSplit, EveryVariantMatchesTheReferenceAndTheExactProduct) {
  const std::vector<Mxfp4SplitVariant> variants = Mxfp4SplitVariants();
  ASSERT_FALSE(variants.empty());
  // 200 rows: 13 groups, the last partial (4 streamed side by side, then singles).
  for (const auto& [out, in] : {std::pair<size_t, size_t>{200, 512}, {16, 32}, {1000, 2048}}) {
    const Matrix m = RandomMatrix(out, in, static_cast<uint32_t>(out + in));
    const std::vector<float> x = RandomActivations(in, 11);
    for (int parts : {1, 2}) {
      Mxfp4SplitActivations a;
      QuantizeMxfp4Split(x.data(), in, parts, a);
      std::vector<float> ref(out, -1.0f);
      MatVecMxfp4SplitRef(m.view(), a, ref.data());
      // The documented bound: half a quantisation step per element, times
      // |w|, plus fp32 rounding of the per-block scale and sum.
      const double qmax = Mxfp4SplitQmax(parts);
      double worst = 0;
      for (size_t o = 0; o < out; ++o) {
        double exact = 0, bound = 0, mag = 0;
        for (size_t k = 0; k < in; ++k) {
          double amax = 0;
          for (size_t j = k / 32 * 32; j < k / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(double(x[j])));
          const double wk = m.dense[o * in + k];
          exact += wk * x[k];
          mag += std::fabs(wk * x[k]);
          bound += std::fabs(wk) * 0.5 * amax / qmax;
        }
        bound += 4.0 * static_cast<double>(in / 32) * 0x1p-24 * mag;
        const double err = std::fabs(ref[o] - exact);
        EXPECT_LE(err, bound) << "parts " << parts << " row " << o;
        worst = std::max(worst, err / bound);
      }
      // The bound is not loose beyond reason: the errors reach a fair part of it.
      EXPECT_GT(worst, 0.01) << "parts " << parts;
      for (const Mxfp4SplitVariant& v : variants) {
        std::vector<float> y(out, -2.0f);
        v.fn(m.view(), a, y.data(), 0, Mxfp4PackedGroups(out));
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), out * sizeof(float))) << v.name << " parts " << parts;
      }
      std::vector<float> y(out, -3.0f);
      MatVecMxfp4Split(m.view(), x.data(), parts, y.data());
      EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), out * sizeof(float))) << "threaded, parts " << parts;
    }
  }
}

TEST(Mxfp4MatVecSplit, NonFiniteActivationsGiveNaNAndZerosGiveZero) {
  const Matrix m = RandomMatrix(32, 64, 5);
  std::vector<float> x(64, 0.0f);
  for (const Mxfp4SplitVariant& v : Mxfp4SplitVariants()) {
    for (int parts : {1, 2}) {
      Mxfp4SplitActivations a;
      x[40] = 0.0f;
      QuantizeMxfp4Split(x.data(), 64, parts, a);
      std::vector<float> y(32, 1.0f);
      v.fn(m.view(), a, y.data(), 0, 2);
      for (float f : y) EXPECT_EQ(f, 0.0f) << v.name;
      x[40] = std::numeric_limits<float>::infinity();
      QuantizeMxfp4Split(x.data(), 64, parts, a);
      v.fn(m.view(), a, y.data(), 0, 2);
      for (float f : y) EXPECT_TRUE(std::isnan(f)) << v.name;
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels
