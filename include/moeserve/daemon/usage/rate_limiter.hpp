// Requests- and tokens-per-minute limits per tenant: two token buckets per
// tenant, each holding at most one minute's allowance and refilled
// continuously at limit/60 per second.
//
// A request takes one request from the first bucket when it is admitted.
// Its tokens are not known until it ends, so the token bucket is charged
// then (Consume), and may go below zero: a tenant in token debt is refused
// until the refill brings the bucket back above zero. A refusal says how
// many seconds until a retry can succeed (Retry-After).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "moeserve/budget/usage_period.hpp"

namespace moeserve::daemon {

struct RateLimits {
  int64_t requests_per_minute = 0;  // 0: unlimited
  int64_t tokens_per_minute = 0;
};

class RateLimiter {
 public:
  explicit RateLimiter(WallClock clock) : clock_(std::move(clock)) {}

  struct Decision {
    bool allowed = true;
    bool by_tokens = false;    // refused for tokens (else for requests)
    int retry_after_seconds = 0;
  };
  // Admits one request of `tenant` under `limits`, taking one request.
  Decision Admit(const std::string& tenant, const RateLimits& limits);
  // A finished request's tokens.
  void Consume(const std::string& tenant, const RateLimits& limits, int64_t tokens);

 private:
  struct Bucket {
    double level = 0;
    double at = 0;  // when level was last brought up to date
    bool started = false;
  };
  static void Refill(Bucket& b, double per_minute, double now);

  WallClock clock_;
  std::mutex mu_;
  std::map<std::string, std::pair<Bucket, Bucket>> buckets_;  // tenant -> (requests, tokens)
};

}  // namespace moeserve::daemon
