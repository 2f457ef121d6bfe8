// Random kernel inputs for the kernel tests: standard normal floats.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace moeserve::kernels {

inline std::vector<float> Random(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace moeserve::kernels
