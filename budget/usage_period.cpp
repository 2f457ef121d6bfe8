#include "moeserve/budget/usage_period.hpp"

#include <chrono>
#include <cstdio>

namespace moeserve {

namespace {
constexpr int64_t kDay = 86400;

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

std::chrono::year_month_day DayOf(int64_t unix_seconds) {
  return std::chrono::year_month_day{std::chrono::sys_days{std::chrono::days{FloorDiv(unix_seconds, kDay)}}};
}

int64_t UnixOf(std::chrono::year_month_day ymd) {
  return static_cast<int64_t>(std::chrono::sys_days{ymd}.time_since_epoch().count()) * kDay;
}
}  // namespace

std::string_view PeriodName(BudgetPeriod p) { return p == BudgetPeriod::kDay ? "day" : "month"; }
std::string_view PeriodAdjective(BudgetPeriod p) { return p == BudgetPeriod::kDay ? "daily" : "monthly"; }

std::optional<BudgetPeriod> ParsePeriod(std::string_view name) {
  if (name == "day") return BudgetPeriod::kDay;
  if (name == "month") return BudgetPeriod::kMonth;
  return std::nullopt;
}

WallClock SystemWallClock() {
  return [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
}

int64_t PeriodStart(BudgetPeriod p, int64_t t) {
  if (p == BudgetPeriod::kDay) return FloorDiv(t, kDay) * kDay;
  auto ymd = DayOf(t);
  return UnixOf(ymd.year() / ymd.month() / std::chrono::day{1});
}

int64_t NextPeriodStart(BudgetPeriod p, int64_t t) {
  if (p == BudgetPeriod::kDay) return PeriodStart(p, t) + kDay;
  auto ymd = DayOf(t);
  auto first = ymd.year() / ymd.month() / std::chrono::day{1};
  return UnixOf(std::chrono::year_month_day{first + std::chrono::months{1}});
}

std::string Iso8601Utc(int64_t t) {
  auto ymd = DayOf(t);
  int64_t s = t - FloorDiv(t, kDay) * kDay;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02dZ", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()), static_cast<int>(s / 3600),
                static_cast<int>(s / 60 % 60), static_cast<int>(s % 60));
  return buf;
}

std::optional<int64_t> ParseIso8601Utc(std::string_view text) {
  int y = 0;
  unsigned mo = 0, d = 0, h = 0, mi = 0, se = 0;
  char z = 0;
  int used = 0;
  const std::string t(text.substr(0, 32));
  if (text.size() != 20 || std::sscanf(t.c_str(), "%4d-%2u-%2uT%2u:%2u:%2u%c%n", &y, &mo, &d, &h, &mi, &se, &z, &used) != 7 ||
      used != 20 || z != 'Z' || h > 23 || mi > 59 || se > 59)
    return std::nullopt;
  const std::chrono::year_month_day ymd{std::chrono::year{y}, std::chrono::month{mo}, std::chrono::day{d}};
  if (!ymd.ok()) return std::nullopt;
  const int64_t out = UnixOf(ymd) + h * 3600 + mi * 60 + se;
  if (Iso8601Utc(out) != text) return std::nullopt;  // digits only where the form has them
  return out;
}

}  // namespace moeserve
