// A JSON-schema `pattern` that constrained decoding can enforce: a subset of
// ECMA-262 regular expressions, compiled to a DFA over printable ASCII
// (0x20-0x7E), the only characters a pattern-constrained string is written
// with (`"` and `\` as the escapes \" and \\).
//
// The subset: literals; `.`; escapes \d \w \s \D \W \S, \xNN and \uNNNN below
// 0x80, escaped punctuation; classes [...] with ranges and negation; groups
// (...) and (?:...); alternation |; quantifiers * + ? {n} {n,} {n,m} (n, m at
// most 64; a lazy `?` after them changes nothing here); `^` at the start and
// `$` at the end. An unanchored side matches anything there, as JSON Schema
// searches. Refused, with the reason: backreferences, lookaround, \b, named
// groups, non-ASCII characters, anchors inside an alternation, a pattern no
// printable string matches, and one whose DFA would exceed 512 states.
//
// Thread safety: immutable after Compile.
#pragma once

#include <array>
#include <memory>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

class PatternDfa {
 public:
  static constexpr int kDead = -1;
  static constexpr int kUnreachable = 1 << 30;

  static Result<std::shared_ptr<const PatternDfa>> Compile(std::string_view pattern);

  int start() const { return 0; }
  // The state after printable character c (0x20-0x7E), or kDead.
  int Next(int state, char c) const {
    const auto u = static_cast<unsigned char>(c);
    if (state < 0 || u < 0x20 || u > 0x7E) return kDead;
    return next_[static_cast<size_t>(state)][u - 0x20];
  }
  bool Accepting(int state) const { return accepting_[static_cast<size_t>(state)]; }
  // The fewest JSON bytes (\" and \\ count two) that reach an accepting state.
  int BytesToAccept(int state) const { return bytes_to_accept_[static_cast<size_t>(state)]; }
  // Does the whole of `s` (decoded text) match?
  bool Matches(std::string_view s) const;

 private:
  std::vector<std::array<int, 95>> next_;
  std::vector<bool> accepting_;
  std::vector<int> bytes_to_accept_;
};

}  // namespace moeserve::engine
