// choices[].logprobs (include/moeserve/daemon/completions/logprobs_json.hpp).
#include "moeserve/daemon/completions/logprobs_json.hpp"

#include <algorithm>
#include <cmath>

#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::daemon {

using json = nlohmann::json;

namespace {

// The length of the valid UTF-8 character starting at bytes[i], or 0 when
// none does (the rules of engine::Utf8StreamDecoder: no overlong forms, no
// surrogates, nothing above U+10FFFF, no character cut off by the end).
size_t CharLength(std::string_view bytes, size_t i) {
  const auto b = static_cast<uint8_t>(bytes[i]);
  if (b < 0x80) return 1;
  size_t n = 0;
  uint8_t lower = 0x80, upper = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lower = 0xA0;
    if (b == 0xED) upper = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lower = 0x90;
    if (b == 0xF4) upper = 0x8F;
  } else {
    return 0;
  }
  if (i + n > bytes.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(bytes[i + k]);
    if (c < lower || c > upper) return 0;
    lower = 0x80, upper = 0xBF;  // only the second byte has the narrower range
  }
  return n;
}

std::string TokenBytes(int token, const engine::HfTokenizer* tokenizer) {
  if (tokenizer) return std::string(tokenizer->TokenBytes(token));
  if (engine::tok::IsByte(token)) return std::string(1, static_cast<char>(token));
  return std::string(engine::tok::SpecialText(token));
}

json TokenJson(int token, float logprob, const engine::HfTokenizer* tokenizer) {
  const std::string raw = TokenBytes(token, tokenizer);
  json bytes = json::array();
  for (unsigned char c : raw) bytes.push_back(c);
  const double lp = std::isfinite(logprob) ? std::max(static_cast<double>(logprob), -9999.0) : -9999.0;
  return {{"token", TokenText(raw)}, {"logprob", lp}, {"bytes", std::move(bytes)}};
}

}  // namespace

std::string TokenText(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    if (size_t n = CharLength(bytes, i)) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      const auto b = static_cast<uint8_t>(bytes[i++]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
  }
  return out;
}

json LogprobsJson(const std::vector<ContentLogprob>& tokens, const engine::HfTokenizer* tokenizer) {
  json content = json::array();
  for (const auto& t : tokens) {
    json entry = TokenJson(t.token, t.logprob, tokenizer);
    json top = json::array();
    for (const auto& alt : t.top) top.push_back(TokenJson(alt.token, alt.logprob, tokenizer));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace moeserve::daemon
