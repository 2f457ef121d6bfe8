#include "moeserve/chat/token_byte_index.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace moeserve::chat {

namespace {

// The characters of `bytes` when it is plain JSON string text (whole UTF-8
// characters, as engine::JsonGrammar accepts them: no overlong forms, surrogates or
// code points past U+10FFFF; no control bytes, '"' or '\\'), else -1.
int PlainChars(const std::string& bytes) {
  int chars = 0;
  for (size_t i = 0; i < bytes.size(); ++chars) {
    const auto c = static_cast<uint8_t>(bytes[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return -1;
      ++i;
      continue;
    }
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else return -1;
    if (i + static_cast<size_t>(need) >= bytes.size()) return -1;  // a character cut at the end
    for (int k = 1; k <= need; ++k) {
      const auto b = static_cast<uint8_t>(bytes[i + static_cast<size_t>(k)]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return -1;
    }
    i += static_cast<size_t>(need) + 1;
  }
  return chars;
}

}  // namespace

std::shared_ptr<const TokenByteIndex> TokenByteIndex::Build(const engine::HfTokenizer& tokenizer,
                                                            std::span<const int> excluded) {
  auto index = std::make_shared<TokenByteIndex>();
  const int vocab = tokenizer.vocab_size();
  index->by_id_.resize(static_cast<size_t>(vocab));
  for (int id = 0; id < vocab; ++id) {
    if (tokenizer.IsSpecial(id) || std::find(excluded.begin(), excluded.end(), id) != excluded.end()) continue;
    std::string bytes(tokenizer.TokenBytes(id));
    if (bytes.empty()) continue;
    index->by_id_[static_cast<size_t>(id)] = bytes;
    const int plain = PlainChars(bytes);
    index->entries_.push_back({std::move(bytes), id, 0, plain});
  }
  std::sort(index->entries_.begin(), index->entries_.end(),
            [](const Entry& a, const Entry& b) { return a.bytes < b.bytes || (a.bytes == b.bytes && a.id < b.id); });
  for (size_t i = 1; i < index->entries_.size(); ++i) {
    const std::string& a = index->entries_[i - 1].bytes;
    const std::string& b = index->entries_[i].bytes;
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    index->entries_[i].shared = static_cast<int>(n);
  }
  return index;
}

const std::string& TokenByteIndex::BytesOf(int id) const {
  static const std::string kNone;
  return id >= 0 && static_cast<size_t>(id) < by_id_.size() ? by_id_[static_cast<size_t>(id)] : kNone;
}


std::vector<int> TokensAcceptedBy(const TokenByteIndex& index, const engine::JsonGrammar& grammar, int vocab) {
  std::vector<int> out;
  // Inside a free string most tokens are plain text that fits: accepted at
  // once; only the others are walked through the grammar.
  const engine::JsonGrammar::PlainTextRoom room = grammar.PlainTextRoomNow();
  // states[k]: the grammar after the first k bytes of the last walked entry.
  std::vector<engine::JsonGrammar> states;
  states.reserve(64);
  states.push_back(grammar);
  int refused_at = std::numeric_limits<int>::max();  // byte of the last walk the grammar refused
  // Bytes in common with the last walked entry: the smallest `shared` since
  // it (the entries are sorted, so that is their common prefix).
  int common = 0;
  bool walked_any = false;
  for (const auto& e : index.entries()) {
    common = walked_any ? std::min(common, e.shared) : 0;
    if (e.plain_chars >= 0 && static_cast<int64_t>(e.bytes.size()) <= room.bytes && e.plain_chars <= room.chars) {
      if (e.id < vocab) out.push_back(e.id);
      continue;
    }
    // Starts with a refused prefix (shares more than the bytes before the refusal): refused too.
    if (walked_any && common > refused_at) continue;
    walked_any = true;
    refused_at = std::numeric_limits<int>::max();
    states.erase(states.begin() + common + 1, states.end());
    bool ok = true;
    for (size_t k = static_cast<size_t>(common); k < e.bytes.size(); ++k) {
      engine::JsonGrammar next = states[k];
      if (!next.Feed(static_cast<uint8_t>(e.bytes[k]))) {
        refused_at = static_cast<int>(k);
        ok = false;
        break;
      }
      states.push_back(std::move(next));
    }
    if (ok && e.id < vocab) out.push_back(e.id);
    common = static_cast<int>(e.bytes.size());
  }
  return out;
}

bool FeedTokenBytes(engine::JsonGrammar& grammar, const std::string& bytes) {
  for (unsigned char c : bytes)
    if (!grammar.Feed(c)) return false;
  return true;
}

std::vector<int> TokensContinuingOneOf(const TokenByteIndex& index, const std::string& written,
                                       const std::vector<std::string>& targets, int vocab) {
  std::vector<int> out;
  const size_t at = written.size();
  for (const auto& e : index.entries()) {
    if (e.id >= vocab) continue;
    for (const std::string& target : targets) {
      if (at + e.bytes.size() > target.size()) continue;
      if (target.compare(0, at, written) == 0 && target.compare(at, e.bytes.size(), e.bytes) == 0) {
        out.push_back(e.id);
        break;
      }
    }
  }
  return out;
}

void MaskAllBut(std::span<float> logits, const std::vector<int>& allowed) {
  std::vector<char> keep(logits.size(), 0);
  for (int id : allowed) keep[static_cast<size_t>(id)] = 1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!keep[i]) logits[i] = -std::numeric_limits<float>::infinity();
}

}  // namespace moeserve::chat
