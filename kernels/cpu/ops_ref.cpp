#include <cmath>
#include <limits>
#include <vector>

#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::kernels {

void MatMulF32Ref(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  for (size_t t = 0; t < n; ++t) {
    const float* x = X + t * in;
    float* y = Y + t * out;
    for (size_t o = 0; o < out; ++o) {
      const float* w = W + o * in;
      float acc = 0.0f;
      for (size_t i = 0; i < in; ++i) acc += w[i] * x[i];
      y[o] = acc;
    }
  }
}

void HeadwiseMatVecRef(const float* W, size_t heads, size_t rows, size_t cols, size_t head_stride, const float* X,
                       size_t x_stride, float* Y, size_t y_stride) {
  for (size_t h = 0; h < heads; ++h) MatMulF32Ref(W + h * head_stride, rows, cols, X + h * x_stride, 1, Y + h * y_stride);
}

void MatMulMxfp4Ref(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, const float* X, size_t n,
                    float* Y) {
  // Dequantise one weight row at a time and reuse it for every input row.
  std::vector<float> row(in);
  const size_t nblocks = in / kMxfp4BlockElems;
  for (size_t o = 0; o < out; ++o) {
    for (size_t b = 0; b < nblocks; ++b)
      Mxfp4DecodeBlock(blocks + (o * nblocks + b) * kMxfp4BlockBytes, scales[o * nblocks + b],
                       row.data() + b * kMxfp4BlockElems);
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * in;
      float acc = 0.0f;
      for (size_t i = 0; i < in; ++i) acc += row[i] * x[i];
      Y[t * out + o] = acc;
    }
  }
}

void RmsNormRef(const float* x, const float* w, float eps, size_t d, float* y) {
  float ss = 0.0f;
  for (size_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (size_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * inv);
}

void LayerNormRef(const float* x, const float* w, const float* b, float eps, size_t d, float* y) {
  float mean = 0.0f;
  for (size_t i = 0; i < d; ++i) mean += x[i];
  mean /= static_cast<float>(d);
  float var = 0.0f;
  for (size_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(d);
  const float inv = 1.0f / std::sqrt(var + eps);
  for (size_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * inv * w[i] + b[i];
}

void SoftmaxRef(float* x, size_t d) {
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < d; ++i) mx = std::max(mx, x[i]);
  if (!std::isfinite(mx)) {  // nothing selectable: all zeros rather than NaN
    for (size_t i = 0; i < d; ++i) x[i] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (size_t i = 0; i < d; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  for (size_t i = 0; i < d; ++i) x[i] /= sum;
}

}  // namespace moeserve::kernels
