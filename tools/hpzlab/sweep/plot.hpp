// Line plots as SVG, written by hand (no plotting library): one chart of one result against one
// varied key, a line per series, log axes where the values span two decades or more.
#pragma once

#include <string>
#include <vector>

namespace hpz::sweep {

/** One point of a series; `marked` draws a ring around it (a race that bites). */
struct PlotPoint {
  double x = 0;
  double y = 0;
  bool marked = false;
};

/** One line. */
struct Series {
  std::string name;
  std::vector<PlotPoint> points;  ///< in x order
};

/** A whole chart. With `x_labels` the x axis is categorical: x is an index into them. */
struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<std::string> x_labels;  ///< non-empty: categorical x (e.g. a GPU preset)
  std::vector<Series> series;
  std::string marked_meaning;  ///< legend text for marked points ("" = none marked)
};

/** True when every value is positive and the largest is at least 100 times the smallest. */
bool wants_log_scale(const std::vector<double>& values);

/** Tick positions for [lo, hi]: 1-2-5 steps on a linear axis, powers of ten (and 2x, 5x when few
 *  decades) on a log one. */
std::vector<double> ticks(double lo, double hi, bool log_scale);

/** The chart as a standalone SVG document. */
std::string render_svg(const Chart& chart);

}  // namespace hpz::sweep
