// MXFP4 reference encode/decode against model.md section 7, plus an
// independent brute-force oracle on random values across the float range.
#include "moeserve/kernels/mxfp4.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace moeserve::kernels {
namespace {

using Block = std::array<float, kMxfp4BlockElems>;

struct Encoded {
  std::array<uint8_t, kMxfp4BlockBytes> packed{};
  uint8_t scale = 0;
};

Encoded Encode(const Block& in) {
  Encoded e;
  EXPECT_TRUE(Mxfp4EncodeBlock(in.data(), e.packed.data(), &e.scale));
  return e;
}

uint8_t CodeAt(const Encoded& e, int i) { return (e.packed[i / 2] >> (4 * (i % 2))) & 0x0F; }

// Packs 32 codes with element 2j in the low nibble of byte j.
std::array<uint8_t, kMxfp4BlockBytes> Pack(const std::array<uint8_t, kMxfp4BlockElems>& codes) {
  std::array<uint8_t, kMxfp4BlockBytes> p{};
  for (int j = 0; j < kMxfp4BlockBytes; ++j) p[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  return p;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// ---- independent oracle ------------------------------------------------------
// Written from the spec's words rather than the implementation's method:
// floor(log2) by walking powers of two, and rounding by minimising the
// distance over all eight magnitudes, ties to the code with mantissa bit 0.
// Distances are taken in long double; near a tie a's bits and the E2M1
// values overlap, so the subtraction is exact where it matters.
struct OracleResult {
  std::array<uint8_t, kMxfp4BlockElems> codes{};
  uint8_t scale = 0;
};

OracleResult Oracle(const Block& in) {
  static constexpr long double kMag[8] = {0.0L, 0.5L, 1.0L, 1.5L, 2.0L, 3.0L, 4.0L, 6.0L};
  long double amax = 0;
  for (float v : in) EXPECT_TRUE(std::isfinite(v)) << "the oracle takes finite blocks only";
  for (float v : in) amax = std::max(amax, std::fabs(static_cast<long double>(v)));
  int x = -127;
  if (amax > 0 && std::isfinite(amax)) {
    int k = 0;
    while (std::ldexp(1.0L, k) > amax) --k;
    while (std::ldexp(1.0L, k + 1) <= amax) ++k;
    x = std::clamp(k - 2, -127, 127);
  }
  OracleResult r;
  r.scale = static_cast<uint8_t>(x + 127);
  for (int i = 0; i < kMxfp4BlockElems; ++i) {
    const long double a = std::fabs(static_cast<long double>(in[i])) / std::ldexp(1.0L, x);
    int best = 0;
    long double best_d = std::numeric_limits<long double>::infinity();
    for (int m = 0; m < 8; ++m) {
      const long double d = std::fabs(a - kMag[m]);
      if (d < best_d || (d == best_d && m % 2 == 0)) {
        best = m;
        best_d = d;
      }
    }
    r.codes[i] = static_cast<uint8_t>(best | (std::signbit(in[i]) ? 8 : 0));
  }
  return r;
}

void ExpectMatchesOracle(const Block& in) {
  const Encoded e = Encode(in);
  const OracleResult o = Oracle(in);
  ASSERT_EQ(e.scale, o.scale);
  for (int i = 0; i < kMxfp4BlockElems; ++i) {
    ASSERT_EQ(CodeAt(e, i), o.codes[i]) << "element " << i << " = " << in[i] << " (bits 0x" << std::hex
                                        << Bits(in[i]) << ")";
  }
}

// Block whose max is 6 * 2^k, so the scale is 2^k and the first n elements
// can be chosen freely in units of 2^k.
Block WithScaleAnchor(int k) {
  Block b{};
  b[31] = std::ldexp(6.0f, k);
  return b;
}

// ---- rounding ----------------------------------------------------------------

TEST(Mxfp4Encode, TiesGoToTheEvenCodeAtEveryMidpoint) {
  // Midpoint i lies between magnitude codes i and i+1; the even one wins.
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t want[7] = {0, 2, 2, 4, 4, 6, 6};  // values 0, 1, 1, 2, 2, 4, 4
  for (int k : {-120, -10, -1, 0, 1, 17, 120}) {
    Block b = WithScaleAnchor(k);
    for (int i = 0; i < 7; ++i) {
      b[i] = std::ldexp(mids[i], k);
      b[8 + i] = -std::ldexp(mids[i], k);
    }
    const Encoded e = Encode(b);
    EXPECT_EQ(e.scale, 127 + k);
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(CodeAt(e, i), want[i]) << "midpoint " << mids[i] << " at 2^" << k;
      EXPECT_EQ(CodeAt(e, 8 + i), want[i] | 8) << "midpoint -" << mids[i] << " at 2^" << k;
    }
  }
}

TEST(Mxfp4Encode, JustOffAMidpointGoesToTheNearerNeighbour) {
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  Block below = WithScaleAnchor(0), above = WithScaleAnchor(0);
  for (int i = 0; i < 7; ++i) {
    below[i] = std::nextafter(mids[i], 0.0f);
    above[i] = std::nextafter(mids[i], 8.0f);
  }
  const Encoded eb = Encode(below), ea = Encode(above);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(CodeAt(eb, i), i) << "just below " << mids[i];
    EXPECT_EQ(CodeAt(ea, i), i + 1) << "just above " << mids[i];
  }
}

TEST(Mxfp4Encode, SaturatesAtSix) {
  // The block maximum lies in [4, 8) * 2^X, so anything above 5 maps to 6.
  Block b{};
  b[0] = std::nextafter(8.0f, 0.0f);  // the largest value that keeps X = 0
  b[1] = 7.0f;
  b[2] = 6.0f;
  b[3] = std::nextafter(5.0f, 8.0f);
  b[4] = 5.0f;  // a tie: goes to 4
  b[5] = -7.5f;
  const Encoded e = Encode(b);
  EXPECT_EQ(e.scale, 127);
  EXPECT_EQ(CodeAt(e, 0), 7);
  EXPECT_EQ(CodeAt(e, 1), 7);
  EXPECT_EQ(CodeAt(e, 2), 7);
  EXPECT_EQ(CodeAt(e, 3), 7);
  EXPECT_EQ(CodeAt(e, 4), 6);
  EXPECT_EQ(CodeAt(e, 5), 15);

  // The largest float: X = 125, scale 252, and it decodes to 6 * 2^125.
  Block big{};
  big[0] = std::numeric_limits<float>::max();
  big[1] = -std::numeric_limits<float>::max();
  const Encoded eg = Encode(big);
  EXPECT_EQ(eg.scale, 252);
  EXPECT_EQ(CodeAt(eg, 0), 7);
  EXPECT_EQ(CodeAt(eg, 1), 15);
  float out[32];
  Mxfp4DecodeBlock(eg.packed.data(), eg.scale, out);
  EXPECT_EQ(out[0], std::ldexp(6.0f, 125));
}

// ---- zeros, signs, denormals ----------------------------------------------------

TEST(Mxfp4Encode, AllZeroBlockGetsScaleZero) {
  Block b{};
  const Encoded e = Encode(b);
  EXPECT_EQ(e.scale, 0);
  for (uint8_t byte : e.packed) EXPECT_EQ(byte, 0);
}

TEST(Mxfp4Encode, NegativeZeroKeepsItsSignBitEvenInAnAllZeroBlock) {
  // Decision (section 7 is silent): the sign bit is always the input's, so
  // -0.0 is code 8 wherever it appears, and decoding gives -0.0 back.
  Block b{};
  b[3] = -0.0f;
  b[20] = -0.0f;
  const Encoded e = Encode(b);
  EXPECT_EQ(e.scale, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(CodeAt(e, i), (i == 3 || i == 20) ? 8 : 0) << i;
  float out[32];
  Mxfp4DecodeBlock(e.packed.data(), e.scale, out);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(Bits(out[i]), Bits(b[i])) << i;

  // In a non-zero block too, and small negatives that round to zero become -0.
  Block c = WithScaleAnchor(0);
  c[0] = -0.0f;
  c[1] = -0.1f;
  c[2] = -0.25f;  // tie between -0 and -0.5: goes to -0
  const Encoded ec = Encode(c);
  EXPECT_EQ(CodeAt(ec, 0), 8);
  EXPECT_EQ(CodeAt(ec, 1), 8);
  EXPECT_EQ(CodeAt(ec, 2), 8);
}

TEST(Mxfp4Encode, DenormalRangeInputsClampTheScaleAtZero) {
  {  // max|v| = 1e-39 (denormal): floor(log2) = -130, X clamps to -127.
    Block b{};
    b[0] = 1e-39f;
    b[1] = -1e-39f;
    b[2] = 1e-45f;  // rounds to 2^-149, the smallest denormal
    const Encoded e = Encode(b);
    EXPECT_EQ(e.scale, 0);
    EXPECT_EQ(CodeAt(e, 0), 0);  // 1e-39 * 2^127 ~= 0.17 < 0.25
    EXPECT_EQ(CodeAt(e, 1), 8);
    EXPECT_EQ(CodeAt(e, 2), 0);
    ExpectMatchesOracle(b);
  }
  {  // max|v| = 1e-45 alone.
    Block b{};
    b[7] = -1e-45f;
    const Encoded e = Encode(b);
    EXPECT_EQ(e.scale, 0);
    EXPECT_EQ(CodeAt(e, 7), 8);
    ExpectMatchesOracle(b);
  }
  {  // Denormals that are exactly representable at scale 0 survive a round trip.
    Block b{};
    const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int i = 0; i < 8; ++i) {
      b[i] = std::ldexp(vals[i], -127);
      b[8 + i] = -std::ldexp(vals[i], -127);
    }
    ASSERT_EQ(std::fpclassify(b[1]), FP_SUBNORMAL);
    const Encoded e = Encode(b);
    EXPECT_EQ(e.scale, 0);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(CodeAt(e, i), i);
      EXPECT_EQ(CodeAt(e, 8 + i), 8 + i);
    }
    float out[32];
    Mxfp4DecodeBlock(e.packed.data(), e.scale, out);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(Bits(out[i]), Bits(b[i])) << i;
  }
  {  // At the clamp boundary: 2^-125 gives X = -127 exactly; 2^-124 gives X = -126.
    Block b{};
    b[0] = std::ldexp(1.0f, -125);
    EXPECT_EQ(Encode(b).scale, 0);
    EXPECT_EQ(CodeAt(Encode(b), 0), 6);  // value 4
    b[0] = std::ldexp(1.0f, -124);
    EXPECT_EQ(Encode(b).scale, 1);
  }
}

// ---- scales -----------------------------------------------------------------

TEST(Mxfp4Scale, E8M0ValuesAndNan) {
  EXPECT_EQ(static_cast<double>(E8M0ToFloat(0)), std::ldexp(1.0, -127));
  EXPECT_EQ(std::fpclassify(E8M0ToFloat(0)), FP_SUBNORMAL);
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(static_cast<double>(E8M0ToFloat(254)), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(E8M0ToFloat(255)));
}

TEST(Mxfp4Scale, Scale255DecodesToNanEvenForZeroCodes) {
  std::array<uint8_t, 16> packed{};
  packed[0] = 0x80;  // element 1 is -0
  packed[5] = 0x27;  // elements 10, 11 are 6 and 1
  float out[32];
  Mxfp4DecodeBlock(packed.data(), 255, out);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

TEST(Mxfp4Scale, FindNanScaleReportsTheFirst) {
  std::vector<uint8_t> s(1000, 127);
  EXPECT_EQ(Mxfp4FindNanScale(s.data(), s.size()), -1);
  EXPECT_EQ(Mxfp4FindNanScale(s.data(), 0), -1);
  s[617] = 255;
  s[900] = 255;
  EXPECT_EQ(Mxfp4FindNanScale(s.data(), s.size()), 617);
  s[0] = 255;
  EXPECT_EQ(Mxfp4FindNanScale(s.data(), s.size()), 0);
  s.assign(10, 254);
  EXPECT_EQ(Mxfp4FindNanScale(s.data(), s.size()), -1);
}

// ---- layout -----------------------------------------------------------------

TEST(Mxfp4Layout, ElementTwoJIsTheLowNibbleOfByteJ) {
  // Element i gets magnitude i % 8 and sign (i / 8) % 2, so each byte's two
  // nibbles differ and their order is visible.
  Block b{};
  const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int i = 0; i < 32; ++i) b[i] = ((i / 8) % 2 ? -1.0f : 1.0f) * vals[i % 8];
  const Encoded e = Encode(b);
  EXPECT_EQ(e.scale, 127);
  for (int j = 0; j < 16; ++j) {
    const int lo = 2 * j, hi = 2 * j + 1;
    const uint8_t want = static_cast<uint8_t>(((lo % 8) | ((lo / 8) % 2) * 8) | (((hi % 8) | ((hi / 8) % 2) * 8) << 4));
    EXPECT_EQ(e.packed[j], want) << "byte " << j;
  }
  EXPECT_EQ(e.packed[0], 0x10);  // element 0 = 0 low, element 1 = 0.5 high
  float out[32];
  Mxfp4DecodeBlock(e.packed.data(), e.scale, out);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(Bits(out[i]), Bits(b[i])) << i;
}

// ---- matrices ----------------------------------------------------------------

TEST(Mxfp4Matrix, EncodeAndDecodeAgreeWithBlockwise) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-20, 20);
  const size_t rows = 37, cols = 160, nb = cols / 32;
  std::vector<float> w(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    const int e = exp(rng);  // a different magnitude per row
    for (size_t c = 0; c < cols; ++c) w[r * cols + c] = std::ldexp(normal(rng), e);
  }
  std::vector<uint8_t> blocks(rows * nb * 16), scales(rows * nb);
  ASSERT_EQ(Mxfp4EncodeMatrix(w.data(), rows, cols, blocks.data(), scales.data()), -1);

  std::vector<float> decoded(rows * cols);
  Mxfp4DecodeMatrix(blocks.data(), scales.data(), rows, cols, decoded.data());
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < nb; ++b) {
      Block in;
      std::memcpy(in.data(), &w[r * cols + b * 32], sizeof(in));
      const Encoded e = Encode(in);
      const size_t bi = r * nb + b;
      ASSERT_EQ(scales[bi], e.scale) << "row " << r << " block " << b;
      ASSERT_EQ(0, std::memcmp(&blocks[bi * 16], e.packed.data(), 16)) << "row " << r << " block " << b;
      float out[32];
      Mxfp4DecodeBlock(e.packed.data(), e.scale, out);
      ASSERT_EQ(0, std::memcmp(&decoded[r * cols + b * 32], out, sizeof(out))) << "row " << r << " block " << b;
    }
  }
  // Quantisation error is bounded by half the gap at the top of the range:
  // 1 * 2^X, and 2^X <= max|v| / 4.
  for (size_t i = 0; i < w.size(); ++i) {
    float amax = 0;
    for (size_t k = i / 32 * 32; k < i / 32 * 32 + 32; ++k) amax = std::max(amax, std::fabs(w[k]));
    EXPECT_LE(std::fabs(decoded[i] - w[i]), amax / 4) << i;
  }
}

TEST(Mxfp4Matrix, NonFiniteInputIsReportedWithItsIndex) {
  const size_t rows = 4, cols = 64;
  std::vector<float> w(rows * cols, 1.0f);
  std::vector<uint8_t> blocks(rows * cols / 2), scales(rows * cols / 32);
  w[150] = std::numeric_limits<float>::quiet_NaN();
  w[200] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Mxfp4EncodeMatrix(w.data(), rows, cols, blocks.data(), scales.data()), 150);
  w[150] = 1.0f;
  EXPECT_EQ(Mxfp4EncodeMatrix(w.data(), rows, cols, blocks.data(), scales.data()), 200);
  w[200] = 1.0f;
  w[255] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(Mxfp4EncodeMatrix(w.data(), rows, cols, blocks.data(), scales.data()), 255);
  w[255] = 1.0f;
  EXPECT_EQ(Mxfp4EncodeMatrix(w.data(), rows, cols, blocks.data(), scales.data()), -1);
}

TEST(Mxfp4Encode, BlockRefusesNonFiniteAndWritesNothing) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    Block b = WithScaleAnchor(0);
    b[13] = bad;
    std::array<uint8_t, 16> packed;
    packed.fill(0xAB);
    uint8_t scale = 0xCD;
    EXPECT_FALSE(Mxfp4EncodeBlock(b.data(), packed.data(), &scale));
    EXPECT_EQ(scale, 0xCD);
    for (uint8_t byte : packed) EXPECT_EQ(byte, 0xAB);
  }
}

// ---- round trips ---------------------------------------------------------------

TEST(Mxfp4RoundTrip, EncodeOfDecodeIsIdentityForCanonicalBlocks) {
  // A block is what the encoder would produce (canonical) when its largest
  // magnitude code is 4 or 6 (codes 6, 7), or at scale 0 for any codes. Only
  // scales up to 252 decode to finite values throughout: 4 * 2^(253-127)
  // overflows.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> code(0, 15), pos(0, 31), top(6, 7), sign(0, 1);
  for (int s = 0; s <= 252; ++s) {
    for (int trial = 0; trial < 40; ++trial) {
      std::array<uint8_t, 32> codes;
      for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
      if (s > 0) codes[pos(rng)] = static_cast<uint8_t>(top(rng) | sign(rng) * 8);
      const auto packed = Pack(codes);
      Block decoded;
      Mxfp4DecodeBlock(packed.data(), static_cast<uint8_t>(s), decoded.data());
      const Encoded e = Encode(decoded);
      ASSERT_EQ(e.scale, s);
      ASSERT_EQ(0, std::memcmp(e.packed.data(), packed.data(), 16)) << "scale " << s;
    }
  }
}

TEST(Mxfp4RoundTrip, EncodeOfDecodeKeepsEveryFiniteBlocksValues) {
  // Any codes at any scale 0..254: when the decoded block is finite, encoding
  // it again (maybe at a smaller scale) decodes to the same bits; when it
  // overflowed to inf, the encoder refuses it.
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int s = 0; s <= 254; ++s) {
    for (int trial = 0; trial < 40; ++trial) {
      std::array<uint8_t, 16> packed;
      for (auto& b : packed) b = static_cast<uint8_t>(byte(rng));
      Block decoded;
      Mxfp4DecodeBlock(packed.data(), static_cast<uint8_t>(s), decoded.data());
      bool finite = true;
      for (float v : decoded) finite = finite && std::isfinite(v);
      Encoded e;
      const bool ok = Mxfp4EncodeBlock(decoded.data(), e.packed.data(), &e.scale);
      ASSERT_EQ(ok, finite) << "scale " << s;
      if (!ok) continue;
      ASSERT_LE(e.scale, s);
      Block again;
      Mxfp4DecodeBlock(e.packed.data(), e.scale, again.data());
      ASSERT_EQ(0, std::memcmp(again.data(), decoded.data(), sizeof(Block))) << "scale " << s;
    }
  }
}

// ---- oracle ------------------------------------------------------------------

TEST(Mxfp4Oracle, AgreesOnRandomValuesAcrossMagnitudes) {
  std::mt19937 rng(2024);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> kind(0, 3), base(-150, 125), spread(-12, 2), grid(0, 31), sign(0, 1);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  constexpr int kBlocks = 4000;  // 128,000 values
  for (int n = 0; n < kBlocks; ++n) {
    Block b{};
    const int k = kind(rng), e = base(rng);
    for (float& v : b) {
      switch (k) {
        case 0: {  // any finite float, denormals included
          uint32_t u;
          do u = bits(rng); while (((u >> 23) & 0xFF) == 0xFF);
          v = std::bit_cast<float>(u);
          break;
        }
        case 1:  // one magnitude per block, elements a few binades apart (< 2^127: finite)
          v = std::ldexp(unit(rng), e + spread(rng));
          break;
        case 2:  // exact multiples of 2^(X-2): hits every midpoint and code
          v = std::ldexp(static_cast<float>(grid(rng)), std::clamp(e, -147, 100) - 2);
          break;
        default: {  // near-midpoints: one ulp either side of a grid point
          const float g = std::ldexp(static_cast<float>(grid(rng)), std::clamp(e, -120, 100) - 2);
          v = std::nextafter(g, sign(rng) ? 0.0f : std::numeric_limits<float>::max());
          break;
        }
      }
      if (sign(rng)) v = -v;
    }
    ExpectMatchesOracle(b);
    if (HasFatalFailure()) {
      ADD_FAILURE() << "block " << n << " kind " << k;
      return;
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels
