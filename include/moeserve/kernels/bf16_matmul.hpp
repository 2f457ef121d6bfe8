// BF16 weight x fp32 activation: Y[n, out] = X[n, in] * W[out, in]^T with W
// held as BF16 (the checkpoint's dtype), so that decode reads 2 bytes a weight
// instead of 4. Conversion BF16 -> fp32 is exact (a 16-bit shift), so results
// equal the fp32 path on widened weights up to summation order.
//
// The threaded products are the KernelSet families matmul_bf16 and
// matvec_bf16_many (cpu_kernels.hpp): fewer than 8 rows of X, a
// matrix-vector kernel straight from BF16; more, the weights are widened once
// and the fp32 GEMM runs. The reference variants are declared here.
//
// Thread safety: pure functions over caller buffers; the threaded variants
// use the kernel thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>


namespace moeserve::kernels {

void MatMulBf16Ref(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);

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
// MatMulBf16Ref on each job in turn.
void MatVecBf16ManyRef(std::span<const Bf16MatVecJob> jobs, size_t n);

}  // namespace moeserve::kernels
