#include "moeserve/common/base64.hpp"

#include <array>

namespace moeserve {

namespace {
constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int, 256> MakeDecodeTable() {
  std::array<int, 256> t{};
  for (int& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[static_cast<size_t>(i)])] = i;
  return t;
}
constexpr std::array<int, 256> kDecode = MakeDecodeTable();
}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  int val = 0, bits = -6;
  for (unsigned char c : in) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(kAlphabet[static_cast<size_t>((val >> bits) & 0x3F)]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(kAlphabet[static_cast<size_t>(((val << 8) >> (bits + 8)) & 0x3F)]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

std::string Base64Decode(std::string_view in) {
  std::string out;
  int val = 0, bits = -8;
  for (unsigned char c : in) {
    if (kDecode[c] == -1) continue;
    val = (val << 6) + kDecode[c];
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

}  // namespace moeserve
