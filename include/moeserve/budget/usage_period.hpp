// Budget periods (`day`, `month`) on UTC boundaries, and the wall clock that
// places usage in them. The clock is injected so that tests can cross a
// midnight or a month's end without waiting for one.
//
// Thread safety: free functions are pure; a WallClock is called from any
// thread (SystemWallClock reads the system clock; test clocks must be safe
// to read concurrently).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve {

enum class BudgetPeriod { kDay, kMonth };

inline constexpr BudgetPeriod kAllPeriods[] = {BudgetPeriod::kDay, BudgetPeriod::kMonth};

std::string_view PeriodName(BudgetPeriod p);  // "day" | "month"
std::string_view PeriodAdjective(BudgetPeriod p);  // "daily" | "monthly", for messages
std::optional<BudgetPeriod> ParsePeriod(std::string_view name);

// Unix seconds (may carry a fraction). Production: the system clock.
using WallClock = std::function<double()>;
WallClock SystemWallClock();

// The start of the period that holds `unix_seconds` (00:00 UTC of the day,
// or of the month's first day), and the start of the next one.
int64_t PeriodStart(BudgetPeriod p, int64_t unix_seconds);
int64_t NextPeriodStart(BudgetPeriod p, int64_t unix_seconds);

// "2026-12-04T00:00:00Z"
std::string Iso8601Utc(int64_t unix_seconds);
// Its inverse: exactly that form, a real date and time; else nullopt.
std::optional<int64_t> ParseIso8601Utc(std::string_view text);

}  // namespace moeserve
