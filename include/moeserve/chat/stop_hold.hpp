// How much of a streamed text's unreleased tail to hold back: the longest
// tail that is a proper prefix of a stop string and so could still grow into
// one with the next tokens. Shared by the output readers of every chat format.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace moeserve::chat {

// text: everything produced so far; released: how much of it already went out.
inline size_t StopHoldBack(const std::string& text, size_t released, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    for (size_t k = std::min(s.size() - 1, text.size() - released); k > hold; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

}  // namespace moeserve::chat
