// What every fuzz target shares: a check that stops the run with a message.
//
// Why not assert(): the fuzz build may define NDEBUG, and a property the
// target states (a round trip, a bound) must be checked in every build. A
// failed check aborts, which libFuzzer reports as a crash and saves the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond, what)                                                           \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                           \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace moeserve::fuzz {

// The byte-level alphabet's name for byte b (GPT-2's bytes_to_unicode), for
// targets that build a byte-level tokenizer.json of their own. Written here
// independently of the engine's table, which the targets test.
inline std::string ByteLevelName(int b) {
  auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += !printable(x);
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Is s valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF)?
inline bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) { ++i; continue; }
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) { need = 2; lo = 0xA0; }
    else if (b == 0xED) { need = 2; hi = 0x9F; }
    else if (b >= 0xE1 && b <= 0xEF) need = 2;
    else if (b == 0xF0) { need = 3; lo = 0x90; }
    else if (b == 0xF4) { need = 3; hi = 0x8F; }
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else return false;
    if (i + need >= s.size()) return false;  // the sequence is cut off
    for (int k = 1; k <= need; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < lo || c > hi) return false;
      lo = 0x80, hi = 0xBF;
    }
    i += need + 1;
  }
  return true;
}

}  // namespace moeserve::fuzz
