#include "moeserve/common/status.hpp"
#include "moeserve/common/sha256.hpp"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Fail(Error::InvalidArgument("x must be even, got " + std::to_string(x)));
  return x / 2;
}

Result<int> Quarter(int x) {
  MOE_ASSIGN_OR_RETURN(int h, Half(x));
  MOE_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, PropagatesErrorsWithCategoryAndMessage) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().ToString(), "invalid argument: x must be even, got 3");
}

TEST(Status, CorruptionNamesTheFile) {
  auto e = Error::Corruption("m/a.safetensors", "tensor 'x': offsets past end");
  EXPECT_EQ(e.message(), "m/a.safetensors: tensor 'x': offsets past end");
  EXPECT_EQ(e.WithContext("loading").message(), "loading: m/a.safetensors: tensor 'x': offsets past end");
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(Sha256Hex(std::string_view("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex(std::string_view("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 h;
  h.Update("a", 1);
  h.Update("bc", 2);
  EXPECT_EQ(h.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

TEST(ErrorField, CarriesTheCulpritThroughContext) {
  Error e = Error::InvalidArgument("system message after a user message").WithField("messages[3]");
  EXPECT_EQ(e.field(), "messages[3]");
  Error wrapped = e.WithContext("rendering");
  EXPECT_EQ(wrapped.field(), "messages[3]");
  EXPECT_EQ(wrapped.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(wrapped.message(), "rendering: system message after a user message");
  EXPECT_EQ(Error::OutOfRange("too long").ToString(), "out of range: too long");
  EXPECT_TRUE(Error::NotFound("x").field().empty());
}

}  // namespace
}  // namespace moeserve
