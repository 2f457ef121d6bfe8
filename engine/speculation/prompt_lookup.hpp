// Prompt lookup: drafts copied from the sequence's own context.
//
// Agents copy: a tool call's arguments repeat the user's words, an answer
// repeats the tool's result, a file edit repeats the file. When the last few
// tokens of a sequence occurred earlier in it (prompt or output), what
// followed them there is a good guess of what comes next. The index maps
// each `min_match`-gram to the positions it ends at; a proposal takes the
// longest match of the sequence's suffix (up to `max_match` tokens, checked
// token by token, among the most recent occurrences) and proposes the tokens
// that followed it. The index grows with the sequence (Extend) and is never
// rolled back: rejected drafts never enter the sequence.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace moeserve::engine {

class PromptLookup {
 public:
  explicit PromptLookup(int min_match = 3, int max_match = 16, int candidates = 32)
      : min_match_(min_match), max_match_(max_match), candidates_(candidates) {}

  // Up to max_tokens tokens proposed to follow `tokens` (the whole sequence
  // so far); empty when its suffix of min_match tokens occurred nowhere
  // earlier. Indexes what it has not seen of `tokens` first.
  std::vector<int> Propose(std::span<const int> tokens, int max_tokens);

  int64_t indexed() const { return indexed_; }

 private:
  // Adds the n-grams ending at positions [indexed_, tokens.size()).
  void Extend(std::span<const int> tokens);
  uint64_t KeyEndingAt(std::span<const int> tokens, int64_t end) const;  // the min_match-gram ending at `end`

  int min_match_, max_match_, candidates_;
  int64_t indexed_ = 0;  // positions below this are in the index
  std::unordered_map<uint64_t, std::vector<int64_t>> ends_;  // n-gram key -> end positions, ascending
};

}  // namespace moeserve::engine
