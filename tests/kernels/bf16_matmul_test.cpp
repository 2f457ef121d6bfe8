// BF16 weights: every variant of the matmul_bf16 family this CPU supports
// (row tiles up to 64 rows; from 65, on AVX-512 the product with tokens in
// the lanes up to 256 rows, elsewhere and above the widened fp32 GEMM)
// against the reference, on odd shapes; the reference against fp32 on the
// widened weights (conversion is exact); matvec_bf16_many against
// matmul_bf16 job by job.
#include "moeserve/kernels/bf16_matmul.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "each_variant.hpp"
#include "moeserve/kernels/cpu_ops.hpp"

namespace moeserve::kernels {
namespace {

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Random BF16 weights W [out x in] and the same values widened to fp32 in Wf.
void RandomBf16Weights(size_t out, size_t in, std::mt19937& rng, std::vector<uint16_t>& W, std::vector<float>& Wf) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  W.resize(out * in);
  Wf.resize(W.size());
  for (size_t i = 0; i < W.size(); ++i) {
    W[i] = ToBf16(d(rng));
    uint32_t u = static_cast<uint32_t>(W[i]) << 16;
    std::memcpy(&Wf[i], &u, 4);
  }
}

TEST(Bf16MatMul, FastMatchesReferenceAndFp32) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto [out, in, n] : {std::tuple{1, 1, 1}, std::tuple{7, 33, 1}, std::tuple{130, 257, 3}, std::tuple{64, 1024, 7},
                            std::tuple{100, 96, 8}, std::tuple{301, 515, 19}, std::tuple{1, 4096, 1},
                            std::tuple{333, 1024, 2}, std::tuple{70, 1000, 5}, std::tuple{5, 31, 1}, std::tuple{9, 64, 4},
                            std::tuple{77, 300, 31}, std::tuple{130, 257, 32}, std::tuple{65, 129, 45},
                            // Prefill row counts: one pass of 5 or 6 token
                            // vectors, two passes (97, 130), a last vector of
                            // one token, k chunks with a ragged tail (1100 at
                            // 256 rows), fewer output rows than a tile, and the
                            // widened GEMM past 256 rows.
                            std::tuple{100, 300, 80}, std::tuple{129, 1000, 65}, std::tuple{45, 96, 93},
                            std::tuple{77, 1000, 97}, std::tuple{3, 40, 130}, std::tuple{45, 1100, 256},
                            std::tuple{1030, 2048, 81}, std::tuple{40, 70, 257}}) {
    std::vector<uint16_t> W;
    std::vector<float> Wf, X(static_cast<size_t>(n) * in);
    RandomBf16Weights(static_cast<size_t>(out), static_cast<size_t>(in), rng, W, Wf);
    for (auto& x : X) x = d(rng);
    std::vector<float> ref(static_cast<size_t>(n) * out), f32(ref.size());
    MatMulBf16Ref(W.data(), out, in, X.data(), n, ref.data());
    MatMulF32Ref(Wf.data(), out, in, X.data(), n, f32.data());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(ref[i], f32[i]) << "reference must equal fp32 on widened weights";
    ForEachVariant("matmul_bf16", [&](const KernelSet& k) {
      std::vector<float> fast(ref.size(), NAN);
      k.matmul_bf16(W.data(), out, in, X.data(), n, fast.data());
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(fast[i], ref[i], 1e-4 * std::sqrt(static_cast<double>(in)) + 1e-5)
            << k.matmul_bf16.name << " " << out << "x" << in << " n " << n << " at " << i;
    });
  }
}

// Past the row tiles' and the lanes product's row counts, every set's
// matmul_bf16 is its fp32 GEMM on the widened weights (AVX-512: widened as
// the panels are packed, not beforehand), bit for bit.
TEST(Bf16MatMul, ManyRowsEqualFp32OnWidenedWeightsBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto [out, in, n] : {std::tuple{70, 2080, 257}, std::tuple{33, 15, 300}, std::tuple{129, 64, 512}}) {
    std::vector<uint16_t> W;
    std::vector<float> Wf, X(static_cast<size_t>(n) * in);
    RandomBf16Weights(static_cast<size_t>(out), static_cast<size_t>(in), rng, W, Wf);
    for (auto& x : X) x = d(rng);
    ForEachVariant("matmul_bf16, matmul_f32", [&](const KernelSet& k) {
      std::vector<float> bf(static_cast<size_t>(n) * out, NAN), f32(bf.size(), NAN);
      k.matmul_bf16(W.data(), out, in, X.data(), n, bf.data());
      k.matmul_f32(Wf.data(), out, in, X.data(), n, f32.data());
      ASSERT_EQ(std::memcmp(bf.data(), f32.data(), bf.size() * 4), 0)
          << k.matmul_bf16.name << " " << out << "x" << in << " n " << n;
    });
  }
}

TEST(Bf16MatMul, ManyJobsEqualEachAloneBitForBit) {
  std::mt19937 rng(8);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (size_t n : {size_t{1}, size_t{3}, size_t{7}}) {
    std::vector<std::pair<size_t, size_t>> shapes = {{300, 1024}, {7, 33}, {129, 96}, {64, 1000}, {1, 4096}};
    std::vector<std::vector<uint16_t>> W;
    std::vector<std::vector<float>> X, Y, alone;
    std::vector<Bf16MatVecJob> jobs;
    for (auto [out, in] : shapes) {
      W.emplace_back(out * in);
      for (auto& w : W.back()) w = ToBf16(d(rng));
      X.emplace_back(n * in);
      for (auto& x : X.back()) x = d(rng);
      Y.emplace_back(n * out, NAN);
      alone.emplace_back(n * out, NAN);
    }
    for (size_t j = 0; j < shapes.size(); ++j)
      jobs.push_back({W[j].data(), shapes[j].first, shapes[j].second, X[j].data(), Y[j].data()});
    // Two more jobs reading the first job's input (as a layer's projections
    // of one x do), one of them an empty matrix.
    W.emplace_back(50 * 1024);
    for (auto& w : W.back()) w = ToBf16(d(rng));
    Y.emplace_back(n * 50, NAN);
    alone.emplace_back(n * 50, NAN);
    X.push_back(X[0]);
    jobs.push_back({W.back().data(), 50, 1024, X[0].data(), Y.back().data()});
    shapes.push_back({50, 1024});
    jobs.insert(jobs.begin() + 1, Bf16MatVecJob{nullptr, 0, 1024, X[0].data(), nullptr});
    ForEachVariant("matvec_bf16_many", [&](const KernelSet& k) {
      for (auto& y : Y) std::fill(y.begin(), y.end(), NAN);
      k.matvec_bf16_many(jobs, n);
      for (size_t j = 0; j < shapes.size(); ++j) {
        k.matmul_bf16(W[j].data(), shapes[j].first, shapes[j].second, X[j].data(), n, alone[j].data());
        ASSERT_EQ(std::memcmp(Y[j].data(), alone[j].data(), Y[j].size() * 4), 0) << k.matvec_bf16_many.name << " job " << j;
      }
    });
  }
}

}  // namespace
}  // namespace moeserve::kernels
