// Kubernetes timestamps: RFC 3339 (Time) and with microseconds (MicroTime).
#pragma once

#include <chrono>
#include <string>

namespace moeserve::op {

std::string NowRfc3339();
std::string NowMicroTime();
// Seconds since the epoch, or nullopt-like -1 when unparseable.
double ParseMicroTime(const std::string& s);

}  // namespace moeserve::op
