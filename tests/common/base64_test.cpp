// RFC 4648 section 10 test vectors, both ways; decoding skips line breaks.
#include "moeserve/common/base64.hpp"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> cases[] = {{"", ""},         {"f", "Zg=="},     {"fo", "Zm8="},
                                                       {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                       {"foobar", "Zm9vYmFy"}};
  for (auto [plain, encoded] : cases) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    EXPECT_EQ(Base64Decode(encoded), plain);
  }
  EXPECT_EQ(Base64Decode("Zm9v\nYmFy\n"), "foobar");
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  EXPECT_EQ(Base64Decode(Base64Encode(bytes)), bytes);
}

}  // namespace
}  // namespace moeserve
