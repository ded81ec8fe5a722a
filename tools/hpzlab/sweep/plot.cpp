#include "tools/hpzlab/sweep/plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/xml.hpp"

namespace hpz::sweep {
namespace {

constexpr double kWidth = 760, kHeight = 440;  // kWidth: with the narrowest legend (width_of)
constexpr double kLeft = 80, kRight = 200, kTop = 40, kBottom = 60;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr const char* kMarkColor = "#d62728";
constexpr std::size_t kMaxLegend = 18;

const char* color(std::size_t i) {
  // Tableau's palette without its red, which marks the points where a race bites.
  static const char* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                        "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return palette[i % (sizeof(palette) / sizeof(palette[0]))];
}

/** One axis: its range, scale and ticks, and where a value lands in pixels. */
struct Axis {
  double lo = 0, hi = 1;
  bool log_scale = false;
  std::vector<double> tick_values;

  double fraction(double v) const {
    const double a = log_scale ? std::log10(lo) : lo;
    const double b = log_scale ? std::log10(hi) : hi;
    const double t = log_scale ? std::log10(v) : v;
    return b == a ? 0.5 : (t - a) / (b - a);
  }
};

Axis numeric_axis(std::vector<double> values, bool from_zero) {
  Axis axis;
  axis.log_scale = wants_log_scale(values);
  if (values.empty()) values = {0, 1};
  double lo = *std::min_element(values.begin(), values.end());
  double hi = *std::max_element(values.begin(), values.end());
  if (!axis.log_scale && from_zero && lo > 0) lo = 0;
  if (lo == hi) {
    lo = axis.log_scale ? lo / 2 : lo - (lo == 0 ? 1 : std::fabs(lo) / 2);
    hi = axis.log_scale ? hi * 2 : hi + (hi == 0 ? 1 : std::fabs(hi) / 2);
  }
  axis.tick_values = ticks(lo, hi, axis.log_scale);
  axis.lo = std::min(lo, axis.tick_values.front());
  axis.hi = std::max(hi, axis.tick_values.back());
  return axis;
}

std::string tick_text(double v) {
  if (v != 0 && (std::fabs(v) >= 1e6 || std::fabs(v) < 1e-3)) return fmt::format("{:.3g}", v);
  return fmt::format("{:.6g}", v);
}

void draw_frame(std::string& svg, const Chart& chart) {
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft,
      kTop, kPlotW, kPlotH);
  svg += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                     kLeft + kPlotW / 2, xml_escaped(chart.title));
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     kLeft + kPlotW / 2, kHeight - 14, xml_escaped(chart.x_label));
  svg += fmt::format(
      "<text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
      kTop + kPlotH / 2, xml_escaped(chart.y_label));
}

void draw_x_ticks(std::string& svg, const Chart& chart, const Axis& x) {
  const auto tick = [&](double px, const std::string& label) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        px, kTop, kTop + kPlotH, kTop + kPlotH + 16, xml_escaped(label));
  };
  if (!chart.x_labels.empty()) {
    for (std::size_t i = 0; i < chart.x_labels.size(); ++i) {
      tick(kLeft +
               (static_cast<double>(i) + 0.5) / static_cast<double>(chart.x_labels.size()) * kPlotW,
           chart.x_labels[i]);
    }
    return;
  }
  for (double v : x.tick_values) tick(kLeft + x.fraction(v) * kPlotW, tick_text(v));
}

void draw_y_ticks(std::string& svg, const Axis& y) {
  for (double v : y.tick_values) {
    const double py = kTop + (1 - y.fraction(v)) * kPlotH;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
        kLeft, py, kLeft + kPlotW, py, kLeft - 6, py + 4, tick_text(v));
  }
}

/** The picture's width: the plot, and right of it a legend wide enough for its longest line
 *  (about 7 px a character in 12 px sans-serif; at the fixed 200 px, "stock,
 *  cluster.nic_gbps=12.5" was cut off after "12"). */
double width_of(const Chart& chart) {
  std::size_t longest = chart.marked_meaning.size();
  for (std::size_t i = 0; i < chart.series.size() && i < kMaxLegend; ++i) {
    longest = std::max(longest, chart.series[i].name.size());
  }
  const double legend = 14 + 26 + 7.0 * static_cast<double>(longest) + 10;
  return kLeft + kPlotW + std::max(kRight, std::ceil(legend));
}

void draw_legend(std::string& svg, const Chart& chart) {
  const double x = kLeft + kPlotW + 14;
  double y = kTop + 6;
  for (std::size_t i = 0; i < chart.series.size() && i < kMaxLegend; ++i, y += 18) {
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        x, y, x + 20, y, color(i), x + 26, y + 4, xml_escaped(chart.series[i].name));
  }
  if (chart.series.size() > kMaxLegend) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\">... {} more</text>\n", x, y + 4,
                       chart.series.size() - kMaxLegend);
    y += 18;
  }
  if (!chart.marked_meaning.empty()) {
    svg += fmt::format(
        "<circle cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        x + 10, y + 6, kMarkColor, x + 26, y + 10, xml_escaped(chart.marked_meaning));
  }
}

}  // namespace

bool wants_log_scale(const std::vector<double>& values) {
  if (values.empty()) return false;
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  return *lo > 0 && *hi >= 100 * *lo;
}

std::vector<double> ticks(double lo, double hi, bool log_scale) {
  std::vector<double> out;
  if (log_scale) {
    const int first = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
    const int last = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
    for (int e = first; e <= last; ++e) {
      const double decade = std::pow(10.0, e);
      out.push_back(decade);
      if (last - first <= 3 && e < last) {
        out.push_back(2 * decade);
        out.push_back(5 * decade);
      }
    }
    return out;
  }
  const double raw = (hi - lo) / 6;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  const double first = std::floor(lo / step + 1e-9) * step;
  for (int i = 0; first + i * step < hi + step * (1 - 1e-9); ++i) {
    const double v = first + i * step;
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

std::string render_svg(const Chart& chart) {
  std::vector<double> xs, ys;
  for (const Series& s : chart.series) {
    for (const PlotPoint& p : s.points) {
      xs.push_back(p.x);
      ys.push_back(p.y);
    }
  }
  const Axis x = chart.x_labels.empty() ? numeric_axis(xs, false) : Axis{};
  const Axis y = numeric_axis(ys, true);
  const auto px = [&](double v) {
    if (chart.x_labels.empty()) return kLeft + x.fraction(v) * kPlotW;
    return kLeft + (v + 0.5) / static_cast<double>(chart.x_labels.size()) * kPlotW;
  };
  const auto py = [&](double v) { return kTop + (1 - y.fraction(v)) * kPlotH; };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      width_of(chart), kHeight);
  draw_x_ticks(svg, chart, x);
  draw_y_ticks(svg, y);
  draw_frame(svg, chart);
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    std::string points;
    for (const PlotPoint& p : chart.series[i].points) {
      points += fmt::format("{:.1f},{:.1f} ", px(p.x), py(p.y));
    }
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                       points, color(i));
    for (const PlotPoint& p : chart.series[i].points) {
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(p.x),
                         py(p.y), color(i));
      if (p.marked) {
        svg += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"7\" fill=\"none\" stroke=\"{}\" "
            "stroke-width=\"2\"/>\n",
            px(p.x), py(p.y), kMarkColor);
      }
    }
  }
  draw_legend(svg, chart);
  return svg + "</svg>\n";
}

}  // namespace hpz::sweep
