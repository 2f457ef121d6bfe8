// The exact order of the top-k selections (TopKIndicesRef's): a score as a
// 32-bit key that orders as the floats do (-0 and +0 as one key), and an
// entry (key << 32 | ~position) whose larger value is the better of two
// scores, ties to the lower position. Shared by the streamed and the binned
// selections so that both order entries the same way.
#pragma once

#include <bit>
#include <cstdint>

namespace moeserve::kernels::topk {

inline uint32_t OrderKey(float f) {
  const uint32_t b = f == 0.0f ? 0u : std::bit_cast<uint32_t>(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

inline float KeyScore(uint32_t key) {
  return std::bit_cast<float>((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

inline uint64_t Entry(float score, int pos) {
  return (uint64_t{OrderKey(score)} << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(pos));
}

inline int EntryPosition(uint64_t entry) { return static_cast<int>(~static_cast<uint32_t>(entry)); }

}  // namespace moeserve::kernels::topk
