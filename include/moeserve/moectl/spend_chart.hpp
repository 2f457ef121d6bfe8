// A tenant's spend over a budget period drawn as a PNG with cairo: the
// cumulative spend (blue), each budget's limit (red, solid) and its other
// thresholds (orange, dashed), axes with ticks and labels in UTC, a title and
// a legend above the plot. Horizontal lines sit on whole pixel rows, so the
// row a value is drawn at is ChartLayout::RowFor(value).
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/moectl/usage_data.hpp"

namespace moeserve::moectl {

struct ChartLayout {
  int width = 960, height = 540;
  int margin_left = 90, margin_right = 30, margin_top = 70, margin_bottom = 60;
  double y_max = 0;  // 0: 1.15 x the largest of spend and limits, rounded up to a tick
  int plot_top() const { return margin_top; }
  int plot_bottom() const { return height - margin_bottom; }
  int plot_left() const { return margin_left; }
  int plot_right() const { return width - margin_right; }
  // The pixel row a horizontal line at `usd` covers (with the one above it):
  // round(bottom - usd / y_max x plot height).
  int RowFor(double usd, double y_max_used) const;
};

struct ChartColors {
  static constexpr unsigned char kSpend[3] = {31, 119, 180};
  static constexpr unsigned char kBudget[3] = {214, 39, 40};
  static constexpr unsigned char kThreshold[3] = {255, 127, 14};
};

// Writes the chart to `png_path`; the y maximum actually used goes to *y_max_used.
Status DrawSpendChart(const SpendHistory& history, const ChartLayout& layout, const std::string& png_path,
                      double* y_max_used = nullptr);

}  // namespace moeserve::moectl
