// Text primitives of the tokenizer.json pipeline: GPT-2's byte-to-char
// table, UTF-8 validation, Oniguruma regexes and ICU normalization.
#include <array>
#include <mutex>
#include <optional>

#include <unicode/bytestream.h>

#include "hf_tokenizer/pipeline.hpp"

namespace moeserve::engine::hf {

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::unordered_map<uint32_t, uint8_t> byte_of_code_point;
};

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Printable Latin-1 bytes stand for themselves; the other 68 bytes take
// U+0100 upwards in byte order (GPT-2's bytes_to_unicode).
const ByteLevelTables& Tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      AppendUtf8(cp, t.chars[b]);
      t.byte_of_code_point[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t b) { return Tables().chars[b]; }

int ByteOfByteLevelChar(std::string_view c) {
  uint32_t cp;
  if (c.size() == 1 && static_cast<unsigned char>(c[0]) < 0x80) {
    cp = static_cast<unsigned char>(c[0]);
  } else if (c.size() == 2 && (static_cast<unsigned char>(c[0]) & 0xE0) == 0xC0) {
    cp = ((static_cast<unsigned char>(c[0]) & 0x1F) << 6) | (static_cast<unsigned char>(c[1]) & 0x3F);
  } else {
    return -1;
  }
  const auto& map = Tables().byte_of_code_point;
  auto it = map.find(cp);
  return it == map.end() ? -1 : it->second;
}

bool IsValidUtf8(std::string_view text) {
  size_t i = 0, n = text.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    for (int k = 1; k <= need; ++k) {
      if (i + k >= n) return false;
      unsigned char b = static_cast<unsigned char>(text[i + k]);
      if (b < lo || b > hi) return false;
      lo = 0x80;
      hi = 0xBF;
    }
    i += need + 1;
  }
  return true;
}

// ---- Regex ----------------------------------------------------------------

std::unique_ptr<Regex> Regex::Compile(std::string_view pattern, std::string& error) {
  static std::once_flag init;
  std::call_once(init, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
  OnigRegex regex = nullptr;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  int r = onig_new(&regex, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                   ONIG_SYNTAX_ONIGURUMA, &info);
  if (r != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, r, &info);
    error = reinterpret_cast<const char*>(message);
    return nullptr;
  }
  return std::unique_ptr<Regex>(new Regex(regex));
}

Regex::~Regex() { onig_free(regex_); }

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  // The onig crate's find_iter: an empty match right where the last match
  // ended is passed over by one character, so the search always advances.
  struct RegionFree {
    void operator()(OnigRegion* r) const { onig_region_free(r, 1); }
  };
  thread_local std::unique_ptr<OnigRegion, RegionFree> region(onig_region_new());
  const auto* s = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = s + text.size();
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= text.size()) {
    int r = onig_search(regex_, s, end, s + last_end, end, region.get(), ONIG_OPTION_NONE);
    if (r < 0) break;  // ONIG_MISMATCH (or a search error, which ends the matches)
    size_t beg = static_cast<size_t>(region->beg[0]), stop = static_cast<size_t>(region->end[0]);
    if (beg == stop && last_match_end == stop) {
      last_end += last_end < text.size() ? Utf8Length(s[last_end]) : 1;
      continue;
    }
    matches.emplace_back(beg, stop);
    last_end = stop;
    last_match_end = stop;
  }
}

// ---- Normalizer -------------------------------------------------------------

void Normalizer::Normalize(std::string& text) const {
  for (const icu::Normalizer2* form : forms_) {
    UErrorCode status = U_ZERO_ERROR;
    if (form->isNormalizedUTF8(text, status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    std::string out;
    out.reserve(text.size() + text.size() / 4);
    icu::StringByteSink<std::string> sink(&out);
    form->normalizeUTF8(0, text, sink, nullptr, status);
    if (U_SUCCESS(status)) text = std::move(out);  // input is valid UTF-8: ICU does not fail on it
  }
}

}  // namespace moeserve::engine::hf
