// HfTokenizer (Hugging Face tokenizer.json). The first byte picks the use:
//   - odd: the rest is a tokenizer.json: refused with a message, or loaded,
//     and then encoding a fixed text gives ids inside its vocabulary;
//   - even: the rest is text for a fixed byte-level BPE with merges, Qwen3's
//     Split regex and two added tokens. Invalid UTF-8 is refused; valid text
//     encodes in each added-token mode to ids in the vocabulary that decode
//     back to the text (byte-level BPE loses nothing), and the streaming
//     decoder, fed one id at a time, gives Decode's text and never half a
//     character.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_check.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

using namespace moeserve;
using fuzz::ByteLevelName;
using engine::AddedTokenText;
using engine::HfTokenizer;

namespace {

const HfTokenizer& FixedTokenizer() {
  static const HfTokenizer tokenizer = [] {
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    for (int b = 0; b < 256; ++b) vocab[ByteLevelName(b)] = b;
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"t", "h"}, {"th", "e"}, {ByteLevelName(' '), "the"}, {"e", "r"}, {"Ã", "©"}, {"ä", "¸"}, {"ä¸", "Ń"}};
    nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
    int id = 256;
    for (const auto& [a, b] : merges) {
      if (!vocab.contains(a + b)) vocab[a + b] = id++;
      merge_list.push_back(a + " " + b);
    }
    nlohmann::ordered_json doc = {
        {"added_tokens",
         {{{"id", id}, {"content", "<|endoftext|>"}, {"normalized", false}, {"special", true}},
          {{"id", id + 1}, {"content", "<think>"}, {"normalized", false}, {"special", false}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                         "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
             {"behavior", "Isolated"}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
    };
    auto t = HfTokenizer::FromJsonText(doc.dump(), "fuzz (fixed)");
    FUZZ_CHECK(t.has_value(), t ? "" : t.error().message());
    return std::move(*t);
  }();
  return tokenizer;
}

void AsTokenizerJson(std::string_view text) {
  auto t = HfTokenizer::FromJsonText(text, "fuzz");
  if (!t) {
    FUZZ_CHECK(!t.error().message().empty(), "a refusal says why");
    return;
  }
  auto ids = t->Encode("Hello, world! 123 <|endoftext|>", AddedTokenText::kMatchAll);
  FUZZ_CHECK(ids.has_value(), "valid UTF-8 must encode");
  for (int id : *ids) FUZZ_CHECK(id >= 0 && id < t->vocab_size(), std::to_string(id));
  FUZZ_CHECK(fuzz::IsValidUtf8(t->Decode(*ids)), "Decode gave invalid UTF-8");
}

void AsText(std::string_view text) {
  const HfTokenizer& t = FixedTokenizer();
  for (AddedTokenText mode : {AddedTokenText::kSpecialAsText, AddedTokenText::kMatchAll, AddedTokenText::kAllAsText}) {
    auto ids = t.Encode(text, mode);
    if (!fuzz::IsValidUtf8(text)) {
      FUZZ_CHECK(!ids.has_value(), "invalid UTF-8 was encoded");
      return;
    }
    FUZZ_CHECK(ids.has_value(), ids ? "" : ids.error().message());
    for (int id : *ids) FUZZ_CHECK(id >= 0 && id < t.vocab_size(), std::to_string(id));
    const std::string decoded = t.Decode(*ids);
    FUZZ_CHECK(decoded == text, "Decode(Encode(text)) differs from text");
    engine::HfStreamDecoder stream(t);
    std::string streamed;
    for (int id : *ids) {
      std::string piece = stream.Push(id);
      FUZZ_CHECK(fuzz::IsValidUtf8(piece), "a pushed id gave half a character");
      streamed += piece;
    }
    streamed += stream.Finish();
    FUZZ_CHECK(streamed == decoded, "streamed text differs from Decode");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    AsTokenizerJson(rest);
  } else {
    AsText(rest);
  }
  return 0;
}
