// Element types of checkpoint tensors (the safetensors dtype strings) and
// BF16 <-> F32 conversion.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moeserve::engine {

enum class DType { kBool, kU8, kI8, kU16, kI16, kF16, kBF16, kU32, kI32, kF32, kU64, kI64, kF64, kF8E4M3, kF8E5M2 };

// Parses a safetensors dtype string ("BF16"); nullopt for unknown strings.
std::optional<DType> ParseDType(std::string_view s);
std::string_view DTypeName(DType t);
size_t DTypeSize(DType t);

inline float Bf16ToF32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as PyTorch's .to(torch.bfloat16); NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace moeserve::engine
