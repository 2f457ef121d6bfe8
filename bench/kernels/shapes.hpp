// Flagship-like kernel shapes shared by bench_kernels and bench_roofline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::bench {

struct MatShape {
  const char* name;
  size_t out, in;
};

// [out, in]: a w2-like 4096 x 14336 and a 7168 x 2048 expert projection.
inline constexpr MatShape kMxfp4Shapes[] = {{"4096x14336", 4096, 14336}, {"7168x2048", 7168, 2048}};

// Packed as the engine loads experts (kernels/mxfp4_packed.hpp).
struct Mxfp4Matrix {
  kernels::Mxfp4PackedStack packed;
  kernels::Mxfp4PackedView view() const { return packed.matrix(0); }
};

// Random bytes are valid MXFP4 except scale 255; scales kept near 127.
inline Mxfp4Matrix RandomMxfp4(size_t out, size_t in, uint32_t seed = 1) {
  std::vector<uint8_t> blocks(out * in / 2), scales(out * in / 32);
  std::mt19937 rng(seed);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 8);
  return {kernels::Mxfp4PackedStack(blocks.data(), scales.data(), 1, out, in)};
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed = 2) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// How many copies of a weight set of `bytes` to cycle through so that each
// batch-1 run reads its weights from memory, not from the caches (>= 768 MiB; L3 here may be large).
inline size_t ColdCopies(double bytes) {
  const double want = 768.0 * 1024 * 1024;
  return bytes >= want ? 1 : static_cast<size_t>(want / bytes) + 1;
}

// Bytes a matmul must read at least once: the weights plus the activations.
inline double Mxfp4Bytes(size_t out, size_t in, size_t n) {
  return static_cast<double>(out) * static_cast<double>(in) * 17.0 / 32.0 + 4.0 * static_cast<double>(n * in);
}
inline double MatMulFlops(size_t out, size_t in, size_t n) {
  return 2.0 * static_cast<double>(out) * static_cast<double>(in) * static_cast<double>(n);
}

}  // namespace moeserve::bench
