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

namespace moeserve::kernels {

void MatMulBf16Ref(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);
// Fewer than 8 rows of X: a matrix-vector kernel straight from BF16 (AVX2
// where present); more: the weights are widened once and the fp32 GEMM runs.
void MatMulBf16(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);

}  // namespace moeserve::kernels
