// Reads tokenizer.json into a Pipeline. Every feature is either built as the
// `tokenizers` crate runs it or refused with an error that names it
// (docs/tokenizers.md lists both): a tokenizer that silently skipped a
// normalizer or a pre-tokenizer would give plausible, wrong ids.
#include <nlohmann/json.hpp>

#include "hf_tokenizer/pipeline.hpp"
#include "moeserve/common/json_limits.hpp"

namespace moeserve::engine::hf {

namespace {

// std::map-backed: ordered_json's linear key search is quadratic on a
// vocabulary of 200k tokens.
using json = nlohmann::json;

// gpt-oss's file is 27 MB (446k merges); leave room for larger vocabularies.
constexpr JsonLimits kLimits{.max_bytes = 512u << 20, .max_depth = kMaxJsonDepth};

class Loader {
 public:
  explicit Loader(std::string_view source) : source_(source) {}

  Result<std::shared_ptr<const Pipeline>> Load(const json& doc) {
    if (!doc.is_object()) return Bad("top level is not a JSON object");
    auto p = std::make_shared<Pipeline>();
    for (const char* key : {"truncation", "padding"}) {
      if (doc.contains(key) && !doc[key].is_null()) {
        return Bad(std::string("\"") + key + "\" is not supported (ids are never cut or padded here); it must be null");
      }
    }
    MOE_TRY(LoadModel(doc, *p));
    if (doc.contains("normalizer")) MOE_TRY(LoadNormalizer(doc["normalizer"], "normalizer", p->normalizer));
    if (doc.contains("pre_tokenizer")) MOE_TRY(LoadPreTokenizer(doc["pre_tokenizer"], "pre_tokenizer", *p));
    MOE_TRY(LoadAddedTokens(doc, *p));
    MOE_TRY(LoadDecoder(doc, *p));
    // post_processor only adds special tokens around a sequence (and offsets):
    // Encode never adds any, so it is read by nothing.
    return std::shared_ptr<const Pipeline>(std::move(p));
  }

 private:
  std::unexpected<Error> Bad(std::string_view what) const { return Fail(Error::Corruption(source_, what)); }

  static std::string TypeOf(const json& v) {
    return v.is_object() && v.contains("type") && v["type"].is_string() ? v["type"].get<std::string>() : "";
  }

  // A boolean field, false when absent or null; anything else is an error.
  Result<bool> Flag(const json& obj, const char* key, std::string_view where) const {
    if (!obj.contains(key) || obj[key].is_null()) return false;
    if (!obj[key].is_boolean()) return Bad(std::string(where) + "." + key + " must be true or false");
    return obj[key].get<bool>();
  }

  static std::optional<int> IdOf(const json& v) {
    if (!v.is_number_integer()) return std::nullopt;
    if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX : (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX))
      return std::nullopt;
    return static_cast<int>(v.get<int64_t>());
  }

  Status ClaimId(Pipeline& p, int id, const std::string& text, std::string_view where) {
    if (static_cast<size_t>(id) >= p.token_text.size()) p.token_text.resize(static_cast<size_t>(id) + 1);
    std::string& slot = p.token_text[static_cast<size_t>(id)];
    if (!slot.empty() && slot != text) {
      return Bad(std::string(where) + ": id " + std::to_string(id) + " is given to both '" + slot + "' and '" + text + "'");
    }
    slot = text;
    return Ok();
  }

  Status LoadModel(const json& doc, Pipeline& p) {
    if (!doc.contains("model") || !doc["model"].is_object()) return Bad("missing \"model\" object");
    const json& m = doc["model"];
    std::string type = TypeOf(m);
    if (type.empty() && m.contains("merges")) type = "BPE";  // older files leave the type out
    if (type != "BPE") return Bad("model.type \"" + type + "\" is not supported (only BPE)");
    MOE_ASSIGN_OR_RETURN(bool byte_fallback, Flag(m, "byte_fallback", "model"));
    if (byte_fallback) return Bad("model.byte_fallback: true is not supported (byte-level BPE needs no fallback)");
    if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"] == 0)) {
      return Bad("model.dropout is not supported (encoding would be random); it must be null");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
        return Bad(std::string("model.") + key + " is not supported; it must be null or empty");
      }
    }
    MOE_ASSIGN_OR_RETURN(p.model.ignore_merges, Flag(m, "ignore_merges", "model"));
    MOE_ASSIGN_OR_RETURN(p.model.fuse_unk, Flag(m, "fuse_unk", "model"));

    if (!m.contains("vocab") || !m["vocab"].is_object()) return Bad("missing model.vocab object");
    p.model.vocab.reserve(m["vocab"].size());
    for (const auto& [token, id_json] : m["vocab"].items()) {
      std::optional<int> id = IdOf(id_json);
      if (!id) return Bad("model.vocab: token '" + token + "' has id " + id_json.dump() + ", not a non-negative integer");
      if (token.empty()) return Bad("model.vocab: the empty string is not a token");
      MOE_TRY(ClaimId(p, *id, token, "model.vocab"));
      p.model.vocab.emplace(token, *id);
    }
    p.model.IndexCharacters();
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      if (!m["unk_token"].is_string()) return Bad("model.unk_token must be a string or null");
      auto it = p.model.vocab.find(m["unk_token"].get<std::string>());
      if (it == p.model.vocab.end()) return Bad("model.unk_token '" + m["unk_token"].get<std::string>() + "' is not in model.vocab");
      p.model.unk_id = it->second;
    }

    if (!m.contains("merges")) return Ok();
    if (!m["merges"].is_array()) return Bad("model.merges must be an array");
    const json& merges = m["merges"];
    p.model.merges.Reserve(merges.size());
    uint32_t rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& merge = merges[i];
      std::string left, right;
      std::string where = "model.merges[" + std::to_string(i) + "]";
      if (merge.is_string()) {
        // "a b": exactly one space (byte-level tokens never hold one).
        const std::string& line = merge.get_ref<const std::string&>();
        if (line.starts_with("#version")) continue;
        size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          return Bad(where + ": \"" + line + "\" is not two tokens separated by one space");
        }
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return Bad(where + " must be \"a b\" or [\"a\", \"b\"], got " + merge.dump().substr(0, 80));
      }
      auto l = p.model.vocab.find(left), r = p.model.vocab.find(right), merged = p.model.vocab.find(left + right);
      for (const auto& [it, tok] : {std::pair{l, left}, std::pair{r, right}, std::pair{merged, left + right}}) {
        if (it == p.model.vocab.end()) return Bad(where + ": token '" + tok + "' is not in model.vocab");
      }
      // A pair listed twice keeps its last rank, as the library's HashMap collect does.
      p.model.merges.Set(MergeTable::Key(l->second, r->second), Bpe::Merge{rank, merged->second});
      ++rank;
    }
    return Ok();
  }

  Status LoadNormalizer(const json& n, const std::string& where, Normalizer& out) {
    if (n.is_null()) return Ok();
    std::string type = TypeOf(n);
    if (type == "Sequence") {
      if (!n.contains("normalizers") || !n["normalizers"].is_array()) return Bad(where + ".normalizers must be an array");
      for (size_t i = 0; i < n["normalizers"].size(); ++i) {
        MOE_TRY(LoadNormalizer(n["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]", out));
      }
      return Ok();
    }
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* form = nullptr;
    if (type == "NFC") form = icu::Normalizer2::getNFCInstance(status);
    else if (type == "NFD") form = icu::Normalizer2::getNFDInstance(status);
    else if (type == "NFKC") form = icu::Normalizer2::getNFKCInstance(status);
    else if (type == "NFKD") form = icu::Normalizer2::getNFKDInstance(status);
    else return Bad(where + ": normalizer type \"" + type + "\" is not supported (NFC, NFD, NFKC, NFKD, Sequence are)");
    if (U_FAILURE(status) || !form) return Bad(where + ": ICU could not provide " + type + ": " + u_errorName(status));
    out.Add(form);
    return Ok();
  }

  Status LoadPreTokenizer(const json& t, const std::string& where, Pipeline& p) {
    if (t.is_null()) return Ok();
    std::string type = TypeOf(t);
    if (type == "Sequence") {
      if (!t.contains("pretokenizers") || !t["pretokenizers"].is_array()) return Bad(where + ".pretokenizers must be an array");
      for (size_t i = 0; i < t["pretokenizers"].size(); ++i) {
        MOE_TRY(LoadPreTokenizer(t["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]", p));
      }
      return Ok();
    }
    if (type == "ByteLevel") {
      ByteLevelStep step;
      MOE_ASSIGN_OR_RETURN(step.add_prefix_space, Flag(t, "add_prefix_space", where));
      step.use_regex = !t.contains("use_regex") || t["use_regex"].is_null() || t["use_regex"] == true;
      p.pre_tokenizer.push_back(step);
      return Ok();
    }
    if (type == "Split") return LoadSplit(t, where, p);
    return Bad(where + ": pre-tokenizer type \"" + type + "\" is not supported (Split, ByteLevel, Sequence are)");
  }

  Status LoadSplit(const json& t, const std::string& where, Pipeline& p) {
    SplitStep step;
    if (!t.contains("pattern") || !t["pattern"].is_object()) return Bad(where + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    const json& pattern = t["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      std::string error;
      const std::string& source = pattern["Regex"].get_ref<const std::string&>();
      step.regex = Regex::Compile(source, error);
      if (!step.regex) return Bad(where + ".pattern.Regex does not compile (Oniguruma: " + error + ")");
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      step.literal = pattern["String"].get<std::string>();
      if (step.literal.empty()) return Bad(where + ".pattern.String must not be empty");
    } else {
      return Bad(where + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    std::string behavior = t.contains("behavior") && t["behavior"].is_string() ? t["behavior"].get<std::string>() : "";
    if (behavior == "Isolated") step.behavior = SplitBehavior::kIsolated;
    else if (behavior == "Removed") step.behavior = SplitBehavior::kRemoved;
    else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = SplitBehavior::kContiguous;
    else return Bad(where + ".behavior \"" + behavior + "\" is not a split behaviour (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous)");
    MOE_ASSIGN_OR_RETURN(step.invert, Flag(t, "invert", where));
    p.pre_tokenizer.push_back(std::move(step));
    return Ok();
  }

  Status LoadAddedTokens(const json& doc, Pipeline& p) {
    if (!doc.contains("added_tokens") || doc["added_tokens"].is_null()) return Ok();
    if (!doc["added_tokens"].is_array()) return Bad("\"added_tokens\" must be an array");
    const json& list = doc["added_tokens"];
    p.added.reserve(list.size());  // the matchers point into this vector: no reallocation after
    for (size_t i = 0; i < list.size(); ++i) {
      const json& t = list[i];
      std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("id") || !IdOf(t["id"]) || !t.contains("content") || !t["content"].is_string()) {
        return Bad(where + ": needs a non-negative integer \"id\" and a string \"content\"");
      }
      AddedToken token;
      token.id = *IdOf(t["id"]);
      token.content = t["content"].get<std::string>();
      if (token.content.empty()) return Bad(where + ": content must not be empty");
      MOE_ASSIGN_OR_RETURN(token.special, Flag(t, "special", where));
      MOE_ASSIGN_OR_RETURN(token.single_word, Flag(t, "single_word", where));
      MOE_ASSIGN_OR_RETURN(token.lstrip, Flag(t, "lstrip", where));
      MOE_ASSIGN_OR_RETURN(token.rstrip, Flag(t, "rstrip", where));
      // The library's default: special tokens are matched in raw text, others after normalization.
      token.normalized = !token.special;
      if (t.contains("normalized") && !t["normalized"].is_null()) {
        MOE_ASSIGN_OR_RETURN(token.normalized, Flag(t, "normalized", where));
      }
      if (token.single_word) return Bad(where + " ('" + token.content + "'): single_word: true is not supported");
      if (auto in_vocab = p.model.vocab.find(token.content); in_vocab != p.model.vocab.end() && in_vocab->second != token.id) {
        return Bad(where + ": '" + token.content + "' has id " + std::to_string(token.id) + " but model.vocab gives it " +
                   std::to_string(in_vocab->second));
      }
      if (p.added_by_content.contains(token.content)) return Bad(where + ": '" + token.content + "' is listed twice");
      MOE_TRY(ClaimId(p, token.id, token.content, where));
      p.added_by_content.emplace(token.content, token.id);
      p.added.push_back(std::move(token));
    }
    p.is_special.assign(p.token_text.size(), 0);
    for (const AddedToken& token : p.added) {
      if (token.special) p.is_special[static_cast<size_t>(token.id)] = 1;
      if (!token.normalized) {
        p.raw_tokens.Add(token.content, &token);
      } else {
        // Matched in normalized text, so the pattern is normalized too.
        std::string pattern = token.content;
        p.normalizer.Normalize(pattern);
        p.normalized_tokens.Add(pattern, &token);
      }
    }
    return Ok();
  }

  Status LoadDecoder(const json& doc, Pipeline& p) {
    const json* d = doc.contains("decoder") ? &doc["decoder"] : nullptr;
    // Sequence [ByteLevel] is ByteLevel.
    if (d && TypeOf(*d) == "Sequence" && d->contains("decoders") && (*d)["decoders"].is_array() &&
        (*d)["decoders"].size() == 1) {
      d = &(*d)["decoders"][0];
    }
    if (!d || d->is_null() || TypeOf(*d) != "ByteLevel") {
      return Bad("decoder \"" + (d && !d->is_null() ? TypeOf(*d) : std::string("null")) +
                 "\" is not supported (only ByteLevel)");
    }
    // ByteLevel: a token whose every char is a byte char stands for those
    // bytes; any other token (added tokens with other characters) for its own UTF-8.
    p.is_special.resize(p.token_text.size(), 0);
    p.token_bytes.resize(p.token_text.size());
    for (size_t id = 0; id < p.token_text.size(); ++id) {
      const std::string& text = p.token_text[id];
      std::string bytes;
      bool all_bytes = true;
      for (size_t i = 0; i < text.size() && all_bytes;) {
        size_t n = std::min(Utf8Length(static_cast<unsigned char>(text[i])), text.size() - i);
        int b = ByteOfByteLevelChar(std::string_view(text).substr(i, n));
        if (b < 0) all_bytes = false;
        else bytes += static_cast<char>(b);
        i += n;
      }
      p.token_bytes[id] = all_bytes ? std::move(bytes) : text;
    }
    return Ok();
  }

  std::string source_;
};

}  // namespace

Result<std::shared_ptr<const Pipeline>> LoadPipeline(std::string_view json_text, std::string_view source) {
  auto parsed = ParseJsonBounded<json>(json_text, kLimits, source);
  if (!parsed) return Fail(Error(ErrorCode::kCorruption, parsed.error().message()));
  try {
    return Loader(source).Load(*parsed);
  } catch (const nlohmann::json::exception& e) {
    // The loader tests types before reading; this is a safety net, not a path.
    return Fail(Error::Corruption(source, std::string("unexpected structure: ") + e.what()));
  }
}

}  // namespace moeserve::engine::hf
