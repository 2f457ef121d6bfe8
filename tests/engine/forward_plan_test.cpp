// The message rank 0 sends its followers before each forward pass: round
// trip, and every truncation or corruption of a valid message is an error
// value (never a crash or an oversized allocation).
#include "../../engine/forward_plan.hpp"

#include <gtest/gtest.h>

#include <random>

namespace moeserve::engine {
namespace {

ForwardPlan Sample() {
  ForwardPlan p;
  p.kind = ForwardPlan::Kind::kForward;
  p.retired = {3, 9};
  p.segments.push_back({7, 0, true, {256, 258, 65, 66}, {0, 1}});
  p.segments.push_back({8, 33, false, {42}, {2, 3, 4}});
  return p;
}

TEST(ForwardPlan, RoundTrips) {
  auto bytes = EncodeForwardPlan(Sample());
  auto back = DecodeForwardPlan(bytes);
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(back->kind, ForwardPlan::Kind::kForward);
  EXPECT_EQ(back->retired, (std::vector<uint64_t>{3, 9}));
  ASSERT_EQ(back->segments.size(), 2u);
  EXPECT_EQ(back->segments[0].tokens, (std::vector<int>{256, 258, 65, 66}));
  EXPECT_TRUE(back->segments[0].all_logits);
  EXPECT_EQ(back->segments[1].pos0, 33);
  EXPECT_EQ(back->segments[1].blocks, (std::vector<int>{2, 3, 4}));
}

TEST(ForwardPlan, EveryTruncationIsAnError) {
  auto bytes = EncodeForwardPlan(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = DecodeForwardPlan(std::span<const uint8_t>(bytes.data(), n));
    EXPECT_FALSE(r) << "prefix of " << n << " bytes decoded";
  }
  bytes.push_back(0);
  auto trailing = DecodeForwardPlan(bytes);
  ASSERT_FALSE(trailing);
  EXPECT_NE(trailing.error().ToString().find("trailing"), std::string::npos);
}

TEST(ForwardPlan, HugeCountsAndRandomBytesAreRefused) {
  // A retired list claiming 2^32-1 entries in a 9-byte message.
  std::vector<uint8_t> huge = {1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
  EXPECT_FALSE(DecodeForwardPlan(huge));
  std::vector<uint8_t> bad_kind = {9, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_FALSE(DecodeForwardPlan(bad_kind));
  std::mt19937 rng(3);
  auto valid = EncodeForwardPlan(Sample());
  int decoded = 0;
  for (int i = 0; i < 2000; ++i) {
    auto b = valid;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (auto r = DecodeForwardPlan(b)) {
      ++decoded;  // a flipped token or key still parses: the structure is intact
      for (const auto& s : r->segments) EXPECT_FALSE(s.tokens.empty());
    }
  }
  EXPECT_LT(decoded, 2000);
}

}  // namespace
}  // namespace moeserve::engine
