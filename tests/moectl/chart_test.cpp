// moectl.chart: the spend chart decoded back from its PNG (cairo reads it):
// its size, the budget limit drawn in its colour on the row its value maps
// to and nowhere near it, the threshold below it, the spend in its colour;
// the y range chosen when none is given; a path that cannot be written.
#include <gtest/gtest.h>

#include <cmath>

#include "moectl_support.hpp"
#include "moeserve/moectl/spend_chart.hpp"

namespace moeserve::moectl::testing {
namespace {

constexpr int64_t kDayStart = 1764806400;  // 2025-12-04T00:00:00Z

SpendHistory DayOfSpend() {
  SpendHistory h;
  h.tenant = "acme";
  h.period = "day";
  h.period_start = kDayStart;
  h.period_end = kDayStart + 86400;
  h.now = kDayStart + 20 * 3600 + 600;
  // $30 by 02:00, $60 by 09:00, $90 by 17:00: under the $100 limit all day.
  h.points = {{kDayStart + 1 * 3600, 30.0}, {kDayStart + 8 * 3600, 60.0}, {kDayStart + 16 * 3600, 90.0}};
  h.budgets = {BudgetLine{100.0, {0.5, 1.0}, "block"}};
  return h;
}

TEST(Chart, TheBudgetLineIsOnTheRowOfItsValueAndNowhereElse) {
  ChartLayout layout;
  layout.width = 800;
  layout.height = 600;
  layout.margin_left = 90, layout.margin_right = 30, layout.margin_top = 70, layout.margin_bottom = 60;
  layout.y_max = 200;
  const std::string png = TempPath("fixed.png");
  double used = 0;
  auto st = DrawSpendChart(DayOfSpend(), layout, png, &used);
  ASSERT_TRUE(st) << st.error().ToString();
  EXPECT_EQ(used, 200);

  Image im;
  std::string error;
  ASSERT_TRUE(ReadPng(png, &im, &error)) << error;
  EXPECT_EQ(im.width, 800);
  EXPECT_EQ(im.height, 600);

  // The plot spans rows 70..540; $100 of $200 is half way: row 540 - 235 = 305
  // (the two-pixel line covers 304 and 305). Columns 92..768 lie inside the plot.
  const int x0 = 92, x1 = 768, width = x1 - x0;
  const uint32_t red = Rgb(ChartColors::kBudget), orange = Rgb(ChartColors::kThreshold), blue = Rgb(ChartColors::kSpend);
  EXPECT_GE(CountInRow(im, 305, x0, x1, red), width * 9 / 10);
  EXPECT_GE(CountInRow(im, 304, x0, x1, red), width * 9 / 10);
  for (int y = 70; y < 540; ++y) {
    if (y == 304 || y == 305) continue;
    EXPECT_EQ(CountInRow(im, y, x0, x1, red), 0) << "budget colour on row " << y;
  }
  // The 50% threshold ($50) is dashed: row round(540 - 117.5) = 423, about
  // 8 of every 13 pixels.
  EXPECT_GE(CountInRow(im, 423, x0, x1, orange), width * 4 / 10);
  EXPECT_EQ(CountInRow(im, 300, x0, x1, orange), 0);
  // The spend line is drawn, inside the plot.
  int spend = 0;
  for (int y = 70; y < 540; ++y) spend += CountInRow(im, y, x0, x1, blue);
  EXPECT_GT(spend, 500);
}

TEST(Chart, WithoutAGivenRangeTheLimitAndSpendFitWithRoomAbove) {
  SpendHistory h = DayOfSpend();
  h.points.push_back({kDayStart + 19 * 3600, 130.0});  // past the limit
  ChartLayout layout;  // 960x540, automatic range
  const std::string png = TempPath("auto.png");
  double used = 0;
  auto st = DrawSpendChart(h, layout, png, &used);
  ASSERT_TRUE(st) << st.error().ToString();
  EXPECT_GE(used, 130 * 1.15 - 1e-9);
  EXPECT_LE(used, 130 * 1.15 * 2);
  Image im;
  std::string error;
  ASSERT_TRUE(ReadPng(png, &im, &error)) << error;
  EXPECT_EQ(im.width, 960);
  EXPECT_EQ(im.height, 540);
  const int row = static_cast<int>(std::lround(480 - 100.0 / used * 410));  // plot rows 70..480
  const int x0 = layout.margin_left + 2, x1 = 960 - layout.margin_right;
  EXPECT_GE(CountInRow(im, row, x0, x1, Rgb(ChartColors::kBudget)), (x1 - x0) * 8 / 10);
  EXPECT_EQ(CountInRow(im, row + 12, x0, x1, Rgb(ChartColors::kBudget)), 0);
}

TEST(Chart, AnUnwritablePathIsAnErrorNamingIt) {
  auto st = DrawSpendChart(DayOfSpend(), ChartLayout{}, "/nonexistent-dir/usage.png");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("/nonexistent-dir/usage.png"), std::string::npos) << st.error().message();
}

TEST(Chart, ASizeOutOfBoundsIsRefused) {
  ChartLayout layout;
  layout.width = 100000;
  EXPECT_FALSE(DrawSpendChart(DayOfSpend(), layout, TempPath("huge.png")));
}

}  // namespace
}  // namespace moeserve::moectl::testing
