// The byte-level tokenizer of model.md section 8.
//
// Byte b is id b (0-255); ids 256-267 are the special tokens below, pinned
// forever; ids 268..vocab_size-1 are padding that exists only to round the
// embedding table up: never sampled, refused in input. There are no merges,
// so encoding is the identity on UTF-8 bytes and needs no table at all. The
// tokenizer.json file exists for Hugging Face tooling and as a guard: loading
// one checks that it describes exactly this scheme, so a checkpoint built for
// another tokenizer is refused up front instead of producing gibberish.
//
// Text a user types is always plain bytes: the characters "<|end|>" in a
// message encode as 7 byte ids, never as id 262. Only the chat renderer
// (chat_format.hpp) and the engine emit special ids.
//
// Thread safety: a Tokenizer is immutable after construction; share it freely.
// A Utf8StreamDecoder holds per-stream state: one per sequence, not shared.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

namespace tok {
constexpr int kBos = 256;
constexpr int kEos = 257;
constexpr int kSystem = 258;
constexpr int kUser = 259;
constexpr int kAssistant = 260;
constexpr int kTool = 261;
constexpr int kEnd = 262;
constexpr int kThink = 263;
constexpr int kEndThink = 264;
constexpr int kToolCall = 265;
constexpr int kEndToolCall = 266;
constexpr int kTools = 267;
constexpr int kFirstSpecial = kBos;
constexpr int kNumSpecials = 12;
constexpr int kFirstPadding = 268;
// model.md section 2: config validation requires vocab_size >= this.
constexpr int kMinVocabSize = kFirstPadding;

inline constexpr bool IsByte(int id) { return id >= 0 && id < kFirstSpecial; }
inline constexpr bool IsSpecial(int id) { return id >= kFirstSpecial && id < kFirstPadding; }

// "<|bos|>" for kBos, ...; empty for ids that are not special.
std::string_view SpecialText(int id);
}  // namespace tok

class Tokenizer {
 public:
  // Loads and validates a Hugging Face tokenizer.json. Refused (with the file
  // and the offending token named) unless: the model is BPE with no merges
  // and its vocab maps the GPT-2 byte-to-unicode character of every byte b to
  // id b; added_tokens holds every special with exactly its pinned id and
  // content and "special": true; ids are 0..N-1, each exactly once, N >= 268;
  // no normalizer. Padding ids may be listed in model.vocab (what ToJson
  // writes) or in added_tokens, under any unique name. When
  // expected_vocab_size is given (config.json's vocab_size), N must not
  // exceed it, and vocab_size() is expected_vocab_size: ids N.. are padding
  // too (an embedding padded past the file's ids, as real checkpoints do).
  static Result<Tokenizer> FromFile(const std::string& path,
                                    std::optional<int> expected_vocab_size = std::nullopt);
  // Same checks on text already in memory; source names it in errors.
  static Result<Tokenizer> FromJsonText(std::string_view json_text, std::string_view source,
                                        std::optional<int> expected_vocab_size = std::nullopt);

  // The tokenizer without a file. Precondition: vocab_size >= 268 (config
  // validation guarantees it); a smaller value is raised to 268 and logged,
  // because an embedding table can never be smaller than the specials.
  static Tokenizer Builtin(int vocab_size);

  // The canonical tokenizer.json (pretty-printed, 2-space indent) that
  // moe-model-gen ships: byte-level BPE without merges, the 12 specials in
  // added_tokens, padding ids in model.vocab as "<|pad_N|>". FromJsonText of
  // this text gives back an equal tokenizer.
  std::string ToJson() const;

  int vocab_size() const { return vocab_size_; }
  bool IsPadding(int id) const { return id >= tok::kFirstPadding && id < vocab_size_; }

  // The UTF-8 bytes of text, one id per byte. Never produces an id >= 256.
  std::vector<int> Encode(std::string_view text) const;

  // Text of the byte ids, always valid UTF-8: malformed byte sequences become
  // U+FFFD exactly as Utf8StreamDecoder documents; any non-byte id ends a
  // pending half character. Special ids are dropped unless render_specials,
  // then they appear as their text ("<|end|>"); padding and out-of-range ids
  // (which valid input and sampling never produce) always become U+FFFD so
  // that they are visible, never silently lost.
  std::string Decode(std::span<const int> ids, bool render_specials = false) const;

  // For prompts: every id must be in [0, vocab_size) and not padding. Special
  // ids are allowed (a rendered chat contains them). The error names the first
  // offending position and id.
  Status ValidateInput(std::span<const int> ids) const;

 private:
  explicit Tokenizer(int vocab_size) : vocab_size_(vocab_size) {}
  int vocab_size_;
};

// Turns a stream of bytes (one token's byte at a time) into UTF-8 text that
// never ends in half a character: an incomplete multi-byte sequence is held
// back until the bytes that complete it arrive.
//
// Invalid input becomes U+FFFD (EF BF BD) following the WHATWG Encoding
// Standard's UTF-8 decoder ("maximal subpart" replacement, also Unicode's
// recommended practice): each byte that cannot start a sequence (80-BF alone,
// C0, C1, F5-FF) is one U+FFFD; a sequence broken by an unexpected byte
// becomes one U+FFFD for the bytes so far, and the unexpected byte is then
// decoded afresh; overlong forms, surrogates (ED A0-BF) and code points above
// U+10FFFF are caught at their second byte. Finish() turns a sequence still
// incomplete at the end of the stream into one U+FFFD.
class Utf8StreamDecoder {
 public:
  // Returns the text completed by this byte (empty while a sequence is pending).
  std::string Push(uint8_t byte);
  std::string Push(std::string_view bytes);
  // End of stream (or a special token interrupting the text): flushes a pending
  // incomplete sequence as U+FFFD and resets.
  std::string Finish();
  bool HasPending() const { return needed_ != 0; }

 private:
  void PushInto(uint8_t byte, std::string& out);

  uint32_t pending_bytes_ = 0;  // how many bytes of the current sequence were seen
  int needed_ = 0;              // continuation bytes still expected
  char buffer_[4] = {};
  uint8_t lower_ = 0x80;        // allowed range of the next continuation byte
  uint8_t upper_ = 0xBF;
};

}  // namespace moeserve::engine
