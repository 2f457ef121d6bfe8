// The bf16act families (bf16_activations.hpp): products of exact weights
// (MXFP4 packed, BF16) with activations rounded to BF16, every variant this
// CPU supports (on AVX-512 with avx512_bf16, the vdpbf16ps GEMM), on shapes
// off the tile sizes (rows not a multiple of the 12-row tile, columns not of
// the 32-column panel, K odd for BF16 weights and past one 2048-long panel).
//
// Two bounds per product y = sum_k w_k x_k, with m = sum_k |w_k x_k|:
//  - against the reference variant (same rounded activations, another
//    summation order): |y - y_ref| <= 1e-5 m, fp32 summation noise;
//  - against the fp32 product of the unrounded activations: rounding x to
//    BF16 (8 significant bits, nearest: unit roundoff 2^-8) moves each term
//    by at most 2^-8 of it, so |y - y_fp32| <= 2^-8 m, plus fp32 summation
//    (1e-5 m).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

#include "bf16_bits.hpp"
#include "each_variant.hpp"
#include "random_inputs.hpp"

namespace moeserve::kernels {
namespace {

struct Shape {
  size_t n, out, in;
};

// m[t * out + o] = sum_k |W[o][k] X[t][k]| (W dense fp32, [out, in]).
std::vector<float> Magnitudes(const std::vector<float>& W, const std::vector<float>& X, const Shape& s) {
  std::vector<float> m(s.n * s.out);
  for (size_t t = 0; t < s.n; ++t)
    for (size_t o = 0; o < s.out; ++o) {
      double a = 0;
      for (size_t k = 0; k < s.in; ++k) a += std::fabs(static_cast<double>(W[o * s.in + k]) * X[t * s.in + k]);
      m[t * s.out + o] = static_cast<float>(a);
    }
  return m;
}

void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& mag,
                  double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = rel * mag[i] + 1e-30;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << " at " << i << ": got " << got[i] << " want " << want[i] << " tol " << tol;
      ++bad;
    }
  }
}

constexpr double kOrderBound = 1e-5;                  // summation order only
constexpr double kRoundingBound = 1.0 / 256 + 1e-5;  // 2^-8 per term, plus order

TEST(Bf16Activations, RoundsToNearestEven) {
  EXPECT_EQ(RoundToBf16(1.0f), 1.0f);
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-8f), 1.0f);                  // a tie: to the even 1.0
  EXPECT_EQ(RoundToBf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);    // a tie: to the even 1 + 2^-6
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // past the tie: up
  EXPECT_EQ(RoundToBf16(-3.0f), -3.0f);
  EXPECT_EQ(RoundToBf16(0x1p-130f), 0.0f);  // subnormal: zero, as vcvtne2ps2bf16
  EXPECT_TRUE(std::signbit(RoundToBf16(-0x1p-130f)));
  EXPECT_TRUE(std::isinf(RoundToBf16(std::numeric_limits<float>::max())));  // rounds past the largest BF16
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(RoundToBf16(std::numeric_limits<float>::infinity())));
}

TEST(Bf16Activations, Mxfp4MatchesTheReferenceOnOddShapes) {
  // n: below, at and off the 12-row tile, 8 (the GEMM threshold); out: off
  // the 32-column panel and the 16-row group; in = 2080: two K panels.
  const std::vector<Shape> shapes = {{8, 45, 96},  {13, 70, 160}, {37, 33, 64},
                                     {100, 97, 288}, {25, 64, 2080}, {3, 40, 64}};
  std::mt19937 rng(11);
  for (const Shape& s : shapes) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " out " + std::to_string(s.out) + " in " + std::to_string(s.in));
    std::vector<float> wf = Random(s.out * s.in, rng);
    std::vector<uint8_t> blocks(s.out * s.in / 2), scales(s.out * s.in / 32);
    ASSERT_EQ(Mxfp4EncodeMatrix(wf.data(), s.out, s.in, blocks.data(), scales.data()), -1);
    std::vector<float> dq(s.out * s.in);
    Mxfp4DecodeMatrix(blocks.data(), scales.data(), s.out, s.in, dq.data());
    Mxfp4PackedStack packed(blocks.data(), scales.data(), 1, s.out, s.in);
    const std::vector<float> X = Random(s.n * s.in, rng);
    const std::vector<float> mag = Magnitudes(dq, X, s);
    std::vector<float> fp32(s.n * s.out), ref(s.n * s.out);
    MatMulF32Ref(dq.data(), s.out, s.in, X.data(), s.n, fp32.data());
    MatMulMxfp4Bf16ActRef(packed.matrix(0), X.data(), s.n, ref.data());
    ExpectWithin(ref, fp32, mag, kRoundingBound, "reference against fp32");
    ForEachVariant("matmul_mxfp4_bf16act", [&](const KernelSet& k) {
      std::vector<float> y(s.n * s.out, std::nanf(""));
      k.matmul_mxfp4_bf16act(packed.matrix(0), X.data(), s.n, y.data());
      // The integer matrix-vector form (n < 8) quantises the rounded
      // activations again: within its 2^-21 bound, far inside this one.
      ExpectWithin(y, ref, mag, kOrderBound, std::string(k.matmul_mxfp4_bf16act.name) + " against the reference");
      ExpectWithin(y, fp32, mag, kRoundingBound, std::string(k.matmul_mxfp4_bf16act.name) + " against fp32");
    });
  }
}

TEST(Bf16Activations, Bf16WeightsMatchTheReferenceOnOddShapes) {
  // in odd: the last pair's second element is padding on both sides.
  const std::vector<Shape> shapes = {{8, 45, 101}, {13, 70, 33},  {37, 33, 64},
                                     {100, 97, 257}, {25, 50, 2051}, {3, 40, 7}};
  std::mt19937 rng(12);
  for (const Shape& s : shapes) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " out " + std::to_string(s.out) + " in " + std::to_string(s.in));
    const std::vector<float> wf = Random(s.out * s.in, rng);
    std::vector<uint16_t> W(wf.size());
    std::vector<float> wexact(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
      W[i] = ToBf16Bits(wf[i]);
      wexact[i] = FromBf16Bits(W[i]);
    }
    const std::vector<float> X = Random(s.n * s.in, rng);
    const std::vector<float> mag = Magnitudes(wexact, X, s);
    std::vector<float> fp32(s.n * s.out), ref(s.n * s.out);
    MatMulBf16Ref(W.data(), s.out, s.in, X.data(), s.n, fp32.data());
    MatMulBf16Bf16ActRef(W.data(), s.out, s.in, X.data(), s.n, ref.data());
    ExpectWithin(ref, fp32, mag, kRoundingBound, "reference against fp32");
    ForEachVariant("matmul_bf16_bf16act", [&](const KernelSet& k) {
      std::vector<float> y(s.n * s.out, std::nanf(""));
      k.matmul_bf16_bf16act(W.data(), s.out, s.in, X.data(), s.n, y.data());
      ExpectWithin(y, ref, mag, kOrderBound, std::string(k.matmul_bf16_bf16act.name) + " against the reference");
      ExpectWithin(y, fp32, mag, kRoundingBound, std::string(k.matmul_bf16_bf16act.name) + " against fp32");
    });
  }
}

TEST(Bf16Activations, RoundingIsWhatTheProductsSee) {
  // Activations exactly representable in BF16 give the fp32 product (up to
  // order); one that is not shows the rounding: so the reference is not the
  // fp32 product in disguise.
  const Shape s{9, 16, 32};
  std::vector<float> dq(s.out * s.in, 0.0f);
  std::vector<uint8_t> blocks(s.out * s.in / 2), scales(s.out * s.in / 32);
  for (size_t o = 0; o < s.out; ++o) dq[o * s.in] = 1.0f;  // W[o][0] = 1
  ASSERT_EQ(Mxfp4EncodeMatrix(dq.data(), s.out, s.in, blocks.data(), scales.data()), -1);
  Mxfp4PackedStack packed(blocks.data(), scales.data(), 1, s.out, s.in);
  std::vector<float> X(s.n * s.in, 0.0f);
  for (size_t t = 0; t < s.n; ++t) X[t * s.in] = 1.0f + 0x1p-10f * static_cast<float>(t + 1);
  ForEachVariant("matmul_mxfp4_bf16act (rounding)", [&](const KernelSet& k) {
    std::vector<float> y(s.n * s.out);
    k.matmul_mxfp4_bf16act(packed.matrix(0), X.data(), s.n, y.data());
    for (size_t t = 0; t < s.n; ++t) EXPECT_EQ(y[t * s.out], RoundToBf16(X[t * s.in])) << "row " << t;
  });
}

}  // namespace
}  // namespace moeserve::kernels
