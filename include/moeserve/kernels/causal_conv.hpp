// The causal depthwise convolution of Gated DeltaNet's q, k and v (model.md
// 5.3), with its silu, over a block of channels: each output channel is
// silu of a K-tap sum over the last K rows of its input channel.
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <cstddef>

namespace moeserve::kernels {

// out[t * out_stride + i] = silu(sum_{j < K} w[i * K + j] x_{t + j}[i]) for
// t < T and channels i < n, the sum in tap order from 0, where x_u is row u
// of [tail (K - 1 rows, stride tail_stride) ; x (T rows, stride x_stride)]:
// the K - 1 inputs before x, then x. The reference variant of the
// causal_conv_silu family (cpu_kernels.hpp): per channel, scalar silu.
void CausalConvSiluRef(const float* tail, size_t tail_stride, const float* x, size_t x_stride, int T, int n,
                       const float* w, int K, float* out, size_t out_stride);

}  // namespace moeserve::kernels
