#include "moeserve/common/rfc3339.hpp"

#include <cstdio>
#include <ctime>

namespace moeserve {

std::string NowRfc3339() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string NowMicroTime() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  char out[48];
  snprintf(out, sizeof out, "%s.%06lldZ", buf, static_cast<long long>(us));
  return out;
}

double ParseMicroTime(const std::string& s) {
  std::tm tm{};
  const char* rest = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!rest) return -1;
  double frac = 0;
  if (*rest == '.') frac = std::atof(rest);
  return static_cast<double>(timegm(&tm)) + frac;
}

}  // namespace moeserve
