// FP8 block-scaled products (fp8_block.hpp): the E4M3 decode of every code
// against the format's definition, the checked view, the reference against
// a float64 sum with scales that are not powers of two on ragged shapes, and
// the weights a loader converts to (Fp8BlockToF32) and the NaN scan,
// every variant this CPU runs (the family matmul_fp8_block) against the
// reference at 1, 2, 7, 64 and 130 activation rows, and a row's result the
// same bits alone as in a batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "each_variant.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/fp8_block.hpp"

namespace moeserve::kernels {
namespace {

// The definition (OCP FP8 E4M3, "fn"), written independently of the kernel
// code: (-1)^s * 2^(e-7) * (1 + m/8) for e > 0, (-1)^s * 2^-6 * m/8 for
// e = 0, NaN for S.1111.111 (no infinities).
double E4m3Definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return s ? -mag : mag;
}

bool IsNanCode(int code) { return (code & 0x7F) == 0x7F; }

TEST(Fp8E4m3, EveryCodeDecodesToItsDefinition) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    SCOPED_TRACE("code " + std::to_string(c));
    const float got = Fp8E4m3ToFloat(static_cast<uint8_t>(c));
    const double want = E4m3Definition(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      ++nans;
      continue;
    }
    EXPECT_FALSE(std::isnan(got));
    EXPECT_EQ(static_cast<double>(got), want);
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0);  // -0 included
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF only
  // Landmarks of the format.
  EXPECT_EQ(Fp8E4m3ToFloat(0x00), 0.0f);
  EXPECT_FALSE(std::signbit(Fp8E4m3ToFloat(0x00)));
  EXPECT_TRUE(std::signbit(Fp8E4m3ToFloat(0x80)));
  EXPECT_EQ(Fp8E4m3ToFloat(0x80), 0.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4m3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7E), 448.0f);  // largest finite
  EXPECT_EQ(Fp8E4m3ToFloat(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0xFF)));
}

// Every variant's own decode (its vector path and its tails): row c of W
// holds only code c, X = (1, 0, 0, ...), so y[c] = E4M3(c) * scale exactly
// (the other products are zeros; NaN codes give NaN).
TEST(Fp8E4m3, EveryVariantDecodesEveryCodeTimesItsScale) {
  // 141: a full block, then 13 columns (the tails); 192: a full block, then
  // one full 64-column group (the AVX-512 kernel's table decode) and the 1
  // at column 77, inside the first block's second group.
  for (size_t cols : {size_t{48}, size_t{141}, size_t{192}}) {
    // Also a scale whose product with 2^8 overflows (1e38) and a subnormal one.
    for (float scale : {1.0f, 0.0173f, 3.7f, 1e38f, 1e-40f}) {
      const size_t rows = 256;
      std::vector<uint8_t> codes(rows * cols);
      for (size_t r = 0; r < rows; ++r)
        for (size_t k = 0; k < cols; ++k) codes[r * cols + k] = static_cast<uint8_t>(r);
      std::vector<float> scales(Fp8BlockScaleCount(rows, cols), scale);
      const Fp8BlockView w = MakeFp8BlockView(codes, scales, rows, cols);
      std::vector<float> x(cols, 0.0f);
      x[cols == 48 ? 0 : cols == 141 ? 130 : 77] = 1.0f;  // 130: inside the second block's tail
      ForEachVariant("matmul_fp8_block decode", [&](const KernelSet& k) {
        SCOPED_TRACE(std::string(k.matmul_fp8_block.name) + " cols " + std::to_string(cols) + " scale " +
                     std::to_string(scale));
        std::vector<float> y(rows, -1234.5f);
        k.matmul_fp8_block(w, x.data(), 1, y.data());
        for (int c = 0; c < 256; ++c) {
          const float want = Fp8E4m3ToFloat(static_cast<uint8_t>(c)) * scale;
          if (IsNanCode(c) || std::isinf(want)) {
            // A NaN weight, or an infinite one times the zeros of X's other columns.
            EXPECT_TRUE(std::isnan(y[c])) << "code " << c;
          } else {
            EXPECT_EQ(y[c], want) << "code " << c;
          }
        }
      });
    }
  }
}

// rows x cols codes running through every finite E4M3 code (NaN codes moved
// to their neighbour), shifted row by row.
std::vector<uint8_t> EveryFiniteCode(size_t rows, size_t cols) {
  std::vector<uint8_t> codes(rows * cols);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>((i * 37 + i / cols) & 0xFF);
    if (IsNanCode(codes[i])) codes[i] ^= 0x01;
  }
  return codes;
}

// The weights a loader converts to (Fp8BlockToF32): every finite code times
// a block scale that is not a power of two, on a ragged shape (rows and
// columns crossing block edges, each block its own scale), against the
// definition's value rounded to fp32 once; a row range lands at out's start.
TEST(Fp8BlockToF32, EveryFiniteCodeTimesItsBlocksScaleRoundedOnce) {
  const size_t rows = 130, cols = 300;  // 2 x 3 blocks, the last ones ragged
  const std::vector<uint8_t> codes = EveryFiniteCode(rows, cols);
  const std::vector<float> scales = {0.0173f, 3.7f, 1.0f / 3.0f, 1e-40f, 5.3e36f, 0.3f};
  const Fp8BlockView w = MakeFp8BlockView(codes, scales, rows, cols);
  std::vector<float> all(rows * cols, -1.0f);
  Fp8BlockToF32(w, 0, rows, all.data());
  size_t checked = 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t k = 0; k < cols; ++k) {
      const float want = static_cast<float>(E4m3Definition(codes[r * cols + k])) * w.scale(r, k);
      ASSERT_EQ(std::bit_cast<uint32_t>(all[r * cols + k]), std::bit_cast<uint32_t>(want))
          << "row " << r << " col " << k << " code " << int(codes[r * cols + k]);
      ++checked;
    }
  EXPECT_EQ(checked, rows * cols);
  std::vector<float> part(2 * cols);
  Fp8BlockToF32(w, 127, 129, part.data());  // across the row-block edge
  for (size_t k = 0; k < 2 * cols; ++k) EXPECT_EQ(part[k], all[127 * cols + k]) << k;
}

// The BF16 a loader converts routed experts to (Fp8BlockToBf16): the
// reference is the definition's value times the block scale rounded to fp32
// once, then to BF16 to nearest even (written here independently); the
// AVX-512 and the portable code must give the same bits on every element of
// a ragged shape whose blocks mix scales that are not powers of two, a
// subnormal one, and ones that overflow to infinity or need the wide-scale
// path (2^8 * scale overflows), plus rows split at any point.
uint16_t Bf16Definition(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t lsb = (u >> 16) & 1u;
  const uint64_t rounded = static_cast<uint64_t>(u) + 0x7FFFu + lsb;
  return static_cast<uint16_t>(rounded >> 16);
}

TEST(Fp8BlockToBf16, EveryCodeTimesItsBlocksScaleRoundedToNearestEven) {
  const size_t rows = 260, cols = 300;  // 3 x 3 blocks, the last ones ragged
  const std::vector<uint8_t> codes = EveryFiniteCode(rows, cols);
  const std::vector<float> scales = {0.0173f, 3.7f, 1.0f / 3.0f, 1e-40f, 5.3e36f, 0.3f, 1e38f, 2.0f, 0.000913f};
  const Fp8BlockView w = MakeFp8BlockView(codes, scales, rows, cols);
  std::vector<uint16_t> want(rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t k = 0; k < cols; ++k)
      want[r * cols + k] = Bf16Definition(static_cast<float>(E4m3Definition(codes[r * cols + k])) * w.scale(r, k));
  std::vector<uint16_t> ref(rows * cols, 0xDEAD);
  Fp8BlockToBf16Ref(w, 0, rows, ref.data());
  ASSERT_EQ(ref, want);
  size_t infinities = 0;
  for (uint16_t b : want) infinities += (b & 0x7FFF) == 0x7F80;
  EXPECT_GT(infinities, 0u);  // the 1e38 block overflows: the rounding keeps infinities
  for (bool avx512 : {false, true}) {
    SCOPED_TRACE(avx512 ? "AVX-512 where this CPU has it" : "portable");
    std::vector<uint16_t> got(rows * cols, 0xDEAD);
    Fp8BlockToBf16(w, 0, rows, got.data(), avx512);
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && ++differ <= 5)
        ADD_FAILURE() << "row " << i / cols << " col " << i % cols << " code " << int(codes[i]) << ": " << got[i]
                      << " want " << want[i];
    EXPECT_EQ(differ, 0u);
    std::vector<uint16_t> part(3 * cols, 0xDEAD);
    Fp8BlockToBf16(w, 127, 130, part.data(), avx512);  // across the row-block edge
    EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + 127 * cols));
  }
  std::printf("[ variants ] Fp8BlockToBf16 ran: portable%s\n", IsaSupported(Isa::kAvx512) ? " avx512" : "");
}

TEST(Fp8FindNan, FindsTheFirstNanCodeOfEitherSign) {
  std::vector<uint8_t> codes(10000, 0x7E);  // 448: the largest finite, one below NaN
  EXPECT_EQ(Fp8FindNan(codes.data(), codes.size()), -1);
  codes[9000] = 0x7F;
  EXPECT_EQ(Fp8FindNan(codes.data(), codes.size()), 9000);
  codes[4097] = 0xFF;
  EXPECT_EQ(Fp8FindNan(codes.data(), codes.size()), 4097);
  EXPECT_EQ(Fp8FindNan(codes.data(), 4097), -1);
}

TEST(Fp8BlockView, ChecksTheSizesOfWhatItViews) {
  std::vector<uint8_t> codes(130 * 300);
  std::vector<float> scales(2 * 3);
  EXPECT_EQ(Fp8BlockScaleCount(130, 300), 6u);
  EXPECT_EQ(Fp8BlockScaleCount(128, 128), 1u);
  const Fp8BlockView w = MakeFp8BlockView(codes, scales, 130, 300);
  EXPECT_EQ(w.scale_rows(), 2u);
  EXPECT_EQ(w.scale_cols(), 3u);
  EXPECT_THROW(MakeFp8BlockView(codes, std::span<const float>(scales).first(5), 130, 300), std::invalid_argument);
  EXPECT_THROW(MakeFp8BlockView(std::span<const uint8_t>(codes).first(100), scales, 130, 300), std::invalid_argument);
  EXPECT_THROW(MakeFp8BlockView(codes, scales, 0, 300), std::invalid_argument);
  try {
    MakeFp8BlockView(codes, std::span<const float>(scales).first(5), 130, 300);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected 6"), std::string::npos) << e.what();
  }
}

// A random matrix: finite codes (NaN codes replaced), one scale per block
// drawn from values that are not powers of two, activations in [-1, 1].
struct Case {
  size_t rows, cols;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8BlockView view() const { return MakeFp8BlockView(codes, scales, rows, cols); }
};

Case RandomCase(size_t rows, size_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c{rows, cols, std::vector<uint8_t>(rows * cols), std::vector<float>(Fp8BlockScaleCount(rows, cols))};
  for (uint8_t& b : c.codes) {
    b = static_cast<uint8_t>(rng() & 0xFF);
    if (IsNanCode(b)) b ^= 0x01;
  }
  const float kScales[] = {0.0173f, 3.7f, 0.000913f, 1.3f, 0.05f, 27.1f};
  for (size_t i = 0; i < c.scales.size(); ++i) c.scales[i] = kScales[(i + seed) % 6] * (1.0f + 0.01f * (rng() % 50));
  return c;
}

std::vector<float> RandomX(size_t n, size_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n * cols);
  for (float& v : x) v = u(rng);
  return x;
}

// sum_k |w_k x_k| for output (i, r), w_k the fp32-rounded dequantised weight:
// the scale of the rounding error of any fp32 summation order.
double AbsSum(const Case& c, const float* x, size_t r) {
  const Fp8BlockView w = c.view();
  double s = 0;
  for (size_t k = 0; k < c.cols; ++k)
    s += std::fabs(static_cast<double>(Fp8E4m3ToFloat(c.codes[r * c.cols + k]) * w.scale(r, k)) * x[k]);
  return s;
}

constexpr double kU = 0x1p-24;  // fp32's unit roundoff

// The reference against the exact weights (E4M3 value times scale, exact in
// float64) summed in float64: the reference rounds each weight once (at most
// u |w| each) and sums in fp32 (at most (cols - 1) u sum|w x|), so it is
// within (cols + 1) u sum_k |w_k x_k| (plus a hair for the float64 side).
TEST(Fp8BlockRef, MatchesAFloat64SumWithNonPowerOfTwoScales) {
  struct Shape {
    size_t rows, cols;
  };
  for (const Shape s : {Shape{1, 1}, Shape{128, 128}, Shape{130, 300}, Shape{257, 129}, Shape{3, 1000}}) {
    SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.cols));
    const Case c = RandomCase(s.rows, s.cols, static_cast<uint32_t>(s.rows * 7 + s.cols));
    const size_t n = 3;
    const std::vector<float> x = RandomX(n, s.cols, 99);
    std::vector<float> y(n * s.rows, std::numeric_limits<float>::quiet_NaN());
    MatMulFp8BlockRef(c.view(), x.data(), n, y.data());
    size_t checked = 0;
    for (size_t i = 0; i < n; ++i)
      for (size_t r = 0; r < s.rows; ++r) {
        double exact = 0;
        for (size_t k = 0; k < s.cols; ++k) {
          const double scale = c.scales[(r / 128) * ((s.cols + 127) / 128) + k / 128];
          exact += E4m3Definition(c.codes[r * s.cols + k]) * scale * x[i * s.cols + k];
        }
        const double bound = (static_cast<double>(s.cols) + 1.0) * kU * AbsSum(c, &x[i * s.cols], r) * 1.0001 + 1e-30;
        EXPECT_NEAR(y[i * s.rows + r], exact, bound) << "row " << i << " output " << r;
        ++checked;
      }
    EXPECT_EQ(checked, n * s.rows);
  }
}

// Every variant against the reference: the same weights rounded the same way,
// summed in another order, so within 2 (cols - 1) u sum_k |w_k x_k| (each
// order within (cols - 1) u sum of the exact sum; the bound uses 2 cols).
TEST(Fp8BlockVariants, MatchTheReferenceAtEveryRowCount) {
  struct Shape {
    size_t rows, cols;
  };
  for (const Shape s : {Shape{300, 1003}, Shape{129, 256}}) {
    const Case c = RandomCase(s.rows, s.cols, static_cast<uint32_t>(s.rows + s.cols));
    for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{130}}) {
      const std::vector<float> x = RandomX(n, s.cols, static_cast<uint32_t>(n));
      std::vector<float> want(n * s.rows);
      MatMulFp8BlockRef(c.view(), x.data(), n, want.data());
      std::vector<double> bound(n * s.rows);
      for (size_t i = 0; i < n; ++i)
        for (size_t r = 0; r < s.rows; ++r)
          bound[i * s.rows + r] = 2.0 * static_cast<double>(s.cols) * kU * AbsSum(c, &x[i * s.cols], r) + 1e-30;
      ForEachVariant("matmul_fp8_block", [&](const KernelSet& k) {
        SCOPED_TRACE(std::string(k.matmul_fp8_block.name) + " " + std::to_string(s.rows) + " x " +
                     std::to_string(s.cols) + ", " + std::to_string(n) + " rows");
        std::vector<float> y(n * s.rows, std::numeric_limits<float>::quiet_NaN());  // unwritten outputs fail
        k.matmul_fp8_block(c.view(), x.data(), n, y.data());
        size_t bad = 0;
        for (size_t i = 0; i < y.size(); ++i)
          if (!(std::fabs(static_cast<double>(y[i]) - want[i]) <= bound[i]) && ++bad <= 5)
            ADD_FAILURE() << "output " << i << ": " << y[i] << " vs reference " << want[i] << " (bound "
                          << bound[i] << ")";
        EXPECT_EQ(bad, 0u);
      });
    }
  }
}

// A row's sums do not depend on the rows beside it (every tile shape sums
// a row in the same order), so a sequence gets the same bits in a batched
// decode step as alone: rows of a 130-row call against each row alone.
TEST(Fp8BlockVariants, ARowGetsTheSameBitsAloneAsInABatch) {
  const Case c = RandomCase(300, 1003, 5);
  const size_t n = 130;
  const std::vector<float> x = RandomX(n, c.cols, 17);
  ForEachVariant("matmul_fp8_block batch invariance", [&](const KernelSet& k) {
    SCOPED_TRACE(k.matmul_fp8_block.name);
    std::vector<float> batch(n * c.rows);
    k.matmul_fp8_block(c.view(), x.data(), n, batch.data());
    for (size_t i : {size_t{0}, size_t{7}, size_t{77}, size_t{129}}) {
      std::vector<float> alone(c.rows, std::numeric_limits<float>::quiet_NaN());
      k.matmul_fp8_block(c.view(), &x[i * c.cols], 1, alone.data());
      size_t differ = 0;
      for (size_t r = 0; r < c.rows; ++r)
        if (std::memcmp(&alone[r], &batch[i * c.rows + r], sizeof(float)) != 0) ++differ;
      EXPECT_EQ(differ, 0u) << "row " << i;
    }
  });
}

// The AVX-512 rows fold a row block's scales into the activations when
// they all lie in [2^-64, 2^64] (fma(v, x s) instead of fma(v s, x)) and
// multiply the weights otherwise. With power-of-two scales both forms are
// exact, so they must give the same bits: matrix `folded` has power-of-two
// scales everywhere; `unfolded` the same codes and scales, except that in
// each row block one column block holds zero codes under a scale of 2^80
// (outside the fold's range, so those rows take the other form, while the
// block adds nothing either way). Every variant must give both matrices the
// same bits at 1 and 5 activation rows; shapes with ragged blocks included.
TEST(Fp8BlockVariants, PowerOfTwoScalesGiveTheSameBitsInEitherForm) {
  struct Shape {
    size_t rows, cols;
  };
  for (const Shape s : {Shape{300, 1003}, Shape{256, 512}}) {
    Case folded = RandomCase(s.rows, s.cols, static_cast<uint32_t>(s.rows ^ s.cols));
    const size_t scale_cols = (s.cols + 127) / 128;
    for (size_t i = 0; i < folded.scales.size(); ++i) folded.scales[i] = std::ldexp(1.0f, -static_cast<int>(i % 19) - 3);
    for (size_t r = 0; r < s.rows; ++r)
      for (size_t k = 0; k < 128; ++k) folded.codes[r * s.cols + k] = 0;  // column block 0 zero
    Case unfolded = folded;
    for (size_t rb = 0; rb < folded.scales.size() / scale_cols; ++rb) unfolded.scales[rb * scale_cols] = 0x1p80f;
    for (size_t n : {size_t{1}, size_t{5}}) {
      const std::vector<float> x = RandomX(n, s.cols, static_cast<uint32_t>(n + 3));
      ForEachVariant("matmul_fp8_block folded or not", [&](const KernelSet& k) {
        SCOPED_TRACE(std::string(k.matmul_fp8_block.name) + " " + std::to_string(s.rows) + " x " +
                     std::to_string(s.cols) + ", " + std::to_string(n) + " rows");
        std::vector<float> a(n * s.rows, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> b(n * s.rows, std::numeric_limits<float>::quiet_NaN());
        k.matmul_fp8_block(folded.view(), x.data(), n, a.data());
        k.matmul_fp8_block(unfolded.view(), x.data(), n, b.data());
        size_t differ = 0, nonzero = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && ++differ <= 5)
            ADD_FAILURE() << "output " << i << ": " << a[i] << " folded, " << b[i] << " not";
          nonzero += a[i] != 0.0f;
        }
        EXPECT_EQ(differ, 0u);
        EXPECT_GT(nonzero, a.size() / 2);  // the products are not all zero
      });
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels
