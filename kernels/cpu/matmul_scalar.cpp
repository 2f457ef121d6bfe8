// Scalar building blocks (the reference loops restricted to a column range)
// and the kernels' aligned scratch.
#include <algorithm>
#include <cmath>
#include <new>

#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {

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
              int32_t q0 = 0, q1 = 0;
              for (int p = 0; p < x.nparts; ++p) {
                const int8_t* part = x.part(t, p);
                q0 += part[k] * (1 << Mxfp4ActShift(x.nparts, p));
                q1 += part[k + 4] * (1 << Mxfp4ActShift(x.nparts, p));
              }
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

void f32_matmul_cols_scalar(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y, size_t o_begin,
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

}  // namespace moeserve::kernels::cpu
