// Prompts of known, reproducible token ids for the benches that time the
// engine on generated models: the same (n, seed) gives the same ids in every
// bench and every run.
#pragma once

#include <cstdint>
#include <vector>

namespace moeserve::bench {

// n ids from a 64-bit LCG seeded by `seed`: printable bytes (32-126), which
// every byte-level vocabulary holds, or ids below `vocab` when the vocabulary
// is smaller than 128.
inline std::vector<int> SyntheticPrompt(int n, uint64_t seed, int vocab = 256) {
  std::vector<int> p;
  uint64_t s = seed * 2654435761u + 1;
  while (static_cast<int>(p.size()) < n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p.push_back(vocab > 127 ? static_cast<int>((s >> 33) % 95) + 32 : static_cast<int>((s >> 33) % vocab));
  }
  return p;
}

}  // namespace moeserve::bench
