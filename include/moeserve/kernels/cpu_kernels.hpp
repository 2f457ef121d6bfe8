// Optimised CPU kernels, a family per operation as ggml does it: a scalar
// variant, an AVX2+FMA variant and an AVX-512 (F/BW/VL/DQ + VNNI, VBMI) variant
// with one signature,
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

struct Mxfp4PackedView;   // mxfp4_packed.hpp
struct Mxfp4Activations;

// Single-threaded variants compute output columns [o_begin, o_end) of Y for
// all n rows of X (Y's other columns are left alone). The MXFP4
// matrix-vector form works on whole 16-row groups [g_begin, g_end) of the
// packed layout and on pre-quantised activations (see mxfp4_packed.hpp), over
// the 32-element blocks [b_begin, b_end) of each row: from b_begin > 0 it
// continues the sums Y already holds (so a row can be done in k-chunks whose
// activations stay in L1, with the same result bit for bit).
using Mxfp4MatVecFn = void (*)(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                               size_t g_end, size_t b_begin, size_t b_end);
// Quantises n rows of `in` activations for the MXFP4 matrix-vector form
// (see Mxfp4Activations); every variant writes the same bytes.
using Mxfp4QuantizeFn = void (*)(const float* X, size_t n, size_t in, int8_t* parts, float* scale,
                                 int32_t* offset);
using Mxfp4GemmFn = void (*)(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, size_t o_begin,
                             size_t o_end);
using F32MatMulFn = void (*)(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                             size_t o_begin, size_t o_end);
using RmsNormFn = void (*)(const float* x, const float* w, float eps, size_t d, float* y);

struct CpuKernelSet {
  CpuIsa isa;
  Mxfp4QuantizeFn mxfp4_quantize;
  Mxfp4MatVecFn mxfp4_matvec;
  Mxfp4GemmFn mxfp4_gemm;
  F32MatMulFn f32_matmul;
  RmsNormFn rms_norm;
};

// The variant set for isa (which must be supported).
const CpuKernelSet& CpuKernels(CpuIsa isa);

// Threaded front doors (parallel over output columns); MXFP4's is in
// mxfp4_packed.hpp.
void MatMulF32(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y,
               CpuIsa isa = ActiveCpuIsa());
// Per head h < heads: Y[h * y_stride + r] = sum_c W[h * head_stride + r * cols + c]
// * X[h * x_stride + c] for r < rows (a small matrix-vector product per head,
// as MLA's absorbed decode needs twice per query). Heads run in parallel when
// the work is large enough.
void HeadwiseMatVec(const float* W, size_t heads, size_t rows, size_t cols, size_t head_stride, const float* X,
                    size_t x_stride, float* Y, size_t y_stride, CpuIsa isa = ActiveCpuIsa());
// One row; single-threaded (rows are short).
void RmsNorm(const float* x, const float* w, float eps, size_t d, float* y, CpuIsa isa = ActiveCpuIsa());

}  // namespace moeserve::kernels
