// causal_conv_silu (causal_conv.hpp): the reference, and one vector body for
// the other variants. The reference runs each channel over time; the vector
// body runs a row's channels W at a time (rows are channel-contiguous), each
// lane's sum in the same tap order, then silu with the vector exp
// (vector_ext.hpp).
#include "moeserve/kernels/causal_conv.hpp"

#include <vector>

#include "moeserve/kernels/cpu_ops.hpp"
#include "variants.hpp"
#include "vector_ext.hpp"

namespace moeserve::kernels {

namespace {

// Row u of [tail ; x].
[[gnu::always_inline]] inline const float* ConvRow(const float* tail, size_t tail_stride, const float* x,
                                                   size_t x_stride, int K, int u) {
  return u < K - 1 ? tail + static_cast<size_t>(u) * tail_stride : x + static_cast<size_t>(u - (K - 1)) * x_stride;
}

// Channels [i0, i1), one at a time.
[[gnu::always_inline]] inline void ConvScalar(const float* tail, size_t tail_stride, const float* x, size_t x_stride,
                                              int T, int i0, int i1, const float* w, int K, float* out,
                                              size_t out_stride) {
  for (int i = i0; i < i1; ++i)
    for (int t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int j = 0; j < K; ++j) acc += w[static_cast<size_t>(i) * K + j] * ConvRow(tail, tail_stride, x, x_stride, K, t + j)[i];
      out[static_cast<size_t>(t) * out_stride + i] = Silu(acc);
    }
}

constexpr int kConvPrefetchRows = 12;

template <int W>
[[gnu::always_inline]] inline void ConvVector(const float* tail, size_t tail_stride, const float* x, size_t x_stride,
                                              int T, int n, const float* w, int K, float* out, size_t out_stride) {
  using V = typename cpu::vec::Of<W>::F;
  const int body = n / W * W;
  // The taps as [K, n]: tap j of W adjacent channels is one vector.
  std::vector<float> taps(static_cast<size_t>(K) * body);
  for (int i = 0; i < body; ++i)
    for (int j = 0; j < K; ++j) taps[static_cast<size_t>(j) * body + i] = w[static_cast<size_t>(i) * K + j];
  // Rows in order, all channels of a row before the next: each input row is
  // read K times while it is in L1, and rows stream (a channel block over
  // all rows would stride by the row width, which caches badly at the
  // power-of-two widths of the layer).
  for (int t = 0; t < T; ++t) {
    float* o = out + static_cast<size_t>(t) * out_stride;
    // The input row kConvPrefetchRows ahead: rows are a stride apart, which
    // the hardware prefetchers do not follow far enough.
    if (t + kConvPrefetchRows < T)
      for (int i = 0; i < n; i += 16) __builtin_prefetch(x + static_cast<size_t>(t + kConvPrefetchRows) * x_stride + i);
    for (int i0 = 0; i0 < body; i0 += W) {
      V acc{};
      for (int j = 0; j < K; ++j) {
        V tap, in;
        cpu::vec::Load(tap, &taps[static_cast<size_t>(j) * body + i0]);
        cpu::vec::Load(in, ConvRow(tail, tail_stride, x, x_stride, K, t + j) + i0);
        acc += tap * in;
      }
      // silu(a) = a / (1 + e^{-a})
      V e = V{} - acc;
      cpu::vec::ExpInPlace<W>(e);
      cpu::vec::Store(o + i0, acc / (e + 1.0f));
    }
  }
  ConvScalar(tail, tail_stride, x, x_stride, T, body, n, w, K, out, out_stride);
}

}  // namespace

void CausalConvSiluRef(const float* tail, size_t tail_stride, const float* x, size_t x_stride, int T, int n,
                       const float* w, int K, float* out, size_t out_stride) {
  ConvScalar(tail, tail_stride, x, x_stride, T, 0, n, w, K, out, out_stride);
}

namespace cpu {

void causal_conv_silu_scalar(const float* tail, size_t tail_stride, const float* x, size_t x_stride, int T, int n,
                             const float* w, int K, float* out, size_t out_stride) {
  ConvVector<4>(tail, tail_stride, x, x_stride, T, n, w, K, out, out_stride);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void causal_conv_silu_avx2(const float* tail, size_t tail_stride, const float* x,
                                                               size_t x_stride, int T, int n, const float* w, int K,
                                                               float* out, size_t out_stride) {
  ConvVector<8>(tail, tail_stride, x, x_stride, T, n, w, K, out, out_stride);
}
__attribute__((target("avx512f,fma"))) void causal_conv_silu_avx512(const float* tail, size_t tail_stride,
                                                                    const float* x, size_t x_stride, int T, int n,
                                                                    const float* w, int K, float* out,
                                                                    size_t out_stride) {
  ConvVector<16>(tail, tail_stride, x, x_stride, T, n, w, K, out, out_stride);
}
#endif

}  // namespace cpu
}  // namespace moeserve::kernels
