// Optimised CPU kernels, a family per operation as ggml does it: a scalar
// variant, an AVX2+FMA variant and an AVX-512 variant with one signature,
// the best one this CPU supports chosen once at start-up (MOESERVE_CPU_ISA =
// scalar|avx2|avx512 caps it). Each family is tested variant by variant
// against the plain reference in cpu_ops.hpp.
//
// Conventions as cpu_ops.hpp: row-major, W [out, in], Y[n, out] = X[n, in] W^T.
// Results differ from the reference only by fp32 summation order.
//
// Thread safety: pure functions over caller buffers; the threaded front doors
// share DefaultThreadPool() (see thread_pool.hpp) and may be called from any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moeserve::kernels {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* CpuIsaName(CpuIsa isa);
// Whether this CPU (and this build) can run the variant.
bool CpuSupports(CpuIsa isa);
// Every variant this CPU can run, scalar first.
std::vector<CpuIsa> SupportedCpuIsas();
// The variant the front doors use: the best supported, capped by
// MOESERVE_CPU_ISA; chosen once.
CpuIsa ActiveCpuIsa();

// Single-threaded variants compute output columns [o_begin, o_end) of Y for
// all n rows of X (Y's other columns are left alone).
using Mxfp4MatMulFn = void (*)(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, const float* X,
                               size_t n, float* Y, size_t o_begin, size_t o_end);
using F32MatMulFn = void (*)(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                             size_t o_begin, size_t o_end);
using RmsNormFn = void (*)(const float* x, const float* w, float eps, size_t d, float* y);

struct CpuKernelSet {
  CpuIsa isa;
  Mxfp4MatMulFn mxfp4_matmul;
  F32MatMulFn f32_matmul;
  RmsNormFn rms_norm;
};

// The variant set for isa (which must be supported).
const CpuKernelSet& CpuKernels(CpuIsa isa);

// Threaded front doors (parallel over output columns). MXFP4: in % 32 == 0,
// blocks [out, in/32, 16] and scales [out, in/32] in the on-disk layout.
void MatMulMxfp4(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, const float* X, size_t n,
                 float* Y, CpuIsa isa = ActiveCpuIsa());
void MatMulF32(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y,
               CpuIsa isa = ActiveCpuIsa());
// One row; single-threaded (rows are short).
void RmsNorm(const float* x, const float* w, float eps, size_t d, float* y, CpuIsa isa = ActiveCpuIsa());

}  // namespace moeserve::kernels
