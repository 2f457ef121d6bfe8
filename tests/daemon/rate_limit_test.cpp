// daemon.rate_limit: per-tenant requests- and tokens-per-minute buckets under
// an injected clock: a full minute's allowance at first, refusals with the
// seconds until a retry can succeed, refill over time, token debt, and
// tenants that do not share buckets.
#include <gtest/gtest.h>

#include "moeserve/daemon/usage/rate_limiter.hpp"

namespace moeserve::daemon {
namespace {

TEST(RateLimit, RequestsPerMinute) {
  double now = 1000;
  RateLimiter limiter([&] { return now; });
  const RateLimits limits{3, 0};
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("a", limits).allowed) << i;
  auto d = limiter.Admit("a", limits);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.by_tokens);
  EXPECT_EQ(d.retry_after_seconds, 20);  // one request back every 20 s
  EXPECT_TRUE(limiter.Admit("b", limits).allowed);  // another tenant's bucket
  now += 19;
  EXPECT_FALSE(limiter.Admit("a", limits).allowed);
  now += 1;
  EXPECT_TRUE(limiter.Admit("a", limits).allowed);
  EXPECT_FALSE(limiter.Admit("a", limits).allowed);
  now += 3600;  // refills to a minute's worth, no more
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("a", limits).allowed) << i;
  EXPECT_FALSE(limiter.Admit("a", limits).allowed);
  EXPECT_TRUE(limiter.Admit("a", RateLimits{}).allowed);  // no limits: always
}

TEST(RateLimit, TokensPerMinuteWithDebt) {
  double now = 0;
  RateLimiter limiter([&] { return now; });
  const RateLimits limits{0, 600};  // 10 tokens a second
  EXPECT_TRUE(limiter.Admit("a", limits).allowed);
  limiter.Consume("a", limits, 900);  // 300 tokens into debt
  auto d = limiter.Admit("a", limits);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.by_tokens);
  EXPECT_EQ(d.retry_after_seconds, 31);  // (300 + 1) tokens at 10 a second
  now += 30;
  EXPECT_FALSE(limiter.Admit("a", limits).allowed);
  now += 1;
  EXPECT_TRUE(limiter.Admit("a", limits).allowed);
}

}  // namespace
}  // namespace moeserve::daemon
