// RoPE with YaRN (model.md section 4), as DeepSeek-V3.2's precompute_freqs_cis.
#include <algorithm>
#include <cmath>

#include "layers.hpp"

namespace moeserve::engine {

namespace {
bool YarnActive(const ModelConfig& c) {
  return c.rope.yarn && c.max_position_embeddings > c.rope.original_max_position;
}
}  // namespace

std::vector<float> RopeFrequencies(const ModelConfig& c) {
  const int d = c.mla.qk_rope_head_dim;
  std::vector<float> freqs(static_cast<size_t>(d / 2));
  for (int j = 0; j < d / 2; ++j)
    freqs[static_cast<size_t>(j)] = static_cast<float>(1.0 / std::pow(c.rope.theta, (2.0 * j) / d));
  if (!YarnActive(c)) return freqs;
  auto correction_dim = [&](double r) {
    return d * std::log(static_cast<double>(c.rope.original_max_position) / (r * 2.0 * M_PI)) / (2.0 * std::log(c.rope.theta));
  };
  double low = std::max(std::floor(correction_dim(c.rope.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.rope.beta_slow)), static_cast<double>(d - 1));
  if (low == high) high += 0.001;  // DeepSeek's guard against a zero-width ramp
  for (int j = 0; j < d / 2; ++j) {
    double ramp = std::clamp((j - low) / (high - low), 0.0, 1.0);
    double smooth = 1.0 - ramp;
    float f = freqs[static_cast<size_t>(j)];
    // fp32 arithmetic, as the reference computes it.
    freqs[static_cast<size_t>(j)] = f / static_cast<float>(c.rope.factor) * static_cast<float>(1.0 - smooth) +
                                    f * static_cast<float>(smooth);
  }
  return freqs;
}

float MlaSoftmaxScale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_head_dim()));
  if (YarnActive(c)) {
    double m = 0.1 * c.rope.mscale * std::log(c.rope.factor) + 1.0;
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

void RopeInterleaved(float* x, int dim, int64_t pos, const std::vector<float>& freqs) {
  for (int j = 0; j < dim / 2; ++j) {
    const float angle = static_cast<float>(pos) * freqs[static_cast<size_t>(j)];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * c - b * s;
    x[2 * j + 1] = a * s + b * c;
  }
}

void RopeHalfSplit(float* x, int dim, int64_t pos, const std::vector<float>& freqs) {
  const int h = dim / 2;
  for (int j = 0; j < h; ++j) {
    const float angle = static_cast<float>(pos) * freqs[static_cast<size_t>(j)];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[j], b = x[j + h];
    x[j] = a * c - b * s;
    x[j + h] = a * s + b * c;
  }
}

}  // namespace moeserve::engine
