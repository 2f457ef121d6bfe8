// Scalar variants (the reference loops restricted to a column range), the
// runtime dispatch, and the threaded front doors of cpu_kernels.hpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels {
namespace cpu {

float* AllocScratch(size_t floats) {
  return static_cast<float*>(::operator new(std::max<size_t>(floats, 1) * sizeof(float), std::align_val_t(64)));
}
void FreeScratch(float* p) { ::operator delete(p, std::align_val_t(64)); }

void mxfp4_matvec_scalar(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                         size_t g_end, size_t b_begin, size_t b_end) {
  // Twice the E2M1 value of each code, so every product is an integer.
  static constexpr int32_t kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const size_t nb = w.in / 32;
  for (size_t g = g_begin; g < g_end; ++g) {
    const size_t rows = std::min(kMxfp4PackRows, w.out - g * kMxfp4PackRows);
    for (size_t t = 0; t < x.n; ++t) {
      const int8_t* hi = x.part(t, 0);
      const int8_t* mid = x.part(t, 1);
      const int8_t* lo = x.part(t, 2);
      float* out = Y + t * w.out + g * kMxfp4PackRows;
      float y[kMxfp4PackRows] = {};
      if (b_begin > 0)
        for (size_t r = 0; r < rows; ++r) y[r] = out[r];
      for (size_t b = b_begin; b < b_end; ++b) {
        const uint8_t* codes = w.codes + (g * nb + b) * 256;
        const uint8_t* scales = w.scales + (g * nb + b) * 16;
        int32_t d[kMxfp4PackRows] = {};
        for (size_t c = 0; c < 4; ++c)
          for (size_t r = 0; r < kMxfp4PackRows; ++r)
            for (size_t j = 0; j < 4; ++j) {
              const uint8_t byte = codes[c * 64 + r * 4 + j];
              const size_t k = b * 32 + c * 8 + j;
              const int32_t q0 = 16384 * hi[k] + 128 * mid[k] + lo[k];
              const int32_t q1 = 16384 * hi[k + 4] + 128 * mid[k + 4] + lo[k + 4];
              d[r] += kTwice[byte & 15] * q0 + kTwice[byte >> 4] * q1;
            }
        const float as = x.scale[t * nb + b];
        for (size_t r = 0; r < kMxfp4PackRows; ++r)
          y[r] = std::fma(static_cast<float>(d[r]), kE8M0.v[scales[r]] * as, y[r]);
      }
      for (size_t r = 0; r < rows; ++r) out[r] = y[r];
    }
  }
}

void mxfp4_gemm_scalar(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, size_t o_begin, size_t o_end) {
  float* row = AllocScratch(w.in);
  for (size_t o = o_begin; o < o_end; ++o) {
    DecodePackedRow(w, o, 0, w.in / 32, row, 1);
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * w.in;
      float acc = 0.0f;
      for (size_t i = 0; i < w.in; ++i) acc += row[i] * x[i];
      Y[t * w.out + o] = acc;
    }
  }
  FreeScratch(row);
}

void f32_matmul_scalar(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin,
                       size_t o_end) {
  for (size_t t = 0; t < n; ++t)
    for (size_t o = o_begin; o < o_end; ++o) {
      const float* w = W + o * in;
      const float* x = X + t * in;
      float acc = 0.0f;
      for (size_t i = 0; i < in; ++i) acc += w[i] * x[i];
      Y[t * out + o] = acc;
    }
}

void rms_norm_scalar(const float* x, const float* w, float eps, size_t d, float* y) { RmsNormRef(x, w, eps, d, y); }

}  // namespace cpu

namespace {

bool Detect(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
             __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

const CpuKernelSet kSets[3] = {
    {CpuIsa::kScalar, cpu::mxfp4_quantize_scalar, cpu::mxfp4_matvec_scalar, cpu::mxfp4_gemm_scalar, cpu::f32_matmul_scalar, cpu::rms_norm_scalar},
    {CpuIsa::kAvx2, cpu::mxfp4_quantize_scalar, cpu::mxfp4_matvec_avx2, cpu::mxfp4_gemm_avx2, cpu::f32_matmul_avx2, cpu::rms_norm_avx2},
    {CpuIsa::kAvx512, cpu::mxfp4_quantize_avx512, cpu::mxfp4_matvec_avx512, cpu::mxfp4_gemm_avx512, cpu::f32_matmul_avx512,
     cpu::rms_norm_avx512},
};

// Splits columns [0, out) into tasks: for the GEMM, one contiguous range per
// thread (aligned to 32 columns, the packed strip width); for matrix-vector
// products, small dynamic chunks.
template <class Fn>
void ParallelColumns(size_t out, size_t n, size_t in, Fn fn) {
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  const double work = static_cast<double>(out) * static_cast<double>(in) * static_cast<double>(n);
  if (threads == 1 || work < 65536.0) {
    fn(0, out);
    return;
  }
  size_t chunk;
  if (n >= cpu::kGemmMinRows) {
    chunk = (out + threads - 1) / threads;
    chunk = (chunk + 31) / 32 * 32;
  } else {
    chunk = std::max<size_t>(16, out / (threads * 8));
    chunk = (chunk + 15) / 16 * 16;
  }
  const size_t tasks = (out + chunk - 1) / chunk;
  pool.ParallelFor(tasks, [&](size_t i) { fn(i * chunk, std::min(out, (i + 1) * chunk)); });
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool CpuSupports(CpuIsa isa) {
  static const bool supported[3] = {Detect(CpuIsa::kScalar), Detect(CpuIsa::kAvx2), Detect(CpuIsa::kAvx512)};
  return supported[static_cast<int>(isa)];
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (CpuSupports(isa)) v.push_back(isa);
  return v;
}

CpuIsa ActiveCpuIsa() {
  static const CpuIsa active = [] {
    CpuIsa best = CpuIsa::kScalar;
    for (CpuIsa isa : SupportedCpuIsas()) best = isa;
    if (const char* env = std::getenv("MOESERVE_CPU_ISA")) {
      std::string_view want(env);
      for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512})
        if (want == CpuIsaName(isa) && static_cast<int>(isa) < static_cast<int>(best)) best = isa;
    }
    return best;
  }();
  return active;
}

const CpuKernelSet& CpuKernels(CpuIsa isa) {
  if (!CpuSupports(isa)) isa = CpuIsa::kScalar;
  return kSets[static_cast<int>(isa)];
}

void MatMulF32(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, CpuIsa isa) {
  if (out == 0 || n == 0) return;
  if (in == 0) return std::fill(Y, Y + out * n, 0.0f);
  F32MatMulFn fn = CpuKernels(isa).f32_matmul;
  ParallelColumns(out, n, in, [&](size_t o0, size_t o1) { fn(W, out, in, X, n, Y, o0, o1); });
}

void HeadwiseMatVec(const float* W, size_t heads, size_t rows, size_t cols, size_t head_stride, const float* X,
                    size_t x_stride, float* Y, size_t y_stride, CpuIsa isa) {
  const F32MatMulFn fn = CpuKernels(isa).f32_matmul;
  auto head = [&](size_t h) { fn(W + h * head_stride, rows, cols, X + h * x_stride, 1, Y + h * y_stride, 0, rows); };
  ThreadPool& pool = DefaultThreadPool();
  if (pool.size() == 1 || heads < 2 || static_cast<double>(heads) * rows * cols < 65536.0) {
    for (size_t h = 0; h < heads; ++h) head(h);
    return;
  }
  pool.ParallelFor(heads, head);
}

void RmsNorm(const float* x, const float* w, float eps, size_t d, float* y, CpuIsa isa) {
  CpuKernels(isa).rms_norm(x, w, eps, d, y);
}

}  // namespace moeserve::kernels
