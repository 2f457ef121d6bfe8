// Minimal leveled logging to stderr, one line per call, safe from any thread.
// MOESERVE_LOG_LEVEL=debug|info|warn|error selects the threshold (default info).
#pragma once

#include <string_view>

namespace moeserve::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void Write(Level level, std::string_view message);
bool Enabled(Level level);

inline void Debug(std::string_view m) { Write(Level::kDebug, m); }
inline void Info(std::string_view m) { Write(Level::kInfo, m); }
inline void Warn(std::string_view m) { Write(Level::kWarn, m); }
inline void Error(std::string_view m) { Write(Level::kError, m); }

}  // namespace moeserve::log
