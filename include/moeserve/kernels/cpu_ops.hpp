// Plain reference CPU kernels over plain fp32 buffers: the ground truth every
// optimised variant is tested against, and the entries of the reference
// KernelSet (cpu_kernels.hpp). Row-major; a matrix W [out, in]
// computes y = W x (the checkpoint's convention).
//
// Thread safety: pure functions; callers may run them concurrently on
// disjoint outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeserve::kernels {

// Y[n, out] = X[n, in] * W[out, in]^T
void MatMulF32Ref(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y);

// Per head h < heads: Y[h * y_stride + r] = sum_c W[h * head_stride + r * cols + c]
// * X[h * x_stride + c] for r < rows (the headwise_matvec family's reference).
void HeadwiseMatVecRef(const float* W, size_t heads, size_t rows, size_t cols, size_t head_stride, const float* X,
                       size_t x_stride, float* Y, size_t y_stride);

// Y[n, out] = X[n, in] * dequant(W)^T for an MXFP4 matrix in the on-disk
// layout (blocks [out, in/32, 16], scales [out, in/32]).
void MatMulMxfp4Ref(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, const float* X, size_t n,
                    float* Y);

// y = w * x / sqrt(mean(x^2) + eps), over one row of length d.
void RmsNormRef(const float* x, const float* w, float eps, size_t d, float* y);

// LayerNorm with weight and bias (biased variance), over one row.
void LayerNormRef(const float* x, const float* w, const float* b, float eps, size_t d, float* y);

// In-place softmax over one row; -inf entries get probability 0.
void SoftmaxRef(float* x, size_t d);

inline float Silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
inline float Sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
// As torch.nn.functional.softplus (beta 1, threshold 20).
inline float Softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

}  // namespace moeserve::kernels
