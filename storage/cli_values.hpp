// Flags shared by moe-daemon's storage subcommands (pull, publish): sizes
// such as "8MiB", bounded integers (errors name the flag), and the flags that
// say how to reach the object store and how to retry.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/object_source.hpp"
#include "moeserve/storage/retry_policy.hpp"

namespace moeserve::storage {

inline Result<uint64_t> ParseSize(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? end : "";
  uint64_t mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mult = 1ull << 10;
  else if (unit == "M" || unit == "MiB") mult = 1ull << 20;
  else if (unit == "G" || unit == "GiB") mult = 1ull << 30;
  else if (unit == "T" || unit == "TiB") mult = 1ull << 40;
  else return Fail(Error::InvalidArgument(flag + " '" + text + "': expected a size like 8MiB"));
  if (!(v >= 0) || end == text.c_str()) return Fail(Error::InvalidArgument(flag + " '" + text + "': not a size"));
  return static_cast<uint64_t>(v * static_cast<double>(mult));
}

inline Result<long> ParseInt(const std::string& flag, const std::string& text, long min) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < min)
    return Fail(Error::InvalidArgument(flag + " '" + text + "': expected an integer >= " + std::to_string(min)));
  return v;
}

// If `arg` is one of the object-store or retry flags, applies it (taking its
// value from next_value()) and returns true; returns false for any other flag.
template <class NextValue>
Result<bool> ApplyObjectStoreFlag(const std::string& arg, NextValue&& next_value, SourceOptions& store,
                                  RetryPolicy& retry) {
  if (arg == "--path-style") {
    store.addressing = S3AddressingStyle::kPath;
  } else if (arg == "--virtual-host") {
    store.addressing = S3AddressingStyle::kVirtualHost;
  } else if (arg == "--endpoint" || arg == "--region" || arg == "--credentials-file" || arg == "--ca-bundle") {
    std::string* field = arg == "--endpoint"    ? &store.endpoint_url
                         : arg == "--region"    ? &store.region
                         : arg == "--ca-bundle" ? &store.ca_file
                                                : &store.credentials_file;
    MOE_ASSIGN_OR_RETURN(*field, next_value());
  } else if (arg == "--max-attempts") {
    MOE_ASSIGN_OR_RETURN(std::string v, next_value());
    MOE_ASSIGN_OR_RETURN(long n, ParseInt(arg, v, 1));
    retry.max_attempts = static_cast<int>(n);
  } else if (arg == "--retry-base-ms") {
    MOE_ASSIGN_OR_RETURN(std::string v, next_value());
    MOE_ASSIGN_OR_RETURN(long n, ParseInt(arg, v, 0));
    retry.base_delay = std::chrono::milliseconds(n);
  } else {
    return false;
  }
  return true;
}

}  // namespace moeserve::storage
