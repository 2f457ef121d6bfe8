// Added tokens in text: AddedVocabulary::find_matches of the `tokenizers`
// crate. Its aho-corasick automaton (leftmost-longest) is a byte trie here:
// from each position, the longest token starting there; the scan resumes
// after a match, also after a special token passed over as text, so text
// inside it never matches another token.
#include <algorithm>

#include <unicode/uchar.h>

#include "hf_tokenizer/pipeline.hpp"

namespace moeserve::engine::hf {

namespace {

// Decodes the code point starting at text[i] (input is valid UTF-8).
char32_t CodePointAt(std::string_view text, size_t i, size_t& length) {
  unsigned char c = static_cast<unsigned char>(text[i]);
  length = Utf8Length(c);
  if (length == 1) return c;
  char32_t cp = c & (0xFF >> (length + 1));
  for (size_t k = 1; k < length && i + k < text.size(); ++k) cp = (cp << 6) | (text[i + k] & 0x3F);
  return cp;
}

bool IsWhitespace(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

// Start of the whitespace that ends text (text.size() when it ends otherwise).
size_t TrailingSpaceStart(std::string_view text) {
  size_t start = text.size();
  while (start > 0) {
    size_t i = start - 1;
    while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
    size_t len;
    if (!IsWhitespace(CodePointAt(text, i, len))) break;
    start = i;
  }
  return start;
}

size_t LeadingSpaceLength(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    if (!IsWhitespace(CodePointAt(text, i, len))) break;
    i += len;
  }
  return i;
}

}  // namespace

void AddedTokenMatcher::Add(std::string_view pattern, const AddedToken* token) {
  if (pattern.empty()) return;
  int node = 0;
  for (char ch : pattern) {
    uint8_t b = static_cast<uint8_t>(ch);
    auto& next = nodes_[static_cast<size_t>(node)].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, 0),
                               [](const auto& x, const auto& y) { return x.first < y.first; });
    if (it != next.end() && it->first == b) {
      node = it->second;
    } else {
      int child = static_cast<int>(nodes_.size());
      next.insert(it, {b, child});
      nodes_.emplace_back();
      node = child;
    }
  }
  // Two tokens with one text: the first listed keeps it, as a HashMap insert would not; the
  // loader refuses duplicate contents, so this is never reached with a real choice.
  if (!nodes_[static_cast<size_t>(node)].token) nodes_[static_cast<size_t>(node)].token = token;
}

std::vector<AddedTokenMatcher::Segment> AddedTokenMatcher::Split(std::string_view text, bool special_as_text) const {
  std::vector<Segment> out;
  size_t start_offset = 0;
  const auto& root = nodes_[0].next;
  for (size_t pos = 0; pos < text.size();) {
    // Longest token starting at pos.
    const AddedToken* found = nullptr;
    size_t found_end = 0;
    int node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      const auto& next = nodes_[static_cast<size_t>(node)].next;
      uint8_t b = static_cast<uint8_t>(text[i]);
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, 0),
                                 [](const auto& x, const auto& y) { return x.first < y.first; });
      if (it == next.end() || it->first != b) break;
      node = it->second;
      if (nodes_[static_cast<size_t>(node)].token) {
        found = nodes_[static_cast<size_t>(node)].token;
        found_end = i + 1;
      }
    }
    if (!found) {
      // Skip ahead to the next byte that can start a token.
      ++pos;
      while (pos < text.size() && !std::binary_search(root.begin(), root.end(), std::make_pair(uint8_t(text[pos]), 0),
                                                      [](const auto& x, const auto& y) { return x.first < y.first; }))
        ++pos;
      continue;
    }
    size_t start = pos, stop = found_end;
    pos = found_end;
    if (special_as_text && found->special) continue;
    if (found->lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
    if (found->rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, nullptr});
    out.push_back({start, stop, found});
    start_offset = stop;
    pos = std::max(pos, stop);
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), nullptr});
  return out;
}

}  // namespace moeserve::engine::hf
