#include "moeserve/engine/tokenizer.hpp"

#include <array>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/log.hpp"

namespace moeserve::engine {

namespace tok {

std::string_view SpecialText(int id) {
  static constexpr std::array<std::string_view, kNumSpecials> kTexts = {
      "<|bos|>",  "<|eos|>",   "<|system|>", "<|user|>",      "<|assistant|>",   "<|tool|>",
      "<|end|>",  "<|think|>", "<|/think|>", "<|tool_call|>", "<|/tool_call|>", "<|tools|>",
  };
  if (!IsSpecial(id)) return {};
  return kTexts[static_cast<size_t>(id - kFirstSpecial)];
}

}  // namespace tok

namespace {

using ordered_json = nlohmann::ordered_json;
// The checker reads tokenizer.json into std::map-backed json: ordered_json
// finds a key by a linear search, so a vocab of n tokens (padding ids
// included, one per id up to vocab_size) would take n^2/2 string compares to
// parse, minutes for a large vocabulary. Key order does not matter to reading.
using json = nlohmann::json;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Tokenizer files of large vocabularies run to tens of MB (merges included).
constexpr JsonLimits kTokenizerJsonLimits{.max_bytes = 256u << 20, .max_depth = kMaxJsonDepth};

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's bytes_to_unicode(), which every Hugging Face byte-level tokenizer
// uses to name byte tokens with printable characters: printable Latin-1 bytes
// stand for themselves, the other 68 bytes map to U+0100 upwards in byte order.
const std::array<std::string, 256>& ByteTokenNames() {
  static const std::array<std::string, 256> names = [] {
    std::array<std::string, 256> n;
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(printable(b) ? static_cast<uint32_t>(b) : next_unprintable++, n[b]);
    }
    return n;
  }();
  return names;
}

// An id as written in the file, or nothing when it is not an integer that fits.
std::optional<int> IdOf(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  int64_t id = v.get<int64_t>();
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) return std::nullopt;
  if (id < 0 || id > INT32_MAX) return std::nullopt;
  return static_cast<int>(id);
}

std::string PaddingName(int id) { return "<|pad_" + std::to_string(id) + "|>"; }

// Validation of a parsed tokenizer.json. Every failure names the token.
class TokenizerJsonChecker {
 public:
  explicit TokenizerJsonChecker(std::string_view source) : source_(source) {}

  Result<int> Check(const json& doc, std::optional<int> expected_vocab_size) {
    if (!doc.is_object()) return Bad("top level is not a JSON object");
    if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
      // A normalizer (NFC, lowercasing, ...) would change the bytes the model sees.
      return Bad("\"normalizer\" must be null: the model reads raw UTF-8 bytes");
    }
    MOE_TRY(CheckModel(doc));
    MOE_TRY(CheckAddedTokens(doc));
    return CheckIdsAreContiguous(expected_vocab_size);
  }

 private:
  std::unexpected<Error> Bad(std::string_view what) const {
    return Fail(Error::Corruption(source_, what));
  }

  Status Claim(int id, const std::string& content, std::string_view where) {
    auto [it, inserted] = id_to_content_.emplace(id, content);
    if (!inserted && it->second != content) {
      return Bad(std::string(where) + ": id " + std::to_string(id) + " is given to both '" + it->second +
                 "' and '" + content + "'");
    }
    auto [cit, cinserted] = content_to_id_.emplace(content, id);
    if (!cinserted && cit->second != id) {
      return Bad(std::string(where) + ": token '" + content + "' has two ids, " + std::to_string(cit->second) +
                 " and " + std::to_string(id));
    }
    return Ok();
  }

  Status CheckModel(const json& doc) {
    if (!doc.contains("model") || !doc["model"].is_object()) return Bad("missing \"model\" object");
    const json& model = doc["model"];
    if (!model.contains("type") || model["type"] != "BPE") {
      return Bad("model.type must be \"BPE\" (byte-level, no merges), got " +
                 (model.contains("type") ? model["type"].dump() : std::string("nothing")));
    }
    if (model.contains("merges") && !(model["merges"].is_array() && model["merges"].empty())) {
      // Merges would fuse bytes into multi-byte tokens; byte b must stay id b.
      return Bad("model.merges must be empty: ids are raw bytes (model.md section 8)");
    }
    if (!model.contains("vocab") || !model["vocab"].is_object()) return Bad("missing model.vocab object");
    const auto& names = ByteTokenNames();
    for (const auto& [content, id_json] : model["vocab"].items()) {
      std::optional<int> maybe_id = IdOf(id_json);
      if (!maybe_id) return Bad("model.vocab: token '" + content + "' has id " + id_json.dump() + ", not a non-negative integer");
      int id = *maybe_id;
      if (tok::IsByte(id) && content != names[id]) {
        return Bad("model.vocab: id " + std::to_string(id) + " must be the byte token '" + names[id] +
                   "', got '" + content + "'");
      }
      MOE_TRY(Claim(id, content, "model.vocab"));
    }
    for (int b = 0; b < 256; ++b) {
      auto it = id_to_content_.find(b);
      if (it == id_to_content_.end()) {
        return Bad("model.vocab: byte token '" + names[b] + "' (id " + std::to_string(b) + ") is missing");
      }
    }
    return Ok();
  }

  Status CheckAddedTokens(const json& doc) {
    if (!doc.contains("added_tokens") || !doc["added_tokens"].is_array()) {
      return Bad("missing \"added_tokens\" array (the special tokens live there)");
    }
    std::map<std::string, int, std::less<>> special_ids;
    for (int id = tok::kFirstSpecial; id < tok::kFirstPadding; ++id) special_ids.emplace(tok::SpecialText(id), id);

    std::map<int, bool> seen_special;
    size_t index = 0;
    for (const json& t : doc["added_tokens"]) {
      std::string where = "added_tokens[" + std::to_string(index++) + "]";
      if (!t.is_object() || !t.contains("id") || !IdOf(t["id"]) || !t.contains("content") ||
          !t["content"].is_string()) {
        return Bad(where + ": needs a non-negative integer \"id\" and a string \"content\"");
      }
      int id = *IdOf(t["id"]);
      std::string content = t["content"].get<std::string>();
      bool special = t.contains("special") && t["special"].is_boolean() && t["special"].get<bool>();
      auto pinned = special_ids.find(content);
      if (pinned != special_ids.end()) {
        if (id != pinned->second) {
          return Bad("special token '" + content + "' has id " + std::to_string(id) + ", expected " +
                     std::to_string(pinned->second));
        }
        if (!special) return Bad("special token '" + content + "' must have \"special\": true");
        seen_special[id] = true;
      } else if (tok::IsSpecial(id)) {
        return Bad(where + ": id " + std::to_string(id) + " is reserved for '" + std::string(tok::SpecialText(id)) +
                   "', got '" + content + "'");
      } else if (tok::IsByte(id)) {
        return Bad(where + ": added token '" + content + "' takes byte id " + std::to_string(id));
      }
      MOE_TRY(Claim(id, content, "added_tokens"));
    }
    for (int id = tok::kFirstSpecial; id < tok::kFirstPadding; ++id) {
      if (!seen_special.contains(id)) {
        return Bad("special token '" + std::string(tok::SpecialText(id)) + "' (id " + std::to_string(id) +
                   ") is missing from added_tokens");
      }
    }
    return Ok();
  }

  Result<int> CheckIdsAreContiguous(std::optional<int> expected_vocab_size) {
    int n = id_to_content_.empty() ? 0 : id_to_content_.rbegin()->first + 1;
    if (static_cast<size_t>(n) != id_to_content_.size()) {
      for (int id = 0; id < n; ++id) {
        if (!id_to_content_.contains(id)) {
          return Bad("ids must be 0.." + std::to_string(n - 1) + " without gaps; id " + std::to_string(id) +
                     " is missing");
        }
      }
    }
    if (n < tok::kMinVocabSize) {
      return Bad("vocabulary has " + std::to_string(n) + " ids, at least " + std::to_string(tok::kMinVocabSize) +
                 " are required");
    }
    // Real checkpoints round the embedding up past the tokenizer's ids (to a
    // multiple of 64 or 128): the rows beyond are padding, never sampled nor
    // accepted as input. Fewer rows than ids cannot be.
    if (expected_vocab_size && *expected_vocab_size < n) {
      return Bad("vocabulary has " + std::to_string(n) + " ids (0.." + std::to_string(n - 1) +
                 ") but config.json vocab_size is only " + std::to_string(*expected_vocab_size));
    }
    return expected_vocab_size ? *expected_vocab_size : n;
  }

  std::string source_;
  std::map<int, std::string> id_to_content_;
  std::map<std::string, int> content_to_id_;
};

}  // namespace

Result<Tokenizer> Tokenizer::FromJsonText(std::string_view json_text, std::string_view source,
                                          std::optional<int> expected_vocab_size) {
  // A checkpoint's files come from storage its tenant controls: bounded like a request.
  auto parsed = ParseJsonBounded<json>(json_text, kTokenizerJsonLimits, source);
  if (!parsed) return Fail(Error(ErrorCode::kCorruption, parsed.error().message()));
  json doc = std::move(*parsed);
  TokenizerJsonChecker checker(source);
  Result<int> n = Fail(Error::Internal("unreachable"));
  try {
    n = checker.Check(doc, expected_vocab_size);
  } catch (const nlohmann::json::exception& e) {
    // The checker tests types before reading; this is a safety net, not a path.
    return Fail(Error::Corruption(source, std::string("unexpected structure: ") + e.what()));
  }
  if (!n) return Fail(std::move(n).error());
  return Tokenizer(*n);
}

Result<Tokenizer> Tokenizer::FromFile(const std::string& path, std::optional<int> expected_vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::NotFound(path + ": cannot open tokenizer file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Fail(Error::Io(path + ": read failed"));
  return FromJsonText(text.str(), path, expected_vocab_size);
}

Tokenizer Tokenizer::Builtin(int vocab_size) {
  if (vocab_size < tok::kMinVocabSize) {
    log::Error("Tokenizer::Builtin: vocab_size " + std::to_string(vocab_size) + " is below " +
               std::to_string(tok::kMinVocabSize) + "; using " + std::to_string(tok::kMinVocabSize));
    vocab_size = tok::kMinVocabSize;
  }
  return Tokenizer(vocab_size);
}

std::string Tokenizer::ToJson() const {
  // Field order and values follow what the Hugging Face `tokenizers` library
  // writes for a ByteLevel BPE, so its tooling loads the file unchanged.
  ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  ordered_json added = ordered_json::array();
  for (int id = tok::kFirstSpecial; id < tok::kFirstPadding; ++id) {
    added.push_back({{"id", id},
                     {"content", tok::SpecialText(id)},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json vocab = ordered_json::object();
  const auto& names = ByteTokenNames();
  for (int b = 0; b < 256; ++b) vocab[names[b]] = b;
  // Padding lives in model.vocab, not added_tokens: Hugging Face would match
  // added-token text inside user input, and no merge ever produces these.
  for (int id = tok::kFirstPadding; id < vocab_size_; ++id) vocab[PaddingName(id)] = id;

  ordered_json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", nullptr},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", ordered_json::array()}}},
  };
  return doc.dump(2) + "\n";
}

std::vector<int> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string Tokenizer::Decode(std::span<const int> ids, bool render_specials) const {
  std::string out;
  Utf8StreamDecoder utf8;
  for (int id : ids) {
    if (tok::IsByte(id)) {
      out += utf8.Push(static_cast<uint8_t>(id));
      continue;
    }
    // Anything else interrupts the byte stream, shown or not: a half character
    // before it is malformed, and bytes after it never complete it.
    out += utf8.Finish();
    if (tok::IsSpecial(id)) {
      if (render_specials) out += tok::SpecialText(id);
      continue;
    }
    out += kReplacement;
  }
  out += utf8.Finish();
  return out;
}

Status Tokenizer::ValidateInput(std::span<const int> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    int id = ids[i];
    if (id < 0 || id >= vocab_size_) {
      return Fail(Error::InvalidArgument("token at position " + std::to_string(i) + ": id " + std::to_string(id) +
                                         " is outside the vocabulary [0, " + std::to_string(vocab_size_) + ")"));
    }
    if (IsPadding(id)) {
      return Fail(Error::InvalidArgument("token at position " + std::to_string(i) + ": id " + std::to_string(id) +
                                         " is a padding id (" + std::to_string(tok::kFirstPadding) + ".." +
                                         std::to_string(vocab_size_ - 1) + "), which is never valid input"));
    }
  }
  return Ok();
}

// ---- Utf8StreamDecoder: the WHATWG UTF-8 decoder, emitting UTF-8 --------------

void Utf8StreamDecoder::PushInto(uint8_t byte, std::string& out) {
  if (needed_ == 0) {
    if (byte < 0x80) {
      out += static_cast<char>(byte);
      return;
    }
    if (byte >= 0xC2 && byte <= 0xDF) {
      needed_ = 1;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      if (byte == 0xE0) lower_ = 0xA0;  // overlong
      if (byte == 0xED) upper_ = 0x9F;  // surrogates
      needed_ = 2;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      if (byte == 0xF0) lower_ = 0x90;  // overlong
      if (byte == 0xF4) upper_ = 0x8F;  // above U+10FFFF
      needed_ = 3;
    } else {
      out += kReplacement;
      return;
    }
    buffer_[0] = static_cast<char>(byte);
    pending_bytes_ = 1;
    return;
  }
  if (byte < lower_ || byte > upper_) {
    // The sequence so far is one maximal subpart: one U+FFFD, then this byte starts afresh.
    needed_ = 0;
    pending_bytes_ = 0;
    lower_ = 0x80;
    upper_ = 0xBF;
    out += kReplacement;
    PushInto(byte, out);
    return;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  buffer_[pending_bytes_++] = static_cast<char>(byte);
  if (--needed_ == 0) {
    out.append(buffer_, pending_bytes_);
    pending_bytes_ = 0;
  }
}

std::string Utf8StreamDecoder::Push(uint8_t byte) {
  std::string out;
  PushInto(byte, out);
  return out;
}

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  std::string out;
  for (char c : bytes) PushInto(static_cast<uint8_t>(c), out);
  return out;
}

std::string Utf8StreamDecoder::Finish() {
  if (needed_ == 0) return {};
  needed_ = 0;
  pending_bytes_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
  return std::string(kReplacement);
}

}  // namespace moeserve::engine
