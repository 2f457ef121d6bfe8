// RFC 3339 timestamps in UTC, as Kubernetes writes them: Time (seconds) and
// MicroTime (microseconds).
#pragma once

#include <chrono>
#include <string>

namespace moeserve {

std::string NowRfc3339();
std::string NowMicroTime();
// Seconds since the epoch, or nullopt-like -1 when unparseable.
double ParseMicroTime(const std::string& s);

}  // namespace moeserve
