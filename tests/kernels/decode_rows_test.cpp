// The batched decode products (mxfp4_packed.hpp, kSmallBatchMaxRows): up to
// 64 activation rows, matmul_mxfp4 and matmul_bf16 read each weight once for
// all the rows with row-tiled kernels, and a row's result must not depend on
// the rows beside it: every row of a batched product equals, bit for bit,
// that row multiplied alone, on every variant this CPU runs; and each stays
// within the reference's tolerance. Row counts cross the tiles (6 rows for
// BF16 and 3-part MXFP4, with every tail), odd output counts the BF16 pairs
// of rows and a partial last MXFP4 group; BF16 inputs not a multiple of 32
// the masked last step. (Before the row tiles, 8-64 MXFP4 rows and 32-64
// BF16 rows ran the fp32 GEMMs, whose sums differ from the single row's.)
// The AVX-512 set's F32 product has the same tiles (matmul_avx512.cpp); the
// other sets' F32 products take their GEMM from 8 rows and are not checked
// for it here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "each_variant.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {
namespace {

constexpr size_t kRowCounts[] = {2, 3, 5, 6, 7, 8, 13, 32, 63, 64};

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Checks Y [n, out] row by row against `alone(t, y)` (the row multiplied
// alone) bit for bit, and against ref within tol.
template <class Alone>
void ExpectRowsAsAlone(const char* name, size_t n, size_t out, const std::vector<float>& Y, const std::vector<float>& ref,
                       double tol, Alone alone) {
  std::vector<float> y(out);
  for (size_t t = 0; t < n; ++t) {
    std::fill(y.begin(), y.end(), NAN);
    alone(t, y.data());
    ASSERT_EQ(std::memcmp(y.data(), &Y[t * out], out * 4), 0) << name << ": row " << t << " of " << n
                                                              << " differs from the row alone";
    for (size_t o = 0; o < out; ++o)
      ASSERT_NEAR(Y[t * out + o], ref[t * out + o], tol) << name << " n " << n << " row " << t << " col " << o;
  }
}

TEST(DecodeRows, Bf16RowsEqualEachRowAloneBitForBit) {
  for (auto [out, in] : {std::pair<size_t, size_t>{131, 515}, {64, 1024}, {7, 33}}) {
    std::vector<uint16_t> W(out * in);
    const std::vector<float> wf = Normal(W.size(), 3);
    for (size_t i = 0; i < W.size(); ++i) W[i] = ToBf16(wf[i]);
    for (size_t n : kRowCounts) {
      const std::vector<float> X = Normal(n * in, static_cast<uint32_t>(n));
      std::vector<float> ref(n * out);
      MatMulBf16Ref(W.data(), out, in, X.data(), n, ref.data());
      ForEachVariant("matmul_bf16 (decode rows)", [&](const KernelSet& k) {
        std::vector<float> Y(n * out, NAN);
        k.matmul_bf16(W.data(), out, in, X.data(), n, Y.data());
        ExpectRowsAsAlone(k.matmul_bf16.name, n, out, Y, ref, 1e-4 * std::sqrt(static_cast<double>(in)) + 1e-5,
                          [&](size_t t, float* y) { k.matmul_bf16(W.data(), out, in, &X[t * in], 1, y); });
      });
    }
  }
}

TEST(DecodeRows, Mxfp4RowsEqualEachRowAloneBitForBit) {
  for (auto [out, in] : {std::pair<size_t, size_t>{200, 1024}, {768, 96}, {16, 32}}) {
    std::mt19937 rng(static_cast<uint32_t>(out + in));
    std::vector<uint8_t> blocks(out * in / 2), scales(out * in / 32);
    for (auto& b : blocks) b = static_cast<uint8_t>(rng());
    for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 8);
    const Mxfp4PackedStack stack(blocks.data(), scales.data(), 1, out, in);
    const Mxfp4PackedView w = stack.matrix(0);
    for (size_t n : kRowCounts) {
      const std::vector<float> X = Normal(n * in, static_cast<uint32_t>(n + 100));
      std::vector<float> ref(n * out);
      MatMulMxfp4PackedRef(w, X.data(), n, ref.data());
      double amax = 0;
      for (float r : ref) amax = std::max(amax, static_cast<double>(std::fabs(r)));
      ForEachVariant("matmul_mxfp4 (decode rows)", [&](const KernelSet& k) {
        std::vector<float> Y(n * out, NAN);
        k.matmul_mxfp4(w, X.data(), n, Y.data());
        // The integer form's only error: activations rounded to 21 bits.
        ExpectRowsAsAlone(k.matmul_mxfp4.name, n, out, Y, ref, 1e-5 * amax + 1e-5,
                          [&](size_t t, float* y) { k.matmul_mxfp4(w, &X[t * in], 1, y); });
      });
    }
  }
}

TEST(DecodeRows, F32RowsEqualEachRowAloneBitForBitOnAvx512) {
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512: the F32 row tiles are AVX-512 only";
  const KernelSet& k = Kernels(Isa::kAvx512);
  for (auto [out, in] : {std::pair<size_t, size_t>{131, 515}, {64, 1024}, {3, 17}}) {
    const std::vector<float> W = Normal(out * in, 5);
    for (size_t n : kRowCounts) {
      const std::vector<float> X = Normal(n * in, static_cast<uint32_t>(n + 7));
      std::vector<float> ref(n * out), Y(n * out, NAN);
      MatMulF32Ref(W.data(), out, in, X.data(), n, ref.data());
      k.matmul_f32(W.data(), out, in, X.data(), n, Y.data());
      ExpectRowsAsAlone(k.matmul_f32.name, n, out, Y, ref, 1e-4 * std::sqrt(static_cast<double>(in)) + 1e-5,
                        [&](size_t t, float* y) { k.matmul_f32(W.data(), out, in, &X[t * in], 1, y); });
    }
  }
}

// The experts of a decode step as one pass: jobs of 1 to 64 rows each give
// what each job gives alone, and each row what it gives alone.
TEST(DecodeRows, ManyMxfp4JobsOfManyRowsEqualEachRowAlone) {
  const size_t out = 96, in = 256;
  std::vector<Mxfp4PackedStack> stacks;
  std::mt19937 rng(11);
  const std::vector<size_t> rows = {1, 9, 64, 4, 33};
  for (size_t j = 0; j < rows.size(); ++j) {
    std::vector<uint8_t> blocks(out * in / 2), scales(out * in / 32);
    for (auto& b : blocks) b = static_cast<uint8_t>(rng());
    for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 8);
    stacks.emplace_back(blocks.data(), scales.data(), 1, out, in);
  }
  std::vector<std::vector<float>> X, Y;
  for (size_t j = 0; j < rows.size(); ++j) {
    X.push_back(Normal(rows[j] * in, static_cast<uint32_t>(j + 50)));
    Y.emplace_back(rows[j] * out, NAN);
  }
  ForEachVariant("matvec_mxfp4_many (decode rows)", [&](const KernelSet& k) {
    std::vector<Mxfp4MatVecJob> jobs;
    for (size_t j = 0; j < rows.size(); ++j) {
      std::fill(Y[j].begin(), Y[j].end(), NAN);
      jobs.push_back({stacks[j].matrix(0), X[j].data(), rows[j], Y[j].data()});
    }
    k.matvec_mxfp4_many(jobs);
    std::vector<float> y(out);
    for (size_t j = 0; j < rows.size(); ++j)
      for (size_t t = 0; t < rows[j]; ++t) {
        k.matmul_mxfp4(stacks[j].matrix(0), &X[j][t * in], 1, y.data());
        ASSERT_EQ(std::memcmp(y.data(), &Y[j][t * out], out * 4), 0)
            << k.matvec_mxfp4_many.name << ": job " << j << " row " << t;
      }
  });
}

}  // namespace
}  // namespace moeserve::kernels
