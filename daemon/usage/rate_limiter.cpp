#include "moeserve/daemon/usage/rate_limiter.hpp"

#include <algorithm>
#include <cmath>

namespace moeserve::daemon {

void RateLimiter::Refill(Bucket& b, double per_minute, double now) {
  if (!b.started) {
    // A tenant's first request finds a full minute's allowance.
    b = {per_minute, now, true};
    return;
  }
  b.level = std::min(per_minute, b.level + std::max(0.0, now - b.at) * per_minute / 60.0);
  b.at = now;
}

RateLimiter::Decision RateLimiter::Admit(const std::string& tenant, const RateLimits& limits) {
  if (limits.requests_per_minute <= 0 && limits.tokens_per_minute <= 0) return {};
  const double now = clock_();
  std::lock_guard lock(mu_);
  auto& [requests, tokens] = buckets_[tenant];
  auto wait_for = [](double missing, double per_minute) {
    return std::max(1, static_cast<int>(std::ceil(missing * 60.0 / per_minute)));
  };
  if (limits.tokens_per_minute > 0) {
    Refill(tokens, static_cast<double>(limits.tokens_per_minute), now);
    // Allowed while anything is left: a request's size is not known before it runs.
    if (tokens.level <= 0) return {false, true, wait_for(1 - tokens.level, static_cast<double>(limits.tokens_per_minute))};
  }
  if (limits.requests_per_minute > 0) {
    Refill(requests, static_cast<double>(limits.requests_per_minute), now);
    if (requests.level < 1) {
      return {false, false, wait_for(1 - requests.level, static_cast<double>(limits.requests_per_minute))};
    }
    requests.level -= 1;
  }
  return {};
}

void RateLimiter::Consume(const std::string& tenant, const RateLimits& limits, int64_t n) {
  if (limits.tokens_per_minute <= 0 || n <= 0) return;
  const double now = clock_();
  std::lock_guard lock(mu_);
  auto& tokens = buckets_[tenant].second;
  Refill(tokens, static_cast<double>(limits.tokens_per_minute), now);
  tokens.level -= static_cast<double>(n);
}

}  // namespace moeserve::daemon
