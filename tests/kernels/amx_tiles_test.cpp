// The AMX BF16-activation products (amx_tiles.hpp): the tile model against
// Intel's pseudo-code, the model's faults, the AVX-512 helpers (packing,
// output writes, MXFP4 decoding) against their plain loops bit for bit, the
// tile program on the model (BF16 and MXFP4 weights) against the reference
// products on shapes off every tile size, and, on a CPU with AMX, the
// registry's amx row against the reference and the model.
#include "moeserve/kernels/amx_tiles.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

#include "bf16_bits.hpp"
#include "random_inputs.hpp"

namespace moeserve::kernels {
namespace {

// A configuration of three small tiles: C 2 x 2 fp32 (tile 0), A 2 rows of
// 3 pairs (tile 1), B 3 pairs x 2 columns (tile 2).
AmxTileConfig SmallConfig() {
  AmxTileConfig c;
  c.palette = 1;
  c.rows[0] = 2, c.colsb[0] = 8;
  c.rows[1] = 2, c.colsb[1] = 12;
  c.rows[2] = 3, c.colsb[2] = 8;
  return c;
}

TEST(AmxTileModel, DotBf16PairsEachARowsPairWithBsRowOfThatPair) {
  AmxTileModel m;
  m.Configure(SmallConfig());
  // A[m][i] = bf16 pairs along k: i = 2 kk + e. B[kk][2 n + e].
  const float a[2][6] = {{1, 2, 3, 4, 5, 6}, {-1, 0.5f, 2, -3, 0.25f, 8}};
  const float b[3][4] = {{1, 10, 100, 1000}, {2, 20, 200, 2000}, {-1, 3, 7, -5}};
  uint16_t abits[2][6], bbits[3][4];
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 6; ++i) abits[r][i] = ToBf16Bits(a[r][i]);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 4; ++i) bbits[r][i] = ToBf16Bits(b[r][i]);
  const float c0[2][2] = {{0.5f, -1}, {4, 0}};
  m.Load<0>(c0, sizeof(c0[0]));
  m.Load<1>(abits, sizeof(abits[0]));
  m.Load<2>(bbits, sizeof(bbits[0]));
  m.DotBf16<0, 1, 2>();
  float c[2][2];
  m.Store<0>(c, sizeof(c[0]));
  for (int r = 0; r < 2; ++r)
    for (int n = 0; n < 2; ++n) {
      float want = c0[r][n];
      for (int kk = 0; kk < 3; ++kk) want += a[r][2 * kk] * b[kk][2 * n] + a[r][2 * kk + 1] * b[kk][2 * n + 1];
      EXPECT_EQ(c[r][n], want) << r << "," << n;  // small integers and halves: exact
    }
  // Row 0, column 0 by hand: 0.5 + 1*1 + 2*10 + 3*2 + 4*20 + 5*(-1) + 6*3.
  EXPECT_EQ(c[0][0], 0.5f + 1 + 20 + 6 + 80 - 5 + 18);
}

TEST(AmxTileModel, SumsOneProductAtATimeFlushingSubnormals) {
  AmxTileModel m;
  AmxTileConfig cfg;
  cfg.palette = 1;
  cfg.rows[0] = 1, cfg.colsb[0] = 4;  // one fp32
  cfg.rows[1] = 1, cfg.colsb[1] = 4;  // one pair
  cfg.rows[2] = 1, cfg.colsb[2] = 4;
  m.Configure(cfg);
  // 1 + 2^-24 + 2^-24: each addition rounds back to 1 (ties to even); the
  // pair's exact sum would have reached 1 + 2^-23.
  const float one = 1.0f;
  const uint16_t a[2] = {ToBf16Bits(0x1p-12f), ToBf16Bits(0x1p-12f)};
  const uint16_t b[2] = {ToBf16Bits(0x1p-12f), ToBf16Bits(0x1p-12f)};
  m.Load<0>(&one, 4);
  m.Load<1>(a, 4);
  m.Load<2>(b, 4);
  m.DotBf16<0, 1, 2>();
  float c;
  m.Store<0>(&c, 4);
  EXPECT_EQ(c, 1.0f);
  // A subnormal input counts as zero.
  const float zero = 0.0f;
  const uint16_t sub[2] = {0x0001, ToBf16Bits(1.0f)}, ones[2] = {ToBf16Bits(0x1p100f), ToBf16Bits(2.0f)};
  m.Load<0>(&zero, 4);
  m.Load<1>(sub, 4);
  m.Load<2>(ones, 4);
  m.DotBf16<0, 1, 2>();
  m.Store<0>(&c, 4);
  EXPECT_EQ(c, 2.0f);
}

TEST(AmxTileModel, LoadsZeroWhatLiesPastTheConfiguredRows) {
  AmxTileModel m;
  m.Configure(SmallConfig());
  const float big[4][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}, {13, 14, 15, 16}};
  m.Load<0>(big, sizeof(big[0]));  // 2 rows of 8 bytes
  float out[4][4];
  for (auto& r : out)
    for (float& x : r) x = -1;
  m.Store<0>(out, sizeof(out[0]));
  EXPECT_EQ(out[0][0], 1);
  EXPECT_EQ(out[0][1], 2);
  EXPECT_EQ(out[1][1], 6);
  EXPECT_EQ(out[0][2], -1);  // past the row's 8 bytes: untouched
  EXPECT_EQ(out[2][0], -1);  // past the 2 rows: untouched
}

// Each a fresh model asked to do what the hardware faults on.
void ZeroUnconfigured() {
  AmxTileModel m;
  m.Zero<0>();
}
void ConfigureWith(void (*edit)(AmxTileConfig&)) {
  AmxTileModel m;
  AmxTileConfig c = SmallConfig();
  edit(c);
  m.Configure(c);
}
void DotWith(void (*edit)(AmxTileConfig&)) {
  AmxTileModel m;
  AmxTileConfig c = SmallConfig();
  edit(c);
  m.Configure(c);
  m.DotBf16<0, 1, 2>();
}
void DotNamingATileTwice() {
  AmxTileModel m;
  m.Configure(SmallConfig());
  m.DotBf16<0, 1, 1>();
}
void ZeroAfterRelease() {
  AmxTileModel m;
  m.Configure(SmallConfig());
  m.Release();
  m.Zero<0>();
}

TEST(AmxTileModelDeathTest, RefusesWhatTheHardwareFaultsOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(ZeroUnconfigured(), "without a configuration");
  EXPECT_DEATH(ConfigureWith([](AmxTileConfig& c) { c.palette = 2; }), "palette");
  EXPECT_DEATH(ConfigureWith([](AmxTileConfig& c) { c.rows[3] = 17; c.colsb[3] = 64; }), "more than 16 rows");
  EXPECT_DEATH(ConfigureWith([](AmxTileConfig& c) { c.rows[3] = 2; c.colsb[3] = 68; }), "longer than 64 bytes");
  EXPECT_DEATH(ConfigureWith([](AmxTileConfig& c) { c.rows[9] = 1; c.colsb[9] = 4; }), "past the palette");
  EXPECT_DEATH(ConfigureWith([](AmxTileConfig& c) { c.reserved[3] = 1; }), "reserved");
  // B's rows no longer A's pairs (3); A's rows no longer C's.
  EXPECT_DEATH(DotWith([](AmxTileConfig& c) { c.rows[2] = 2; }), "B's rows");
  EXPECT_DEATH(DotWith([](AmxTileConfig& c) { c.rows[1] = 1; }), "A's rows");
  EXPECT_DEATH(DotNamingATileTwice(), "one tile twice");
  EXPECT_DEATH(ZeroAfterRelease(), "without a configuration");
}

TEST(AmxPacking, LayoutIsTheDocumentedOne) {
  // n 20, in 40: two token blocks, two k steps. Token 17, k 35 sits in
  // token block 1 (j = 1), k step 1 (pair r = 1, element e = 1).
  const size_t n = 20, in = 40;
  std::vector<float> X(n * in);
  for (size_t i = 0; i < X.size(); ++i) X[i] = static_cast<float>(i % 251) - 125.0f;
  std::vector<uint16_t> packed(AmxPackedActivationsElements(n, in), 0xAAAA);
  ASSERT_EQ(packed.size(), 32u * 64u);
  AmxPackActivationsRef(X.data(), n, in, 0, 2, packed.data());
  EXPECT_EQ(packed[((1 * 2 + 1) * 16 + 1) * 32 + 2 * 1 + 1], ToBf16Bits(X[17 * in + 35]));
  EXPECT_EQ(packed[((0 * 2 + 0) * 16 + 0) * 32 + 0], ToBf16Bits(X[0]));
  EXPECT_EQ(packed[((0 * 2 + 0) * 16 + 0) * 32 + 2 * 5], ToBf16Bits(X[5 * in]));  // token 5, k 0
  EXPECT_EQ(packed[((1 * 2 + 1) * 16 + 4) * 32 + 2 * 3], 0);               // token 19, k 40: past in
  EXPECT_EQ(packed[((1 * 2 + 0) * 16 + 0) * 32 + 2 * 4], 0);               // token 20: past n
}

TEST(AmxPacking, Avx512MatchesThePlainLoop) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no avx512_bf16 on this CPU: the AVX-512 packing cannot run here";
  std::mt19937 rng(71);
  for (size_t n : {1, 15, 16, 33, 64}) {
    for (size_t in : {1, 16, 31, 32, 33, 100, 256}) {
      SCOPED_TRACE("n " + std::to_string(n) + " in " + std::to_string(in));
      std::vector<float> X = Random(n * in, rng);
      // The rounding's edges: ties, NaN, infinities, subnormals, overflow.
      const float edges[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, std::numeric_limits<float>::quiet_NaN(),
                             -std::numeric_limits<float>::infinity(), 0x1p-130f, -0x1p-130f,
                             std::numeric_limits<float>::max(), -0.0f};
      for (size_t i = 0; i < std::size(edges) && i < X.size(); ++i) X[(i * 37) % X.size()] = edges[i];
      const size_t elements = AmxPackedActivationsElements(n, in), blocks = elements / 512 / ((in + 31) / 32);
      std::vector<uint16_t> want(elements, 0xAAAA), got(elements, 0x5555);
      AmxPackActivationsRef(X.data(), n, in, 0, blocks, want.data());
      AmxPackActivations(X.data(), n, in, 0, blocks, got.data());
      ASSERT_EQ(got, want);
    }
  }
}

TEST(AmxWriteTile, Avx512MatchesThePlainLoop) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU: the AVX-512 writer cannot run here";
  std::mt19937 rng(72);
  const std::vector<float> tile = Random(256, rng);
  const size_t ldy = 21;
  for (size_t rows : {1, 7, 16})
    for (size_t cols : {1, 9, 16}) {
      std::vector<float> want(16 * ldy, -7.0f), got(16 * ldy, -7.0f);
      AmxWriteTileTransposedRef(tile.data(), want.data(), ldy, rows, cols);
      AmxWriteTileTransposed(tile.data(), got.data(), ldy, rows, cols);
      EXPECT_EQ(got, want) << rows << " x " << cols;
      EXPECT_EQ(want[3 * ldy + 0], cols > 3 ? tile[0 * 16 + 3] : -7.0f);  // token 3, output 0
      EXPECT_EQ(want[0 * ldy + rows], -7.0f);                             // past the rows: untouched
    }
}

struct Shape {
  size_t n, out, in;
};

// Off every tile size: tokens not a multiple of 16 or 32, outputs not of
// the 32-output strip, k not of 32 (odd, too), one strip and many.
const Shape kShapes[] = {{16, 32, 32}, {17, 45, 101}, {40, 70, 33}, {33, 33, 64},
                         {100, 97, 257}, {25, 50, 2051}, {64, 64, 96}, {1, 3, 7}};

// |y - y_ref| <= 1e-5 sum_k |w_k x_k|: fp32 summation order only.
void ExpectNearReference(const std::vector<float>& got, const std::vector<uint16_t>& W, const std::vector<float>& X,
                         const Shape& s, const std::string& what) {
  std::vector<float> ref(s.n * s.out);
  MatMulBf16Bf16ActRef(W.data(), s.out, s.in, X.data(), s.n, ref.data());
  int bad = 0;
  for (size_t t = 0; t < s.n && bad < 5; ++t)
    for (size_t o = 0; o < s.out && bad < 5; ++o) {
      double mag = 0;
      for (size_t k = 0; k < s.in; ++k)
        mag += std::fabs(static_cast<double>(FromBf16Bits(W[o * s.in + k])) * RoundToBf16(X[t * s.in + k]));
      const float g = got[t * s.out + o], w = ref[t * s.out + o];
      if (!(std::fabs(static_cast<double>(g) - w) <= 1e-5 * mag + 1e-30)) {
        ADD_FAILURE() << what << " at token " << t << " output " << o << ": got " << g << " want " << w;
        ++bad;
      }
    }
}

// The same bound for MXFP4 weights, their values dq [out, in].
void ExpectNearMxfp4Reference(const std::vector<float>& got, const std::vector<float>& ref,
                              const std::vector<float>& dq, const std::vector<float>& X, const Shape& s,
                              const std::string& what) {
  int bad = 0;
  for (size_t t = 0; t < s.n && bad < 5; ++t)
    for (size_t o = 0; o < s.out && bad < 5; ++o) {
      double mag = 0;
      for (size_t k = 0; k < s.in; ++k)
        mag += std::fabs(static_cast<double>(dq[o * s.in + k]) * RoundToBf16(X[t * s.in + k]));
      const float g = got[t * s.out + o], w = ref[t * s.out + o];
      if (!(std::fabs(static_cast<double>(g) - w) <= 1e-5 * mag + 1e-30)) {
        ADD_FAILURE() << what << " at token " << t << " output " << o << ": got " << g << " want " << w;
        ++bad;
      }
    }
}

std::vector<uint16_t> RandomBf16(size_t count, std::mt19937& rng) {
  std::vector<uint16_t> w(count);
  const std::vector<float> f = Random(count, rng);
  for (size_t i = 0; i < count; ++i) w[i] = ToBf16Bits(f[i]);
  return w;
}

TEST(AmxBf16Program, OnTheTileModelMatchesTheReference) {
  std::mt19937 rng(73);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " out " + std::to_string(s.out) + " in " + std::to_string(s.in));
    const std::vector<uint16_t> W = RandomBf16(s.out * s.in, rng);
    const std::vector<float> X = Random(s.n * s.in, rng);
    for (bool avx512 : {false, true}) {
      if (avx512 && !CpuHasAvx512Bf16()) continue;  // reported by the packing test's skip
      std::vector<float> y(s.n * s.out, std::nanf(""));
      MatMulBf16Bf16ActOnTileModel(W.data(), s.out, s.in, X.data(), s.n, y.data(), avx512);
      ExpectNearReference(y, W, X, s, avx512 ? "model, AVX-512 helpers" : "model, plain helpers");
    }
  }
}

// Random packed MXFP4 [out, in]: random codes, scales 2^-4 .. 2^4 (and the
// extremes where `extremes`: E8M0 0 and 1, the subnormal and smallest
// normal powers).
struct RandomMxfp4 {
  std::vector<uint8_t> blocks, scales;
  Mxfp4PackedStack packed;
  RandomMxfp4(size_t out, size_t in, std::mt19937& rng, bool extremes = false)
      : blocks(out * in / 2), scales(out * in / 32) {
    for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng() & 0xff);
    for (uint8_t& e : scales) e = static_cast<uint8_t>(123 + rng() % 9);
    if (extremes)
      for (size_t i = 0; i < scales.size(); i += 5) scales[i] = static_cast<uint8_t>(i % 2);
    packed = Mxfp4PackedStack(blocks.data(), scales.data(), 1, out, in);
  }
};

TEST(AmxMxfp4Decode, RowsAreTheReferenceValuesAndAvx512MatchesThePlainLoop) {
  std::mt19937 rng(75);
  for (const auto& [out, in] : {std::pair<size_t, size_t>{16, 32}, {45, 96}, {70, 2080}}) {
    SCOPED_TRACE("out " + std::to_string(out) + " in " + std::to_string(in));
    RandomMxfp4 w(out, in, rng, true);
    const Mxfp4PackedView v = w.packed.matrix(0);
    const size_t groups = Mxfp4PackedGroups(out), ld = in + 8;
    std::vector<uint16_t> want(groups * 16 * ld, 0x7777), got(groups * 16 * ld, 0x7777);
    std::vector<float> row(in);
    for (size_t g = 0; g < groups; ++g) AmxDecodeMxfp4GroupRef(v, g, want.data() + g * 16 * ld, ld);
    // The plain loop's rows are the reference decode's values, and zero past out.
    for (size_t o = 0; o < groups * 16; ++o)
      for (size_t k = 0; k < in; k += 7) {
        if (o < out) DecodePackedRow(v, o, k / 32, 1, row.data(), 1);
        const float value = FromBf16Bits(want[o * ld + k]);
        EXPECT_EQ(value, o < out ? row[k % 32] : 0.0f) << "row " << o << " k " << k;
      }
    if (!CpuHasAvx512Bf16()) continue;  // the packing test reports the skip
    for (size_t g = 0; g < groups; ++g) AmxDecodeMxfp4Group(v, g, got.data() + g * 16 * ld, ld);
    EXPECT_EQ(got, want);
  }
}

TEST(AmxMxfp4Program, OnTheTileModelMatchesTheReference) {
  // n off the token blocks; out off the 16-row group and the 32-output strip
  // (one group in the last strip); in past one 2048-long panel.
  const Shape shapes[] = {{16, 32, 32}, {17, 45, 96}, {40, 70, 64}, {33, 16, 2080}, {100, 97, 288}};
  std::mt19937 rng(76);
  for (const Shape& s : shapes) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " out " + std::to_string(s.out) + " in " + std::to_string(s.in));
    RandomMxfp4 w(s.out, s.in, rng);
    const Mxfp4PackedView v = w.packed.matrix(0);
    const std::vector<float> X = Random(s.n * s.in, rng);
    std::vector<float> ref(s.n * s.out), dq(s.out * s.in);
    MatMulMxfp4Bf16ActRef(v, X.data(), s.n, ref.data());
    for (size_t o = 0; o < s.out; ++o) DecodePackedRow(v, o, 0, s.in / 32, dq.data() + o * s.in, 1);
    for (bool avx512 : {false, true}) {
      if (avx512 && !CpuHasAvx512Bf16()) continue;  // reported by the packing test's skip
      std::vector<float> y(s.n * s.out, std::nanf(""));
      MatMulMxfp4Bf16ActOnTileModel(v, X.data(), s.n, y.data(), avx512);
      ExpectNearMxfp4Reference(y, ref, dq, X, s, avx512 ? "model, AVX-512 helpers" : "model, plain helpers");
    }
  }
}

TEST(AmxRow, TheHardwareMatchesTheReferenceAndTheModel) {
  if (!CpuHasAmxBf16())
    GTEST_SKIP() << "no AMX here (amx_tile and amx_bf16 with avx512_bf16, and the kernel's tile permission): "
                    "the amx row's instructions are not run on this CPU; "
                 << IsaReport();
  const KernelSet& k = Kernels(Isa::kAmx);
  EXPECT_STREQ(k.matmul_bf16_bf16act.name, "matmul_bf16_bf16act_amx");
  std::mt19937 rng(74);
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({512, 512, 2048});  // a prefill product's size: both threads, many strips
  for (const Shape& s : shapes) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " out " + std::to_string(s.out) + " in " + std::to_string(s.in));
    const std::vector<uint16_t> W = RandomBf16(s.out * s.in, rng);
    const std::vector<float> X = Random(s.n * s.in, rng);
    std::vector<float> y(s.n * s.out, std::nanf("")), model(s.n * s.out, std::nanf(""));
    k.matmul_bf16_bf16act(W.data(), s.out, s.in, X.data(), s.n, y.data());
    ExpectNearReference(y, W, X, s, "amx row");
    if (s.n * s.out * s.in > 1u << 24) continue;  // the model is slow
    MatMulBf16Bf16ActOnTileModel(W.data(), s.out, s.in, X.data(), s.n, model.data(), true);
    ExpectNearReference(model, W, X, s, "model");
  }
  EXPECT_STREQ(k.matmul_mxfp4_bf16act.name, "matmul_mxfp4_bf16act_amx");
  for (const Shape& s : {Shape{17, 45, 96}, Shape{100, 97, 288}, Shape{33, 16, 2080}, Shape{512, 512, 2048}}) {
    SCOPED_TRACE("MXFP4 n " + std::to_string(s.n) + " out " + std::to_string(s.out) + " in " + std::to_string(s.in));
    RandomMxfp4 w(s.out, s.in, rng);
    const Mxfp4PackedView v = w.packed.matrix(0);
    const std::vector<float> X = Random(s.n * s.in, rng);
    std::vector<float> ref(s.n * s.out), dq(s.out * s.in), y(s.n * s.out, std::nanf(""));
    MatMulMxfp4Bf16ActRef(v, X.data(), s.n, ref.data());
    for (size_t o = 0; o < s.out; ++o) DecodePackedRow(v, o, 0, s.in / 32, dq.data() + o * s.in, 1);
    k.matmul_mxfp4_bf16act(v, X.data(), s.n, y.data());
    ExpectNearMxfp4Reference(y, ref, dq, X, s, "amx row");
  }
}

}  // namespace
}  // namespace moeserve::kernels
