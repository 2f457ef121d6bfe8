// The parts of a loaded tokenizer.json (hf_tokenizer.hpp): each one mirrors
// the Hugging Face `tokenizers` component of the same name, step for step,
// because exact ids depend on the details (the order merges are applied in,
// where a regex may look ahead, which added token wins an overlap).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

// Oniguruma defines UChar unless told not to; ICU defines it too.
#define ONIG_ESCAPE_UCHAR_COLLISION
#include <oniguruma.h>
#include <unicode/normalizer2.h>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"


namespace moeserve::engine::hf {

// GPT-2's bytes_to_unicode(): byte b is written as the UTF-8 of this char.
const std::string& ByteLevelChar(uint8_t b);
// The byte a byte-level char stands for, or -1.
int ByteOfByteLevelChar(std::string_view utf8_char);
// Length of the UTF-8 sequence that starts with lead byte c (1 for a stray byte).
inline size_t Utf8Length(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
bool IsValidUtf8(std::string_view text);

// An Oniguruma regex in its default (Ruby) syntax over UTF-8, as the
// `tokenizers` crate compiles Split patterns.
class Regex {
 public:
  // error receives Oniguruma's message when the pattern does not compile.
  static std::unique_ptr<Regex> Compile(std::string_view pattern, std::string& error);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // The non-empty matches in text, left to right, each search starting where
  // the last match ended; text is searched as a whole string, so lookahead
  // stops at its end.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  explicit Regex(OnigRegex regex) : regex_(regex) {}
  OnigRegex regex_;
};

// A Sequence of Unicode normalization forms (NFC, NFD, NFKC, NFKD), applied in order.
class Normalizer {
 public:
  void Add(const icu::Normalizer2* form) { forms_.push_back(form); }
  bool empty() const { return forms_.empty(); }
  void Normalize(std::string& text) const;

 private:
  std::vector<const icu::Normalizer2*> forms_;
};

// SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::shared_ptr<const Regex> regex;  // Regex patterns; literal below otherwise
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = true;
};
using PreTokenizerStep = std::variant<SplitStep, ByteLevelStep>;

// Runs the steps in order, each over every piece the last one left (a regex
// never sees across a piece boundary); empty pieces are dropped.
void PreTokenize(const std::vector<PreTokenizerStep>& steps, std::vector<std::string>& pieces);

// Lets an unordered_map<std::string, ...> be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

// Merge rules by pair of ids: an open-addressing table, because looking
// pairs up is most of what BPE does and a node-based map misses the cache on
// every probe.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t Key(int left, int right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void Reserve(size_t n);
  // A pair set twice keeps the last value (the library's HashMap collect).
  void Set(uint64_t key, Merge merge);
  const Merge* Find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are below 2^31, so no key is this
  size_t Slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

// The BPE model.
class Bpe {
 public:
  using Merge = MergeTable::Merge;
  Bpe();
  StringMap vocab;
  MergeTable merges;
  bool ignore_merges = false;
  int unk_id = -1;
  bool fuse_unk = false;

  // Appends the ids of one pre-tokenized word.
  void Tokenize(std::string_view word, std::vector<int>& ids) const;
  // Indexes the ids of the characters below U+0800 (all byte-level chars) in
  // a table; called once the vocabulary is complete.
  void IndexCharacters();

 private:
  static constexpr size_t kShortWord = 16;
  void TokenizeUncached(std::string_view word, std::vector<int>& ids) const;
  void MergeAll(std::vector<int>& symbols) const;
  void MergeShort(std::vector<int>& symbols) const;
  std::vector<int> char_ids_;  // by code point; -1 where not a token
  uint64_t instance_;  // tells this model's entries in the per-thread word cache from another's
};

struct AddedToken {
  int id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// Finds added tokens in text the way the library's aho-corasick automaton
// does (leftmost match, longest at that position, no overlaps), then applies
// the token's flags.
class AddedTokenMatcher {
 public:
  void Add(std::string_view pattern, const AddedToken* token);
  bool empty() const { return nodes_.size() <= 1; }
  struct Segment {
    size_t start, end;
    const AddedToken* token;  // null: text between tokens
  };
  // Segments cover text in order. Special tokens are passed over when
  // special_as_text (their text stays in the neighbouring segment).
  std::vector<Segment> Split(std::string_view text, bool special_as_text) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int>> next;  // sorted by byte
    const AddedToken* token = nullptr;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
};

class Pipeline {
 public:
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_tokens;         // "normalized": false, matched in the raw text
  AddedTokenMatcher normalized_tokens;  // "normalized": true, matched in normalized text
  Normalizer normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  Bpe model;
  std::vector<std::string> token_text;   // by id; empty where no token has the id
  std::vector<std::string> token_bytes;  // what the decoder makes of each id
  std::vector<uint8_t> is_special;
  StringMap added_by_content;

  void Encode(std::string_view text, AddedTokenText mode, std::vector<int>& ids) const;

 private:
  void EncodeNormalizedPiece(std::string_view text, AddedTokenText mode, std::vector<int>& ids) const;
  void EncodeModel(std::string text, std::vector<int>& ids) const;
};

// Builds the pipeline from tokenizer.json text (load.cpp).
Result<std::shared_ptr<const Pipeline>> LoadPipeline(std::string_view json_text, std::string_view source);

}  // namespace moeserve::engine::hf
