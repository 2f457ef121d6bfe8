#include "moeserve/common/log.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

namespace moeserve::log {
namespace {

Level ThresholdFromEnv() {
  const char* v = std::getenv("MOESERVE_LOG_LEVEL");
  if (!v) return Level::kInfo;
  std::string s(v);
  if (s == "debug") return Level::kDebug;
  if (s == "warn") return Level::kWarn;
  if (s == "error") return Level::kError;
  return Level::kInfo;
}

const char* Name(Level l) {
  switch (l) {
    case Level::kDebug: return "DEBUG";
    case Level::kInfo: return "INFO";
    case Level::kWarn: return "WARN";
    case Level::kError: return "ERROR";
  }
  return "?";
}

}  // namespace

bool Enabled(Level level) {
  static const Level threshold = ThresholdFromEnv();
  return level >= threshold;
}

void Write(Level level, std::string_view message) {
  if (!Enabled(level)) return;
  static std::mutex mu;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s.%03lldZ %s %.*s\n", stamp, static_cast<long long>(ms), Name(level),
               static_cast<int>(message.size()), message.data());
}

}  // namespace moeserve::log
