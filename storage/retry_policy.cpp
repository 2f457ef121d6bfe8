#include "moeserve/storage/retry_policy.hpp"

#include <algorithm>

namespace moeserve::storage {

std::chrono::milliseconds RetryPolicy::Delay(int failures, std::optional<std::chrono::milliseconds> retry_after,
                                             std::mt19937_64& rng) const {
  if (retry_after) return std::min(*retry_after, max_retry_after);
  // Full jitter: uniform in [0, min(max, base * 2^(failures-1))] spreads
  // retries of many workers hitting the same overloaded store.
  int shift = std::clamp(failures - 1, 0, 30);
  int64_t ceiling = std::min<int64_t>(max_delay.count(), base_delay.count() << std::min(shift, 20));
  if (ceiling <= 0) return std::chrono::milliseconds(0);
  std::uniform_int_distribution<int64_t> dist(ceiling / 4, ceiling);  // a floor keeps tight loops away
  return std::chrono::milliseconds(dist(rng));
}

bool IsRetryable(const Error& error) {
  return error.code() == ErrorCode::kUnavailable || error.code() == ErrorCode::kTimeout;
}

}  // namespace moeserve::storage
