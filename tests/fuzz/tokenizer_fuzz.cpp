// The tokenizer: tokenizer.json validation (Tokenizer::FromJsonText), and
// Encode / Decode / Utf8StreamDecoder over arbitrary bytes and ids. Every
// input is used three ways:
//   - as a tokenizer.json: refused with a message, or accepted, and then the
//     canonical file it describes (ToJson) loads back to the same vocabulary;
//   - as text: Encode is one byte id per byte; Decode gives valid UTF-8, the
//     text itself when it was valid UTF-8; feeding the stream decoder a byte
//     at a time gives what Decode gives;
//   - as 16-bit ids: Decode gives valid UTF-8 and ValidateInput accepts
//     exactly the ids in range that are not padding.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "moeserve/engine/tokenizer.hpp"

using namespace moeserve;
using engine::Tokenizer;

namespace {

constexpr int kVocab = 300;  // 268 byte and special ids, then padding

void AsTokenizerJson(std::string_view text) {
  auto t = Tokenizer::FromJsonText(text, "fuzz");
  if (!t) {
    FUZZ_CHECK(!t.error().message().empty(), "a refusal says why");
    return;
  }
  FUZZ_CHECK(t->vocab_size() >= engine::tok::kMinVocabSize, std::to_string(t->vocab_size()));
  auto again = Tokenizer::FromJsonText(t->ToJson(), "fuzz (canonical)", t->vocab_size());
  FUZZ_CHECK(again.has_value(), again ? "" : again.error().message());
  FUZZ_CHECK(again->vocab_size() == t->vocab_size(), "vocabulary changed in the round trip");
}

void AsText(const Tokenizer& tok, std::string_view text) {
  std::vector<int> ids = tok.Encode(text);
  FUZZ_CHECK(ids.size() == text.size(), "one id per byte");
  for (size_t i = 0; i < ids.size(); ++i)
    FUZZ_CHECK(ids[i] == static_cast<unsigned char>(text[i]), "byte " + std::to_string(i));
  const std::string decoded = tok.Decode(ids);
  FUZZ_CHECK(fuzz::IsValidUtf8(decoded), "Decode gave invalid UTF-8");
  if (fuzz::IsValidUtf8(text)) FUZZ_CHECK(decoded == text, "valid UTF-8 did not round-trip");

  engine::Utf8StreamDecoder byte_at_a_time;
  std::string streamed;
  for (char c : text) {
    const std::string completed = byte_at_a_time.Push(static_cast<uint8_t>(c));
    FUZZ_CHECK(fuzz::IsValidUtf8(completed), "a pushed byte completed invalid UTF-8");
    streamed += completed;
  }
  streamed += byte_at_a_time.Finish();
  FUZZ_CHECK(!byte_at_a_time.HasPending(), "Finish left a pending sequence");
  FUZZ_CHECK(streamed == decoded, "byte-at-a-time decoding differs from Decode");
}

void AsIds(const Tokenizer& tok, std::string_view bytes) {
  std::vector<int> ids;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    int16_t id;
    std::memcpy(&id, bytes.data() + i, 2);
    ids.push_back(id % 512);  // mostly near the interesting range, negatives included
  }
  FUZZ_CHECK(fuzz::IsValidUtf8(tok.Decode(ids, false)), "Decode of ids gave invalid UTF-8");
  FUZZ_CHECK(fuzz::IsValidUtf8(tok.Decode(ids, true)), "Decode with specials gave invalid UTF-8");
  bool all_valid = true;
  for (int id : ids) all_valid = all_valid && id >= 0 && id < kVocab && !tok.IsPadding(id);
  FUZZ_CHECK(tok.ValidateInput(ids).has_value() == all_valid, "ValidateInput disagrees with the id rules");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer tok = Tokenizer::Builtin(kVocab);
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  AsTokenizerJson(input);
  AsText(tok, input);
  AsIds(tok, input);
  return 0;
}
