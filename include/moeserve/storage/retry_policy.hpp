// When to try a failed transfer again and how long to wait first: exponential
// backoff with full jitter (AWS architecture blog, "Exponential Backoff And
// Jitter"), a server's Retry-After taking precedence when it sent one.
#pragma once

#include <chrono>
#include <optional>
#include <random>

#include "moeserve/common/status.hpp"

namespace moeserve::storage {

struct RetryPolicy {
  // Consecutive failed attempts of one part without any new byte; an attempt
  // that made progress resets the count, so a flaky link still finishes.
  int max_attempts = 8;
  std::chrono::milliseconds base_delay{200};
  std::chrono::milliseconds max_delay{10000};
  std::chrono::milliseconds max_retry_after{60000};  // a larger Retry-After is clamped

  // Wait before attempt number `failures` + 1 (failures >= 1).
  std::chrono::milliseconds Delay(int failures, std::optional<std::chrono::milliseconds> retry_after,
                                  std::mt19937_64& rng) const;
};

// kUnavailable and kTimeout are transient; everything else is final.
bool IsRetryable(const Error& error);

}  // namespace moeserve::storage
