// Hugging Face tokenizer.json: the byte-level BPE tokenizers of gpt-oss
// (o200k_harmony), DeepSeek-V3 and Qwen3, giving exactly the ids Hugging
// Face's `tokenizers` library gives (docs/tokenizers.md).
//
// The pipeline is the library's: added tokens are cut out of the text first
// (those with "normalized": false from the raw text, then those with
// "normalized": true from each normalized piece); every other piece goes
// through the normalizer (NFC and friends, through ICU), the pre-tokenizers
// (Split regexes run by Oniguruma, the engine the library itself uses, so
// `(?i:'s|'t)`, `\s+(?!\S)` and `\p{L}` mean what they mean there; ByteLevel;
// Sequence) and the BPE model (merges by rank, ignore_merges). Any feature of
// the file outside that set is refused at load with an error naming it,
// never silently ignored.
//
// Thread safety: an HfTokenizer is immutable after loading; share it freely.
// An HfStreamDecoder holds one sequence's state: one per sequence.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {

namespace hf {
class Pipeline;  // engine/hf_tokenizer/pipeline.hpp
}

// How text that spells an added token is read.
enum class AddedTokenText {
  // Hugging Face's default: every added token's text becomes its id.
  kMatchAll,
  // Special tokens' text is plain text, encoded like any other characters;
  // non-special added tokens still match (Hugging Face's
  // split_special_tokens / encode_special_tokens). Text a user typed.
  kSpecialAsText,
  // No added token matches: all of the text goes through the model.
  kAllAsText,
};

class HfTokenizer {
 public:
  static Result<HfTokenizer> FromFile(const std::string& path);
  // source names the text in errors.
  static Result<HfTokenizer> FromJsonText(std::string_view json_text, std::string_view source);

  // The ids of text (never special tokens added around it: no BOS, no post
  // processor). Refused when text is not valid UTF-8.
  Result<std::vector<int>> Encode(std::string_view text, AddedTokenText mode = AddedTokenText::kSpecialAsText) const;

  // Text of the ids as Hugging Face's decode gives it: ids outside the
  // vocabulary are dropped, byte sequences that are not UTF-8 become U+FFFD
  // (Utf8StreamDecoder's rules, which are from_utf8_lossy's).
  std::string Decode(std::span<const int> ids, bool skip_special_tokens = false) const;

  // One past the largest id of the model vocabulary and the added tokens.
  int vocab_size() const;
  std::optional<int> TokenId(std::string_view token) const;
  // The token's string as the file writes it ("Ġthe", "<|endoftext|>").
  std::optional<std::string_view> TokenText(int id) const;
  bool IsSpecial(int id) const;
  // The bytes one id stands for in decoded text (what the decoder makes of it alone).
  std::string_view TokenBytes(int id) const;

 private:
  explicit HfTokenizer(std::shared_ptr<const hf::Pipeline> pipeline) : pipeline_(std::move(pipeline)) {}
  std::shared_ptr<const hf::Pipeline> pipeline_;
};

// Decodes one id at a time for streaming: Push returns the text those ids
// complete and holds back a trailing incomplete UTF-8 character until the ids
// that complete it arrive, so the concatenation of every Push and Finish is
// exactly Decode of all the ids.
class HfStreamDecoder {
 public:
  explicit HfStreamDecoder(const HfTokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}
  std::string Push(int id);
  // End of the sequence: an incomplete character still held becomes U+FFFD.
  std::string Finish() { return utf8_.Finish(); }

 private:
  const HfTokenizer* tokenizer_;
  bool skip_special_;
  Utf8StreamDecoder utf8_;
};

}  // namespace moeserve::engine
