// The matrix-product families (matmul_mxfp4, matvec_mxfp4_many, matmul_f32,
// headwise_matvec, rms_norm and their building blocks), every variant this
// CPU supports, against the plain reference on random and edge-case shapes
// (sizes off the vector widths, one row, one column), single-threaded and
// threaded.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/thread_pool.hpp"

#include "each_variant.hpp"

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

// |a - b| within tol, element by element.
void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& tols,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const float tol = tols[i];
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << " at " << i << ": got " << got[i] << " want " << want[i] << " tol " << tol;
      ++bad;
    }
  }
}

// |a - b| within 1e-5 of the sum of |terms| of that dot product (order only).
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& mag,
                 const std::string& what) {
  std::vector<float> tols(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) tols[i] = 1e-5f * mag[i] + 1e-30f;
  ExpectWithin(got, want, tols, what);
}

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> s = {
      {1, 32, 1},   {1, 32, 8},    {7, 64, 1},     {33, 96, 3},   {64, 256, 1},  {31, 288, 9},  {17, 512, 17},
      {100, 544, 7}, {65, 320, 8}, {129, 1024, 13}, {48, 2080, 2}, {40, 160, 30}, {3, 32, 64},   {96, 768, 64},
      // Past the GEMMs' 2048-long k panels: partial sums carried across panels.
      {33, 2080, 8}, {40, 4160, 9},
  };
  return s;
}

// A random MXFP4 matrix spanning many scales, with an all-zero block
// (scale 0) and, when big enough, blocks at the extreme scales.
struct Mxfp4Case {
  std::vector<uint8_t> blocks, scales;
  std::vector<float> dq;  // the reference dequantisation
};
Mxfp4Case MakeMxfp4(size_t out, size_t in, std::mt19937& rng) {
  std::vector<float> w = Random(out * in, rng);
  for (size_t i = 0; i < w.size(); ++i) w[i] *= std::ldexp(1.0f, static_cast<int>(i / 32 % 13) - 6);
  for (size_t i = 0; i < 32 && i < w.size(); ++i) w[i] = 0.0f;
  Mxfp4Case c;
  c.blocks.resize(out * in / 2);
  c.scales.resize(out * in / 32);
  EXPECT_EQ(Mxfp4EncodeMatrix(w.data(), out, in, c.blocks.data(), c.scales.data()), -1);
  if (c.scales.size() > 3) {
    c.scales[1] = 0;    // 2^-127, a float denormal
    c.scales[2] = 200;  // 2^73
    c.scales[3] = 1;
  }
  c.dq.resize(out * in);
  Mxfp4DecodeMatrix(c.blocks.data(), c.scales.data(), out, in, c.dq.data());
  return c;
}

TEST(Mxfp4Packed, RepackIsLosslessAndDecodesAsTheReference) {
  std::mt19937 rng(77);
  for (const Shape& s : Shapes()) {
    Mxfp4Case c = MakeMxfp4(s.out, s.in, rng);
    Mxfp4PackedStack packed(c.blocks.data(), c.scales.data(), 1, s.out, s.in);
    EXPECT_EQ(packed.bytes(), Mxfp4PackedCodeBytes(s.out, s.in) + Mxfp4PackedScaleBytes(s.out, s.in));
    const Mxfp4PackedView v = packed.matrix(0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.codes) % 64, 0u);
    std::vector<uint8_t> blocks(c.blocks.size()), scales(c.scales.size());
    UnpackMxfp4(v, blocks.data(), scales.data());
    EXPECT_EQ(blocks, c.blocks) << s.out << "x" << s.in;
    EXPECT_EQ(scales, c.scales) << s.out << "x" << s.in;
    std::vector<float> row(s.in);
    for (size_t o = 0; o < s.out; ++o) {
      DecodePackedRow(v, o, 0, s.in / 32, row.data(), 1);
      for (size_t k = 0; k < s.in; ++k)
        ASSERT_EQ(std::memcmp(&row[k], &c.dq[o * s.in + k], 4), 0) << "row " << o << " k " << k;
    }
    // Padding rows of the last group are zero codes.
    const size_t nb = s.in / 32, g = Mxfp4PackedGroups(s.out) - 1;
    for (size_t r = s.out - g * 16; r < 16; ++r)
      for (size_t b = 0; b < nb; ++b)
        for (size_t cc = 0; cc < 4; ++cc)
          for (size_t j = 0; j < 4; ++j) ASSERT_EQ(v.codes[(g * nb + b) * 256 + cc * 64 + r * 4 + j], 0);
  }
  // A stack keeps each matrix at its own offset.
  Mxfp4Case a = MakeMxfp4(20, 64, rng), b = MakeMxfp4(20, 64, rng);
  std::vector<uint8_t> blocks = a.blocks, scales = a.scales;
  blocks.insert(blocks.end(), b.blocks.begin(), b.blocks.end());
  scales.insert(scales.end(), b.scales.begin(), b.scales.end());
  Mxfp4PackedStack stack(blocks.data(), scales.data(), 2, 20, 64);
  std::vector<uint8_t> ub(b.blocks.size()), us(b.scales.size());
  UnpackMxfp4(stack.matrix(1), ub.data(), us.data());
  EXPECT_EQ(ub, b.blocks);
  EXPECT_EQ(us, b.scales);
}

// Bound on the matrix-vector products' error: the activation rounding (half
// a step of max|x| / 2^20 per element, per block) times the weights, plus
// fp32 order.
std::vector<float> QuantisationBound(const std::vector<float>& dq, const std::vector<float>& x, size_t out, size_t in,
                                     size_t n, const std::vector<float>& mag) {
  std::vector<float> bound(n * out);
  for (size_t t = 0; t < n; ++t)
    for (size_t o = 0; o < out; ++o) {
      double e = 0.0;
      for (size_t b = 0; b < in / 32; ++b) {
        double amax = 0.0, wsum = 0.0;
        for (size_t k = b * 32; k < b * 32 + 32; ++k) {
          amax = std::max(amax, static_cast<double>(std::fabs(x[t * in + k])));
          wsum += std::fabs(dq[o * in + k]);
        }
        e += wsum * amax * (0.5 / 1048576.0) * 1.001;
      }
      bound[t * out + o] = static_cast<float>(e) + 1e-5f * mag[t * out + o] + 1e-30f;
    }
  return bound;
}

TEST(CpuKernels, Mxfp4MatMulEveryVariantMatchesReference) {
  std::mt19937 rng(1234);
  for (const Shape& s : Shapes()) {
    Mxfp4Case c = MakeMxfp4(s.out, s.in, rng);
    Mxfp4PackedStack packed(c.blocks.data(), c.scales.data(), 1, s.out, s.in);
    const Mxfp4PackedView v = packed.matrix(0);
    std::vector<float> x = Random(s.n * s.in, rng);
    // An activation block of zeros and one with a single outlier.
    for (size_t k = 0; k < 32 && s.in >= 64; ++k) x[32 + k] = 0.0f;
    if (s.in >= 96) x[70] = 300.0f;
    std::vector<float> want(s.n * s.out), mag(s.n * s.out);
    MatMulMxfp4Ref(c.blocks.data(), c.scales.data(), s.out, s.in, x.data(), s.n, want.data());
    std::vector<float> absdq(c.dq.size()), absx(x.size());
    for (size_t i = 0; i < c.dq.size(); ++i) absdq[i] = std::fabs(c.dq[i]);
    for (size_t i = 0; i < x.size(); ++i) absx[i] = std::fabs(x[i]);
    MatMulF32Ref(absdq.data(), s.out, s.in, absx.data(), s.n, mag.data());
    const bool gemm = s.n >= kMxfp4GemmMinRows;
    const std::vector<float> bound = gemm ? std::vector<float>() : QuantisationBound(c.dq, x, s.out, s.in, s.n, mag);
    Mxfp4ActivationBuffer buffer;
    const KernelSet& scalar = Kernels(Isa::kScalar);
    const Mxfp4Activations& xq = buffer.Quantize(x.data(), s.n, s.in, scalar.mxfp4_quantize.fn);
    // Every variant's quantiser writes the same bytes.
    ForEachVariant("mxfp4_quantize", [&](const KernelSet& k) {
      Mxfp4ActivationBuffer other;
      const Mxfp4Activations& oq = other.Quantize(x.data(), s.n, s.in, k.mxfp4_quantize.fn);
      const size_t nb = s.n * s.in / 32;
      ASSERT_EQ(std::memcmp(oq.parts, xq.parts, s.n * kMxfp4ActParts * s.in), 0) << k.mxfp4_quantize.name;
      ASSERT_EQ(std::memcmp(oq.scale, xq.scale, nb * 4), 0) << k.mxfp4_quantize.name;
      ASSERT_EQ(std::memcmp(oq.offset, xq.offset, nb * 4), 0) << k.mxfp4_quantize.name;
    });
    // The scalar building block, which every other variant must equal bit for bit.
    std::vector<float> scalar_matvec(want.size(), NAN);
    if (!gemm) scalar.mxfp4_matvec(v, xq, scalar_matvec.data(), 0, Mxfp4PackedGroups(s.out), 0, s.in / 32);
    ForEachVariant("mxfp4_gemm, mxfp4_matvec, matmul_mxfp4", [&](const KernelSet& k) {
      const std::string what = std::string(IsaName(k.isa)) + " out=" + std::to_string(s.out) +
                               " in=" + std::to_string(s.in) + " n=" + std::to_string(s.n);
      if (gemm) {
        std::vector<float> got(want.size(), NAN);
        k.mxfp4_gemm(v, x.data(), s.n, got.data(), 0, s.out);
        ExpectClose(got, want, mag, what + " gemm");
        // A column sub-range leaves the other columns alone.
        if (s.out > 2) {
          std::vector<float> part(want.size(), 7.0f);
          k.mxfp4_gemm(v, x.data(), s.n, part.data(), 1, s.out - 1);
          for (size_t t = 0; t < s.n; ++t) {
            EXPECT_EQ(part[t * s.out], 7.0f) << what;
            EXPECT_EQ(part[t * s.out + s.out - 1], 7.0f) << what;
            for (size_t o = 1; o + 1 < s.out; ++o)
              ASSERT_LE(std::fabs(part[t * s.out + o] - want[t * s.out + o]), 1e-5f * mag[t * s.out + o] + 1e-30f)
                  << what << " range";
          }
        }
      } else {
        // Every variant computes the same integers and scales them in the same
        // order: bit-identical to the scalar variant, and within the
        // quantisation bound of the reference.
        std::vector<float> got(want.size(), NAN);
        const size_t nb = s.in / 32;
        k.mxfp4_matvec(v, xq, got.data(), 0, Mxfp4PackedGroups(s.out), 0, nb);
        ASSERT_EQ(std::memcmp(got.data(), scalar_matvec.data(), got.size() * 4), 0) << what << " vs scalar";
        ExpectWithin(got, want, bound, what + " matvec");
        // In k-chunks (continuing Y's sums): the same bits.
        std::vector<float> chunked(want.size(), NAN);
        for (size_t b0 = 0; b0 < nb; b0 += 3)
          k.mxfp4_matvec(v, xq, chunked.data(), 0, Mxfp4PackedGroups(s.out), b0, std::min(nb, b0 + 3));
        ASSERT_EQ(std::memcmp(got.data(), chunked.data(), got.size() * 4), 0) << what << " chunked";
        // A group sub-range leaves the other groups' rows alone.
        if (s.out > 32) {
          std::vector<float> part(want.size(), 7.0f);
          k.mxfp4_matvec(v, xq, part.data(), 1, 2, 0, s.in / 32);
          for (size_t t = 0; t < s.n; ++t)
            for (size_t o = 0; o < s.out; ++o) {
              if (o >= 16 && o < 32) ASSERT_EQ(part[t * s.out + o], got[t * s.out + o]) << what;
              else ASSERT_EQ(part[t * s.out + o], 7.0f) << what << " row " << o;
            }
        }
      }
      std::vector<float> thr(want.size(), NAN);
      k.matmul_mxfp4(v, x.data(), s.n, thr.data());
      if (gemm) ExpectClose(thr, want, mag, what + " threaded");
      else ExpectWithin(thr, want, bound, what + " threaded");
    });
  }
}

TEST(CpuKernels, Mxfp4ManyJobsEqualEachAloneBitForBit) {
  std::mt19937 rng(11);
  // The last job reads the first one's input (as a decode step's experts share
  // x): one quantised copy serves both.
  const std::vector<Shape> shapes = {{768, 1024, 1}, {40, 96, 3}, {1024, 384, 1}, {17, 2080, 7}, {5, 32, 2}, {256, 1024, 1}};
  std::vector<Mxfp4PackedStack> packed;
  std::vector<std::vector<float>> X, Y, alone;
  for (const Shape& s : shapes) {
    Mxfp4Case c = MakeMxfp4(s.out, s.in, rng);
    packed.emplace_back(c.blocks.data(), c.scales.data(), 1, s.out, s.in);
    X.push_back(Random(s.n * s.in, rng));
    Y.emplace_back(s.n * s.out, NAN);
    alone.emplace_back(s.n * s.out, NAN);
  }
  std::vector<Mxfp4MatVecJob> jobs;
  X.back() = X.front();
  for (size_t j = 0; j < shapes.size(); ++j) {
    const float* x = j + 1 == shapes.size() ? X[0].data() : X[j].data();
    jobs.push_back({packed[j].matrix(0), x, shapes[j].n, Y[j].data()});
  }
  ForEachVariant("matvec_mxfp4_many", [&](const KernelSet& k) {
    for (auto& y : Y) std::fill(y.begin(), y.end(), NAN);
    k.matvec_mxfp4_many(jobs);
    for (size_t j = 0; j < shapes.size(); ++j) {
      k.matmul_mxfp4(packed[j].matrix(0), X[j].data(), shapes[j].n, alone[j].data());
      ASSERT_EQ(std::memcmp(Y[j].data(), alone[j].data(), Y[j].size() * 4), 0) << k.matvec_mxfp4_many.name << " job " << j;
    }
  });
}

TEST(CpuKernels, Mxfp4MatVecCarriesNonFiniteActivations) {
  std::mt19937 rng(5);
  Mxfp4Case c = MakeMxfp4(40, 96, rng);
  Mxfp4PackedStack packed(c.blocks.data(), c.scales.data(), 1, 40, 96);
  std::vector<float> x = Random(96, rng);
  x[40] = NAN;
  ForEachVariant("matmul_mxfp4", [&](const KernelSet& k) {
    std::vector<float> y(40, 0.0f);
    k.matmul_mxfp4(packed.matrix(0), x.data(), 1, y.data());
    for (float v : y) EXPECT_TRUE(std::isnan(v)) << k.matmul_mxfp4.name;
  });
}

TEST(CpuKernels, F32MatMulEveryVariantMatchesReference) {
  std::mt19937 rng(99);
  std::vector<Shape> shapes = Shapes();
  // The AVX-512 set's GEMM from 65 rows: its panels (16 x 16 transposes)
  // with ragged columns, elements and k chunks (2080 > 2048).
  for (Shape s : {Shape{1, 1, 1}, Shape{5, 3, 2}, Shape{9, 17, 9}, Shape{33, 100, 11}, Shape{70, 15, 1},
                  Shape{20, 250, 40}, Shape{2, 7, 8}, Shape{70, 15, 65}, Shape{33, 2080, 70}, Shape{100, 33, 130}})
    shapes.push_back(s);
  for (const Shape& s : shapes) {
    std::vector<float> w = Random(s.out * s.in, rng), x = Random(s.n * s.in, rng);
    std::vector<float> want(s.n * s.out), mag(s.n * s.out), aw(w.size()), ax(x.size());
    MatMulF32Ref(w.data(), s.out, s.in, x.data(), s.n, want.data());
    for (size_t i = 0; i < w.size(); ++i) aw[i] = std::fabs(w[i]);
    for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
    MatMulF32Ref(aw.data(), s.out, s.in, ax.data(), s.n, mag.data());
    ForEachVariant("f32_matmul_cols, matmul_f32", [&](const KernelSet& k) {
      const std::string what = std::string(IsaName(k.isa)) + " out=" + std::to_string(s.out) +
                               " in=" + std::to_string(s.in) + " n=" + std::to_string(s.n);
      std::vector<float> got(want.size(), NAN);
      k.f32_matmul_cols(w.data(), s.out, s.in, x.data(), s.n, got.data(), 0, s.out);
      ExpectClose(got, want, mag, what + " single");
      std::vector<float> thr(want.size(), NAN);
      k.matmul_f32(w.data(), s.out, s.in, x.data(), s.n, thr.data());
      ExpectClose(thr, want, mag, what + " threaded");
    });
  }
}

TEST(CpuKernels, HeadwiseMatVecEveryVariantMatchesPlainLoops) {
  std::mt19937 rng(21);
  struct Case {
    size_t heads, rows, cols, head_stride, x_stride, y_stride;
  };
  // MLA's two uses (W_uk^T: kvl x nope per head; W_uv inside wkv_b: vd rows
  // of kvl, heads nope + vd rows apart), and odd sizes.
  for (const Case& c : {Case{8, 256, 64, 256 * 64, 96, 256}, Case{8, 64, 256, 128 * 256, 256, 64},
                        Case{3, 7, 33, 7 * 33 + 5, 40, 9}, Case{1, 1, 1, 1, 1, 1}, Case{16, 128, 512, 128 * 512, 512, 128}}) {
    std::vector<float> W = Random(c.heads * c.head_stride, rng), X = Random(c.heads * c.x_stride, rng);
    std::vector<float> want(c.heads * c.y_stride, 0.0f), tol(want.size(), 1e-30f);
    for (size_t h = 0; h < c.heads; ++h)
      for (size_t r = 0; r < c.rows; ++r) {
        double acc = 0, mag = 0;
        for (size_t k = 0; k < c.cols; ++k) {
          const double p = static_cast<double>(W[h * c.head_stride + r * c.cols + k]) * X[h * c.x_stride + k];
          acc += p;
          mag += std::fabs(p);
        }
        want[h * c.y_stride + r] = static_cast<float>(acc);
        tol[h * c.y_stride + r] = 1e-5f * static_cast<float>(mag) + 1e-30f;
      }
    ForEachVariant("headwise_matvec", [&](const KernelSet& k) {
      std::vector<float> got(want.size(), 0.0f);
      k.headwise_matvec(W.data(), c.heads, c.rows, c.cols, c.head_stride, X.data(), c.x_stride, got.data(), c.y_stride);
      ExpectWithin(got, want, tol, std::string(k.headwise_matvec.name) + " " + std::to_string(c.rows) + "x" +
                                       std::to_string(c.cols));
    });
  }
}

TEST(CpuKernels, ZeroInnerDimensionGivesZeros) {
  ForEachVariant("matmul_f32", [](const KernelSet& k) {
    std::vector<float> y(6, NAN);
    k.matmul_f32(nullptr, 3, 0, nullptr, 2, y.data());
    for (float v : y) EXPECT_EQ(v, 0.0f) << k.matmul_f32.name;
  });
}

TEST(CpuKernels, RmsNormEveryVariantMatchesReference) {
  std::mt19937 rng(7);
  for (size_t d : {1, 3, 8, 15, 16, 17, 31, 64, 100, 4096, 7169}) {
    std::vector<float> x = Random(d, rng, 3.0f), w = Random(d, rng), want(d);
    RmsNormRef(x.data(), w.data(), 1e-6f, d, want.data());
    ForEachVariant("rms_norm", [&](const KernelSet& k) {
      std::vector<float> got(d, NAN);
      k.rms_norm(x.data(), w.data(), 1e-6f, d, got.data());
      for (size_t i = 0; i < d; ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * std::fabs(want[i]) + 1e-7f) << k.rms_norm.name << " d=" << d << " i=" << i;
    });
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
