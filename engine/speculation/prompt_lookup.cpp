#include "prompt_lookup.hpp"

#include <algorithm>

namespace moeserve::engine {

uint64_t PromptLookup::KeyEndingAt(std::span<const int> tokens, int64_t end) const {
  // FNV-1a over the ids; a collision costs one failed comparison, never a
  // wrong draft (Propose compares the tokens themselves).
  uint64_t h = 1469598103934665603ull;
  for (int64_t p = end - min_match_ + 1; p <= end; ++p) {
    h ^= static_cast<uint32_t>(tokens[static_cast<size_t>(p)]);
    h *= 1099511628211ull;
  }
  return h;
}

void PromptLookup::Extend(std::span<const int> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t end = std::max<int64_t>(indexed_, min_match_ - 1); end < n; ++end)
    ends_[KeyEndingAt(tokens, end)].push_back(end);
  indexed_ = std::max(indexed_, n);
}

std::vector<int> PromptLookup::Propose(std::span<const int> tokens, int max_tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || n <= min_match_) return {};
  Extend(tokens);
  const auto it = ends_.find(KeyEndingAt(tokens, n - 1));
  if (it == ends_.end()) return {};
  // The most recent occurrences first; the current suffix itself (end n-1) is skipped.
  int64_t best_end = -1;
  int best_len = 0;
  int looked = 0;
  for (auto e = it->second.rbegin(); e != it->second.rend() && looked < candidates_; ++e) {
    const int64_t end = *e;
    if (end >= n - 1) continue;
    ++looked;
    int len = 0;
    while (len < max_match_ && end - len >= 0 && tokens[static_cast<size_t>(end - len)] == tokens[static_cast<size_t>(n - 1 - len)])
      ++len;
    if (len >= min_match_ && len > best_len) {
      best_len = len;
      best_end = end;
      if (len == max_match_) break;
    }
  }
  if (best_end < 0) return {};
  const int64_t from = best_end + 1, to = std::min<int64_t>(n, from + max_tokens);
  return {tokens.begin() + from, tokens.begin() + to};
}

}  // namespace moeserve::engine
