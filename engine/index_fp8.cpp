// The rounding DeepSeek-V3.2's indexer applies to its queries and keys
// (DsaConfig::index_fp8): an orthonormal Hadamard rotation (the Sylvester
// matrix scaled by dim^-1/2, as fast_hadamard_transform with scale
// dim^-0.5), then act_quant's FP8 e4m3 quantisation in groups of 128, read
// back as the values the FP8 products see.
#include <algorithm>
#include <cmath>

#include "layers.hpp"

namespace moeserve::engine {
namespace {

constexpr int kGroup = 128;
constexpr float kFp8Max = 448.0f;

// Nearest e4m3fn value, ties to even, for |v| <= 448: a 3-bit mantissa above
// 2^-6, the subnormal step 2^-9 below it. Every step is exact in fp32.
float RoundE4m3(float v) {
  const float a = std::fabs(v);
  if (a == 0.0f) return v;
  const int e = std::max(std::ilogb(a), -6);
  const float quantum = std::ldexp(1.0f, e - 3);
  return std::copysign(std::nearbyint(a / quantum) * quantum, v);
}

}  // namespace

void IndexHadamardFp8(float* x, int dim, bool ue8m0) {
  // Fast Walsh-Hadamard transform (natural order), then the 1/sqrt(dim).
  for (int h = 1; h < dim; h *= 2)
    for (int i = 0; i < dim; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float norm = 1.0f / std::sqrt(static_cast<float>(dim));
  for (int i = 0; i < dim; ++i) x[i] *= norm;
  for (int g = 0; g < dim; g += kGroup) {
    float amax = 1e-4f;  // act_quant's floor
    for (int i = g; i < g + kGroup; ++i) amax = std::max(amax, std::fabs(x[i]));
    float s = amax * (1.0f / kFp8Max);
    if (ue8m0) {
      // 2^ceil(log2 s), as the kernel's fast_round_scale reads the bits.
      int ex = 0;
      const float m = std::frexp(s, &ex);  // s = m 2^ex, m in [0.5, 1)
      s = std::ldexp(1.0f, m == 0.5f ? ex - 1 : ex);
    }
    for (int i = g; i < g + kGroup; ++i) x[i] = RoundE4m3(std::clamp(x[i] / s, -kFp8Max, kFp8Max)) * s;
  }
}

}  // namespace moeserve::engine
