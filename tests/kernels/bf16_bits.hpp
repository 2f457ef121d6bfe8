// BF16 bits for the kernel tests: a float rounded as the BF16-activation
// products round (RoundToBf16), and the float a BF16 pattern holds.
#pragma once

#include <cstdint>
#include <cstring>

#include "moeserve/kernels/bf16_activations.hpp"

namespace moeserve::kernels {

inline uint16_t ToBf16Bits(float f) {
  const float r = RoundToBf16(f);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return static_cast<uint16_t>(u >> 16);
}

inline float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace moeserve::kernels
