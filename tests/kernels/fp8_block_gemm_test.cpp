// Fp8BlockGemm (fp8_block.hpp), the prefill product that decodes each GEMM
// panel straight from the FP8 codes, against its reference Fp8BlockGemmRef
// (the weights decoded to fp32 first, then the avx512 set's fp32 GEMM):
// the same bits on ragged shapes (rows not a multiple of the 32-row strip,
// columns past one 2048-column panel chunk and not a multiple of 16, row
// counts that leave partial 8-row tiles), every code and block scales that
// are not powers of two (subnormal products included); and within fp32
// summation error of MatMulFp8BlockRef. AVX-512 only (the kernel's one row).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/fp8_block.hpp"

namespace moeserve::kernels {
namespace {

struct Shape {
  size_t rows, cols;
};

// Codes running through every finite E4M3 code (NaN codes moved to their
// neighbour), shuffled by a seed; scales drawn from values that are not
// powers of two, one block in seven with a scale so small that most of its
// products are subnormal.
void MakeMatrix(const Shape& s, uint32_t seed, std::vector<uint8_t>& codes, std::vector<float>& scales) {
  std::mt19937 rng(seed);
  codes.resize(s.rows * s.cols);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>((i * 37 + rng()) & 0xFF);
    if ((codes[i] & 0x7F) == 0x7F) codes[i] ^= 0x01;
  }
  scales.resize(Fp8BlockScaleCount(s.rows, s.cols));
  const float kScales[] = {0.0173f, 3.7f, 0.000913f, 1.3f, 0.05f, 27.1f};
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = i % 7 == 3 ? 1.1e-40f : kScales[(i + seed) % 6] * (1.0f + 0.01f * static_cast<float>(rng() % 50));
}

TEST(Fp8BlockGemm, SameBitsAsTheDecodedWeightsThroughTheFp32Gemm) {
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const Shape s : {Shape{333, 200}, Shape{100, 2200}, Shape{32, 4352}, Shape{576, 128}}) {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    MakeMatrix(s, static_cast<uint32_t>(s.rows + s.cols), codes, scales);
    const Fp8BlockView w = MakeFp8BlockView(codes, scales, s.rows, s.cols);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (const size_t n : {size_t{65}, size_t{71}, size_t{200}}) {
      SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.cols) + ", " + std::to_string(n) + " rows");
      std::vector<float> x(n * s.cols);
      for (float& v : x) v = u(rng);
      std::vector<float> got(n * s.rows, std::numeric_limits<float>::quiet_NaN());  // unwritten outputs fail
      std::vector<float> want(n * s.rows, std::numeric_limits<float>::quiet_NaN());
      Fp8BlockGemm(w, x.data(), n, got.data());
      Fp8BlockGemmRef(w, x.data(), n, want.data());
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++differ <= 5)
          ADD_FAILURE() << "output " << i << ": " << got[i] << " against " << want[i];
      EXPECT_EQ(differ, 0u);
      // And the product itself: within 2 cols u sum |w x| of the plain loops.
      std::vector<float> ref(n * s.rows), wf(s.rows * s.cols);
      MatMulFp8BlockRef(w, x.data(), n, ref.data());
      Fp8BlockToF32(w, 0, s.rows, wf.data());
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i)
        for (size_t r = 0; r < s.rows; ++r) {
          double abs_sum = 0;
          for (size_t k = 0; k < s.cols; ++k) abs_sum += std::fabs(static_cast<double>(wf[r * s.cols + k]) * x[i * s.cols + k]);
          const double bound = 2.0 * static_cast<double>(s.cols) * 0x1p-24 * abs_sum + 1e-30;
          if (!(std::fabs(static_cast<double>(got[i * s.rows + r]) - ref[i * s.rows + r]) <= bound) && ++bad <= 5)
            ADD_FAILURE() << "row " << i << " output " << r << ": " << got[i * s.rows + r] << " against "
                          << ref[i * s.rows + r] << " (bound " << bound << ")";
        }
      EXPECT_EQ(bad, 0u);
    }
  }
}

// At most kSmallBatchMaxRows rows it is its reference (the fp32 set's
// matrix-vector tiles), whatever the count.
TEST(Fp8BlockGemm, FewRowsAreTheReference) {
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const Shape s{130, 300};
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  MakeMatrix(s, 3, codes, scales);
  const Fp8BlockView w = MakeFp8BlockView(codes, scales, s.rows, s.cols);
  for (const size_t n : {size_t{1}, size_t{9}, size_t{64}}) {
    std::vector<float> x(n * s.cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
    std::vector<float> got(n * s.rows, std::numeric_limits<float>::quiet_NaN()), want(got.size());
    Fp8BlockGemm(w, x.data(), n, got.data());
    Fp8BlockGemmRef(w, x.data(), n, want.data());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << n << " rows";
  }
}

}  // namespace
}  // namespace moeserve::kernels
