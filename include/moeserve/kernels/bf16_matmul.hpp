// BF16 weight x fp32 activation: Y[n, out] = X[n, in] * W[out, in]^T with W
// held as BF16 (the checkpoint's dtype), so that decode reads 2 bytes a weight
// instead of 4. Conversion BF16 -> fp32 is exact (a 16-bit shift), so results
// equal the fp32 path on widened weights up to summation order.
//
// Thread safety: pure functions over caller buffers; MatMulBf16 uses the
// kernel thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::kernels {

void MatMulBf16Ref(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);
// Fewer than 8 rows of X: a matrix-vector kernel straight from BF16 (scalar,
// AVX2 or AVX-512 by isa); more: the weights are widened once and the fp32
// GEMM runs.
void MatMulBf16(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                CpuIsa isa = ActiveCpuIsa());

// Several matrix-vector products (n < 8 rows of X each) in one parallel
// pass: a decode step's projections of one input are each only a few hundred
// KiB to a few MiB, and one hand-off to the pool per product costs more than
// the imbalance of sharing one.
struct Bf16MatVecJob {
  const uint16_t* W;  // [out, in]
  size_t out, in;
  const float* X;  // [n, in]
  float* Y;        // [n, out]
};
void MatVecBf16Many(std::span<const Bf16MatVecJob> jobs, size_t n, CpuIsa isa = ActiveCpuIsa());

}  // namespace moeserve::kernels
