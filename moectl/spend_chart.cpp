#include "moeserve/moectl/spend_chart.hpp"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>

namespace moeserve::moectl {

namespace {

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

void SetColor(cairo_t* cr, const unsigned char (&rgb)[3]) {
  cairo_set_source_rgb(cr, rgb[0] / 255.0, rgb[1] / 255.0, rgb[2] / 255.0);
}

// 1, 2 or 5 times a power of ten, at least `raw`.
double NiceStep(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw - 1e-12 * p) return m * p;
  return 10 * p;
}

std::string UsdLabel(double v, double step) {
  char buf[64];
  const int decimals = step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step))));
  std::snprintf(buf, sizeof buf, "$%.*f", decimals, v);
  return buf;
}

std::string TimeLabel(int64_t t, const char* fmt) {
  std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

void Text(cairo_t* cr, double x, double y, const std::string& s, double align_x, double align_y) {
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  cairo_move_to(cr, x - ext.width * align_x - ext.x_bearing, y - ext.height * align_y - ext.y_bearing);
  cairo_show_text(cr, s.c_str());
}

// A horizontal line two pixels thick covering rows row-1 and row, unblended.
void HorizontalLine(cairo_t* cr, double x0, double x1, int row) {
  cairo_move_to(cr, x0, row);
  cairo_line_to(cr, x1, row);
}

}  // namespace

int ChartLayout::RowFor(double usd, double y_max_used) const {
  const double h = plot_bottom() - plot_top();
  return static_cast<int>(std::lround(plot_bottom() - usd / y_max_used * h));
}

Status DrawSpendChart(const SpendHistory& history, const ChartLayout& layout, const std::string& png_path,
                      double* y_max_used) {
  if (layout.width < 200 || layout.height < 150 || layout.width > 4096 || layout.height > 4096) {
    return Fail(Error::InvalidArgument("chart size " + std::to_string(layout.width) + "x" +
                                       std::to_string(layout.height) + " is outside 200x150 .. 4096x4096"));
  }
  if (history.period_end <= history.period_start) {
    return Fail(Error::InvalidArgument("the history's period ends before it starts"));
  }
  // The y range: given, or room above the highest of spend and limits.
  double top = 0;
  for (const auto& [t, usd] : history.points) top = std::max(top, usd);
  for (const BudgetLine& b : history.budgets) top = std::max(top, b.limit_usd);
  double y_max = layout.y_max;
  double step;
  if (y_max <= 0) {
    const double want = top > 0 ? top * 1.15 : 1.0;
    step = NiceStep(want / 5);
    y_max = std::ceil(want / step - 1e-9) * step;
  } else {
    step = NiceStep(y_max / 5);
  }
  if (y_max_used) *y_max_used = y_max;

  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, layout.width, layout.height));
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS) {
    return Fail(Error::ResourceExhausted(std::string("cairo: ") + cairo_status_to_string(cairo_surface_status(surface.get()))));
  }
  std::unique_ptr<cairo_t, ContextDeleter> ctx(cairo_create(surface.get()));
  cairo_t* cr = ctx.get();
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  const double left = layout.plot_left(), right = layout.plot_right();
  const double ptop = layout.plot_top(), bottom = layout.plot_bottom();
  const double span = static_cast<double>(history.period_end - history.period_start);
  auto x_for = [&](int64_t t) { return left + (t - history.period_start) / span * (right - left); };
  auto y_for = [&](double usd) { return bottom - usd / y_max * (bottom - ptop); };

  // Grid and y ticks.
  cairo_set_font_size(cr, 12);
  cairo_set_line_width(cr, 1);
  for (int i = 0; i * step <= y_max + step * 1e-9; ++i) {
    const double v = i * step;
    const double y = std::floor(y_for(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_move_to(cr, left, y);
    cairo_line_to(cr, right, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    Text(cr, left - 8, y, UsdLabel(v, step), 1.0, 0.5);
  }
  // x ticks: every 3 hours of a day, every few days of a month.
  const bool day = history.period == "day";
  const int64_t tick = day ? 3 * 3600 : (span > 20 * 86400 ? 5 : 1) * 86400;
  for (int64_t t = history.period_start; t <= history.period_end; t += tick) {
    const double x = std::floor(x_for(t)) + 0.5;
    cairo_set_source_rgb(cr, 0.93, 0.93, 0.93);
    cairo_move_to(cr, x, ptop);
    cairo_line_to(cr, x, bottom);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_move_to(cr, x, bottom);
    cairo_line_to(cr, x, bottom + 5);
    cairo_stroke(cr);
    Text(cr, x, bottom + 9, TimeLabel(t, day ? "%H:%M" : "%m-%d"), 0.5, 0.0);
  }
  // Axes and their labels.
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_move_to(cr, left + 0.5, ptop);
  cairo_line_to(cr, left + 0.5, bottom + 0.5);
  cairo_line_to(cr, right, bottom + 0.5);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 13);
  Text(cr, (left + right) / 2, layout.height - 8, "time (UTC), " + TimeLabel(history.period_start, "%Y-%m-%d") +
                                                     (day ? "" : " to " + TimeLabel(history.period_end - 1, "%Y-%m-%d")),
       0.5, 1.0);
  cairo_save(cr);
  cairo_translate(cr, 18, (ptop + bottom) / 2);
  cairo_rotate(cr, -M_PI / 2);
  Text(cr, 0, 0, "spend (USD)", 0.5, 0.5);
  cairo_restore(cr);
  cairo_set_font_size(cr, 16);
  Text(cr, left, 22, "Spend of tenant " + history.tenant + ", " + history.period + " from " +
                         TimeLabel(history.period_start, "%Y-%m-%d %H:%M UTC"),
       0.0, 0.5);

  // Thresholds below 100% (dashed), then each limit (solid), then the spend on top.
  cairo_rectangle(cr, left + 1, ptop, right - left - 1, bottom - ptop);
  cairo_save(cr);
  cairo_clip(cr);
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
  cairo_set_line_width(cr, 2);
  const double dash[] = {8, 5};
  for (const BudgetLine& b : history.budgets) {
    for (double t : b.thresholds) {
      if (t >= 1.0 - 1e-9) continue;
      SetColor(cr, ChartColors::kThreshold);
      cairo_set_dash(cr, dash, 2, 0);
      HorizontalLine(cr, left, right, layout.RowFor(t * b.limit_usd, y_max));
      cairo_stroke(cr);
    }
    cairo_set_dash(cr, nullptr, 0, 0);
    SetColor(cr, ChartColors::kBudget);
    HorizontalLine(cr, left, right, layout.RowFor(b.limit_usd, y_max));
    cairo_stroke(cr);
  }
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
  // Cumulative spend: zero at the period's start, each hour's total at its end, flat until now.
  SetColor(cr, ChartColors::kSpend);
  cairo_set_line_width(cr, 2.5);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_move_to(cr, x_for(history.period_start), y_for(0));
  double last = 0;
  for (const auto& [hour, usd] : history.points) {
    cairo_line_to(cr, x_for(hour), y_for(last));
    const int64_t end = std::min<int64_t>(hour + 3600, std::max(history.now, hour));
    cairo_line_to(cr, x_for(end), y_for(usd));
    last = usd;
  }
  cairo_line_to(cr, x_for(std::clamp(history.now, history.period_start, history.period_end)), y_for(last));
  cairo_stroke(cr);
  cairo_restore(cr);

  // The legend, above the plot so that it hides no data.
  cairo_set_font_size(cr, 12);
  double lx = left;
  const double ly = 48;
  auto entry = [&](const unsigned char (&rgb)[3], bool dashed, const std::string& label) {
    SetColor(cr, rgb);
    cairo_set_line_width(cr, 2.5);
    if (dashed) cairo_set_dash(cr, dash, 2, 0);
    cairo_move_to(cr, lx, ly);
    cairo_line_to(cr, lx + 26, ly);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    Text(cr, lx + 32, ly, label, 0.0, 0.5);
    cairo_text_extents_t ext;
    cairo_text_extents(cr, label.c_str(), &ext);
    lx += 32 + ext.x_advance + 24;
  };
  entry(ChartColors::kSpend, false, "spend");
  for (const BudgetLine& b : history.budgets) {
    entry(ChartColors::kBudget, false, "budget " + UsdLabel(b.limit_usd, 0.01) + (b.action.empty() ? "" : " (" + b.action + ")"));
    std::string ts;
    for (double t : b.thresholds)
      if (t < 1.0 - 1e-9) ts += (ts.empty() ? "" : ", ") + std::to_string(static_cast<int>(std::lround(t * 100))) + "%";
    if (!ts.empty()) entry(ChartColors::kThreshold, true, "thresholds " + ts);
  }
  if (history.budgets.empty()) {
    cairo_set_source_rgb(cr, 0.4, 0.4, 0.4);
    Text(cr, lx, ly, "(no budget applies to this tenant and period)", 0.0, 0.5);
  }

  cairo_surface_flush(surface.get());
  const cairo_status_t st = cairo_surface_write_to_png(surface.get(), png_path.c_str());
  if (st != CAIRO_STATUS_SUCCESS) {
    return Fail(Error::Io("cannot write the chart to " + png_path + ": " + cairo_status_to_string(st)));
  }
  return Ok();
}

}  // namespace moeserve::moectl
