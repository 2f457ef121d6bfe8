// Flag values shared by moe-daemon's storage subcommands (pull, publish):
// sizes such as "8MiB" and bounded integers, with errors naming the flag.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon::storage {

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

}  // namespace moeserve::daemon::storage
