// Every CPU kernel variant this machine supports against the plain
// reference, on random and edge-case shapes (sizes off the vector widths, one
// row, one column), single-threaded and through the threaded front doors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::kernels {
namespace {

struct Shape {
  size_t out, in, n;
};

std::vector<float> Random(size_t count, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

// |a - b| within 1e-5 of the sum of |terms| of that dot product (order only).
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& mag,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const float tol = 1e-5f * mag[i] + 1e-30f;
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << " at " << i << ": got " << got[i] << " want " << want[i] << " tol " << tol;
      ++bad;
    }
  }
}

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> s = {
      {1, 32, 1},   {1, 32, 8},    {7, 64, 1},     {33, 96, 3},   {64, 256, 1},  {31, 288, 9},  {17, 512, 17},
      {100, 544, 7}, {65, 320, 8}, {129, 1024, 13}, {48, 2080, 2}, {40, 160, 30}, {3, 32, 64},   {96, 768, 64},
  };
  return s;
}

TEST(CpuKernels, ReportsVariants) {
  std::string names;
  for (CpuIsa isa : SupportedCpuIsas()) names += std::string(CpuIsaName(isa)) + " ";
  std::printf("supported: %s; active: %s; threads: %d\n", names.c_str(), CpuIsaName(ActiveCpuIsa()),
              DefaultThreadPool().size());
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
  EXPECT_TRUE(CpuSupports(ActiveCpuIsa()));
}

TEST(CpuKernels, Mxfp4MatMulEveryVariantMatchesReference) {
  std::mt19937 rng(1234);
  for (const Shape& s : Shapes()) {
    // Weights spanning many scales, including an all-zero block (scale 0).
    std::vector<float> w = Random(s.out * s.in, rng);
    for (size_t i = 0; i < w.size(); ++i) w[i] *= std::ldexp(1.0f, static_cast<int>(i / 32 % 13) - 6);
    for (size_t i = 0; i < 32 && i < w.size(); ++i) w[i] = 0.0f;
    std::vector<uint8_t> blocks(s.out * s.in / 2), scales(s.out * s.in / 32);
    ASSERT_EQ(Mxfp4EncodeMatrix(w.data(), s.out, s.in, blocks.data(), scales.data()), -1);
    std::vector<float> dq(s.out * s.in);
    Mxfp4DecodeMatrix(blocks.data(), scales.data(), s.out, s.in, dq.data());
    std::vector<float> x = Random(s.n * s.in, rng);
    std::vector<float> want(s.n * s.out), mag(s.n * s.out);
    MatMulMxfp4Ref(blocks.data(), scales.data(), s.out, s.in, x.data(), s.n, want.data());
    std::vector<float> absdq(dq.size()), absx(x.size());
    for (size_t i = 0; i < dq.size(); ++i) absdq[i] = std::fabs(dq[i]);
    for (size_t i = 0; i < x.size(); ++i) absx[i] = std::fabs(x[i]);
    MatMulF32Ref(absdq.data(), s.out, s.in, absx.data(), s.n, mag.data());
    for (CpuIsa isa : SupportedCpuIsas()) {
      const std::string what = std::string(CpuIsaName(isa)) + " out=" + std::to_string(s.out) +
                               " in=" + std::to_string(s.in) + " n=" + std::to_string(s.n);
      std::vector<float> got(want.size(), NAN);
      CpuKernels(isa).mxfp4_matmul(blocks.data(), scales.data(), s.out, s.in, x.data(), s.n, got.data(), 0, s.out);
      ExpectClose(got, want, mag, what + " single");
      // A column sub-range leaves the other columns alone.
      if (s.out > 2) {
        std::vector<float> part(want.size(), 7.0f);
        CpuKernels(isa).mxfp4_matmul(blocks.data(), scales.data(), s.out, s.in, x.data(), s.n, part.data(), 1,
                                     s.out - 1);
        for (size_t t = 0; t < s.n; ++t) {
          EXPECT_EQ(part[t * s.out], 7.0f) << what;
          EXPECT_EQ(part[t * s.out + s.out - 1], 7.0f) << what;
          for (size_t o = 1; o + 1 < s.out; ++o)
            ASSERT_LE(std::fabs(part[t * s.out + o] - want[t * s.out + o]), 1e-5f * mag[t * s.out + o] + 1e-30f)
                << what << " range";
        }
      }
      std::vector<float> thr(want.size(), NAN);
      MatMulMxfp4(blocks.data(), scales.data(), s.out, s.in, x.data(), s.n, thr.data(), isa);
      ExpectClose(thr, want, mag, what + " threaded");
    }
  }
}

TEST(CpuKernels, F32MatMulEveryVariantMatchesReference) {
  std::mt19937 rng(99);
  std::vector<Shape> shapes = Shapes();
  for (Shape s : {Shape{1, 1, 1}, Shape{5, 3, 2}, Shape{9, 17, 9}, Shape{33, 100, 11}, Shape{70, 15, 1},
                  Shape{20, 250, 40}, Shape{2, 7, 8}})
    shapes.push_back(s);
  for (const Shape& s : shapes) {
    std::vector<float> w = Random(s.out * s.in, rng), x = Random(s.n * s.in, rng);
    std::vector<float> want(s.n * s.out), mag(s.n * s.out), aw(w.size()), ax(x.size());
    MatMulF32Ref(w.data(), s.out, s.in, x.data(), s.n, want.data());
    for (size_t i = 0; i < w.size(); ++i) aw[i] = std::fabs(w[i]);
    for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
    MatMulF32Ref(aw.data(), s.out, s.in, ax.data(), s.n, mag.data());
    for (CpuIsa isa : SupportedCpuIsas()) {
      const std::string what = std::string(CpuIsaName(isa)) + " out=" + std::to_string(s.out) +
                               " in=" + std::to_string(s.in) + " n=" + std::to_string(s.n);
      std::vector<float> got(want.size(), NAN);
      CpuKernels(isa).f32_matmul(w.data(), s.out, s.in, x.data(), s.n, got.data(), 0, s.out);
      ExpectClose(got, want, mag, what + " single");
      std::vector<float> thr(want.size(), NAN);
      MatMulF32(w.data(), s.out, s.in, x.data(), s.n, thr.data(), isa);
      ExpectClose(thr, want, mag, what + " threaded");
    }
  }
}

TEST(CpuKernels, ZeroInnerDimensionGivesZeros) {
  for (CpuIsa isa : SupportedCpuIsas()) {
    std::vector<float> y(6, NAN);
    MatMulF32(nullptr, 3, 0, nullptr, 2, y.data(), isa);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
}

TEST(CpuKernels, RmsNormEveryVariantMatchesReference) {
  std::mt19937 rng(7);
  for (size_t d : {1, 3, 8, 15, 16, 17, 31, 64, 100, 4096, 7169}) {
    std::vector<float> x = Random(d, rng, 3.0f), w = Random(d, rng), want(d);
    RmsNormRef(x.data(), w.data(), 1e-6f, d, want.data());
    for (CpuIsa isa : SupportedCpuIsas()) {
      std::vector<float> got(d, NAN);
      RmsNorm(x.data(), w.data(), 1e-6f, d, got.data(), isa);
      for (size_t i = 0; i < d; ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * std::fabs(want[i]) + 1e-7f) << CpuIsaName(isa) << " d=" << d << " i=" << i;
    }
  }
}

TEST(ThreadPool, EveryTaskRunsOnceIncludingNestedAndConcurrentCalls) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (size_t n : {0, 1, 2, 5, 100, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](size_t i) {
      hits[i]++;
      // A nested call runs serially instead of deadlocking.
      std::atomic<int> inner{0};
      pool.ParallelFor(3, [&](size_t) { inner++; });
      EXPECT_EQ(inner.load(), 3);
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  }
  // Concurrent callers: one gets the pool, the other runs serially.
  std::atomic<long> total{0};
  std::thread a([&] { for (int r = 0; r < 50; ++r) pool.ParallelFor(64, [&](size_t i) { total += static_cast<long>(i); }); });
  std::thread b([&] { for (int r = 0; r < 50; ++r) pool.ParallelFor(64, [&](size_t i) { total += static_cast<long>(i); }); });
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2L * 50 * (63 * 64 / 2));
}

}  // namespace
}  // namespace moeserve::kernels
