// The MXFP4 matrix-vector products with activations of 21 (three int8
// parts, the default), 16 (two) or 8 bits (one) per element
// (mxfp4_packed.hpp, KernelsWithDecodeActivationBits): the quantiser's
// rounding bound and its variants' identical bytes, every building block this
// CPU runs bit-identical to the scalar one (the integer sums are exact, the
// scales applied in one order), each within its documented bound of the exact
// product over the same dequantised weights, and the threaded set entries
// equal to the building blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
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

std::vector<float> RandomActivations(size_t n, size_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * in);
  // Blocks of very different magnitudes: the scale is per block.
  for (size_t k = 0; k < x.size(); ++k) x[k] = nd(rng) * std::ldexp(1.0f, static_cast<int>((k / 32) % 7) - 3);
  return x;
}

const KernelSet& Scalar() { return Kernels(Isa::kScalar); }

std::vector<Isa> FastIsas() {
  std::vector<Isa> v;
  for (Isa isa : SupportedIsas())
    if (isa != Isa::kReference) v.push_back(isa);
  return v;
}

TEST(Mxfp4ActivationBits, QuantiserRoundsWithinHalfAStepAndEveryVariantWritesTheSameBytes) {
  const size_t n = 3, in = 256, nb = in / 32;
  const std::vector<float> x = RandomActivations(n, in, 3);
  for (int parts : {1, 2, 3}) {
    Mxfp4ActivationBuffer buffer;
    const Mxfp4Activations& a = buffer.Quantize(x.data(), n, in, Scalar().mxfp4_quantize.fn, parts);
    ASSERT_EQ(a.nparts, parts);
    const int32_t qmax = Mxfp4ActQmax(parts);
    for (size_t t = 0; t < n; ++t)
      for (size_t b = 0; b < nb; ++b) {
        float amax = 0;
        for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[t * in + b * 32 + k]));
        int32_t sum = 0;
        for (size_t k = b * 32; k < b * 32 + 32; ++k) {
          int32_t q = 0;
          for (int p = 0; p < parts; ++p) q += a.part(t, p)[k] * (1 << Mxfp4ActShift(parts, p));
          ASSERT_LE(std::abs(q), qmax) << "parts " << parts << " k " << k;
          sum += q;
          // The kernels multiply by twice the E2M1 value: q * 2 * scale is x,
          // within half a step plus the fp32 rounding of x * (qmax / amax)
          // (two roundings of 2^-24, relative).
          EXPECT_LE(std::fabs(double(q) * 2.0 * a.scale[t * nb + b] - x[t * in + k]),
                    0.5 * amax / qmax + 0x1p-22 * amax)
              << "parts " << parts << " k " << k;
        }
        EXPECT_EQ(a.offset[t * nb + b], 12 * sum);
      }
    for (Isa isa : FastIsas()) {
      const KernelSet& k = Kernels(isa);
      Mxfp4ActivationBuffer other;
      const Mxfp4Activations& o = other.Quantize(x.data(), n, in, k.mxfp4_quantize.fn, parts);
      EXPECT_EQ(0, std::memcmp(o.parts, a.parts, n * static_cast<size_t>(parts) * in)) << k.mxfp4_quantize.name;
      EXPECT_EQ(0, std::memcmp(o.scale, a.scale, n * nb * sizeof(float))) << k.mxfp4_quantize.name;
      EXPECT_EQ(0, std::memcmp(o.offset, a.offset, n * nb * sizeof(int32_t))) << k.mxfp4_quantize.name;
    }
  }
}

TEST(Mxfp4ActivationBits, EveryVariantMatchesTheScalarBlockAndTheExactProduct) {
  // 200 rows: 13 groups, the last partial (4 streamed side by side, then singles).
  for (const auto& [out, in] : {std::pair<size_t, size_t>{200, 512}, {16, 32}, {1000, 2048}}) {
    const Matrix m = RandomMatrix(out, in, static_cast<uint32_t>(out + in));
    const size_t n = 3;  // rows of activations (a small decode batch)
    const std::vector<float> x = RandomActivations(n, in, 11);
    for (int parts : {1, 2, 3}) {
      const std::string what = "parts " + std::to_string(parts) + " out " + std::to_string(out);
      Mxfp4ActivationBuffer buffer;
      const Mxfp4Activations& a = buffer.Quantize(x.data(), n, in, Scalar().mxfp4_quantize.fn, parts);
      std::vector<float> ref(n * out, -1.0f);
      Scalar().mxfp4_matvec(m.view(), a, ref.data(), 0, Mxfp4PackedGroups(out), 0, in / 32);
      // The documented bound: half a quantisation step per element, times
      // |w|, plus fp32 rounding of the per-block scale and sum.
      const double qmax = Mxfp4ActQmax(parts);
      double worst = 0;
      for (size_t t = 0; t < n; ++t)
        for (size_t o = 0; o < out; ++o) {
          double exact = 0, bound = 0, mag = 0;
          for (size_t k = 0; k < in; ++k) {
            double amax = 0;
            for (size_t j = k / 32 * 32; j < k / 32 * 32 + 32; ++j)
              amax = std::max(amax, std::fabs(double(x[t * in + j])));
            const double wk = m.dense[o * in + k];
            exact += wk * x[t * in + k];
            mag += std::fabs(wk * x[t * in + k]);
            bound += std::fabs(wk) * 0.5 * amax / qmax;
          }
          bound += 4.0 * static_cast<double>(in / 32) * 0x1p-24 * mag;
          const double err = std::fabs(ref[t * out + o] - exact);
          EXPECT_LE(err, bound) << what << " row " << o;
          worst = std::max(worst, err / bound);
        }
      // The bound is not loose beyond reason: the errors reach a fair part of it.
      if (parts < 3) {
        EXPECT_GT(worst, 0.01) << what;
      }
      const int bits = Mxfp4ActBits(parts);
      for (Isa isa : FastIsas()) {
        const KernelSet& k = Kernels(isa);
        std::vector<float> y(n * out, -2.0f);
        k.mxfp4_matvec(m.view(), a, y.data(), 0, Mxfp4PackedGroups(out), 0, in / 32);
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float))) << k.mxfp4_matvec.name << " " << what;
        // The threaded set entries: the same bits as the building block.
        const KernelSet& d = KernelsWithDecodeActivationBits(isa, bits);
        std::fill(y.begin(), y.end(), -3.0f);
        d.matmul_mxfp4(m.view(), x.data(), n, y.data());
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float))) << d.matmul_mxfp4.name << " " << what;
        std::fill(y.begin(), y.end(), -4.0f);
        const Mxfp4MatVecJob job{m.view(), x.data(), n, y.data()};
        d.matvec_mxfp4_many(std::span(&job, 1));
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
            << d.matvec_mxfp4_many.name << " " << what;
      }
    }
  }
}

TEST(Mxfp4ActivationBits, NonFiniteActivationsGiveNaNAndZerosGiveZero) {
  const Matrix m = RandomMatrix(32, 64, 5);
  std::vector<float> x(64, 0.0f);
  for (Isa isa : FastIsas()) {
    const KernelSet& k = Kernels(isa);
    for (int parts : {1, 2, 3}) {
      Mxfp4ActivationBuffer buffer;
      x[40] = 0.0f;
      const Mxfp4Activations& a = buffer.Quantize(x.data(), 1, 64, k.mxfp4_quantize.fn, parts);
      std::vector<float> y(32, 1.0f);
      k.mxfp4_matvec(m.view(), a, y.data(), 0, 2, 0, 2);
      for (float f : y) EXPECT_EQ(f, 0.0f) << k.mxfp4_matvec.name << " parts " << parts;
      x[40] = std::numeric_limits<float>::infinity();
      const Mxfp4Activations& b = buffer.Quantize(x.data(), 1, 64, k.mxfp4_quantize.fn, parts);
      k.mxfp4_matvec(m.view(), b, y.data(), 0, 2, 0, 2);
      for (float f : y) EXPECT_TRUE(std::isnan(f)) << k.mxfp4_matvec.name << " parts " << parts;
    }
  }
}

TEST(Mxfp4ActivationBits, SetsAreNamedByTheirBitsAndOtherValuesGiveThePlainSet) {
  for (Isa isa : FastIsas()) {
    const std::string sfx = IsaName(isa);
    EXPECT_EQ(std::string(KernelsWithDecodeActivationBits(isa, 8).matmul_mxfp4.name), "matmul_mxfp4_" + sfx + "+act8");
    EXPECT_EQ(std::string(KernelsWithDecodeActivationBits(isa, 16).matvec_mxfp4_many.name),
              "matvec_mxfp4_many_" + sfx + "+act16");
    EXPECT_EQ(&KernelsWithDecodeActivationBits(isa, 21), &Kernels(isa));
    EXPECT_EQ(&KernelsWithDecodeActivationBits(isa, 12), &Kernels(isa));
  }
}

}  // namespace
}  // namespace moeserve::kernels
