#include "tools/hpzlab/sweep/report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "sim/error.hpp"
#include "sim/xml.hpp"
#include "tools/hpzlab/sweep/runner.hpp"

namespace hpz::sweep {
namespace {

bool is_number(const std::string& text, double& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end && !text.empty() && std::isfinite(value);
}

/** The index of each axis' value at a point (the last axis fastest, as Plan numbers them). */
std::vector<std::size_t> value_indices(const Plan& plan, std::size_t point) {
  std::vector<std::size_t> indices(plan.axes.size());
  for (std::size_t i = plan.axes.size(); i-- > 0;) {
    indices[i] = point % plan.axes[i].values.size();
    point /= plan.axes[i].values.size();
  }
  return indices;
}

/** "stock" or "stock, zero.x=3e7" for a series of a chart against axis `k`. */
std::string series_name(const Plan& plan, std::size_t variant, std::size_t k,
                        const std::vector<std::size_t>& indices) {
  std::string name = plan.variants[variant].name;
  for (std::size_t i = 0; i < plan.axes.size(); ++i) {
    if (i != k) name += fmt::format(", {}={}", plan.axes[i].key, plan.axes[i].values[indices[i]]);
  }
  return name;
}

/** Sums of one result per (series, x), for averaging over runs. */
struct Accumulated {
  std::string name;
  std::map<std::size_t, std::pair<double, int>> sum_count;  ///< value index -> (sum, n)
  std::map<std::size_t, bool> bites;
};

Chart chart_of(const Plan& plan, const std::vector<Row>& rows, std::size_t k,
               const std::string& result, const std::string& label) {
  const Axis& axis = plan.axes[k];
  std::vector<double> xs(axis.values.size());
  bool categorical = false;
  for (std::size_t i = 0; i < axis.values.size(); ++i) {
    categorical = categorical || !is_number(axis.values[i], xs[i]);
  }
  std::map<std::vector<std::size_t>, Accumulated> series;  // (variant, other indices) -> sums
  for (const Row& row : rows) {
    if (row.value("status", "") != "ok" || !row.contains(result) || !row[result].is_number()) {
      continue;
    }
    const auto point = row["point"].get<std::size_t>();
    std::size_t variant = 0;
    while (variant < plan.variants.size() && plan.variants[variant].name != row["variant"]) {
      ++variant;
    }
    if (variant == plan.variants.size() || point >= plan.points()) continue;
    std::vector<std::size_t> indices = value_indices(plan, point);
    const std::size_t x = indices[k];
    std::vector<std::size_t> id = {variant};
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (i != k) id.push_back(indices[i]);
    }
    Accumulated& acc = series[id];
    acc.name = series_name(plan, variant, k, indices);
    acc.sum_count[x].first += row[result].get<double>();
    acc.sum_count[x].second += 1;
    acc.bites[x] = acc.bites[x] || row.value("races_manifested", 0.0) > 0;
  }
  Chart chart;
  chart.title = fmt::format("{} vs {}", label, axis.key);
  chart.x_label = axis.key;
  chart.y_label = label;
  if (categorical) chart.x_labels = axis.values;
  bool any_marked = false;
  for (const auto& [id, acc] : series) {
    Series s{acc.name, {}};
    for (const auto& [x, sc] : acc.sum_count) {
      const bool marked = acc.bites.at(x);
      any_marked = any_marked || marked;
      s.points.push_back(
          {categorical ? static_cast<double>(x) : xs[x], sc.first / sc.second, marked});
    }
    if (!categorical) {
      std::sort(s.points.begin(), s.points.end(),
                [](const PlotPoint& a, const PlotPoint& b) { return a.x < b.x; });
    }
    chart.series.push_back(std::move(s));
  }
  if (any_marked) chart.marked_meaning = "a race bites";
  return chart;
}

std::string cell(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return xml_escaped(v.get<std::string>());
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return xml_escaped(v.dump());
}

std::string html_table(const Plan& plan, const std::vector<Row>& rows) {
  const std::vector<std::string> cols = columns(plan);
  std::string html = "<table>\n<tr>";
  for (const std::string& c : cols) html += "<th>" + xml_escaped(c) + "</th>";
  html += "</tr>\n";
  for (const Row& row : rows) {
    const std::string status = row.value("status", "");
    html += status == "ok" ? "<tr>" : "<tr class=\"" + xml_escaped(status) + "\">";
    for (const std::string& c : cols)
      html += "<td>" + (row.contains(c) ? cell(row[c]) : "") + "</td>";
    html += "</tr>\n";
  }
  return html + "</table>\n";
}

std::string html_report(const Plan& plan, const std::vector<Row>& rows,
                        const std::vector<std::string>& svg_files) {
  std::size_t failed = 0, bites = 0;
  for (const Row& row : rows) {
    failed += row.value("status", "") == "failed";
    bites += row.value("races_manifested", 0.0) > 0;
  }
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n<title>hpzlab sweep: {0}</title>\n"
      "<style>body{{font-family:sans-serif;margin:1.5em}} img{{max-width:100%}} "
      "table{{border-collapse:collapse;font-size:12px}} td,th{{border:1px solid #ccc;"
      "padding:2px 6px}} tr.failed{{background:#fdd}} tr.hung{{background:#ffd}}</style>\n"
      "</head><body>\n<h1>hpzlab sweep of {0}</h1>\n"
      "<p>{1} points &times; {2} variants &times; {3} runs: {4} rows, {5} failed, {6} in which a "
      "race bites (ringed in red in the plots). Results: <a href=\"results.csv\">results.csv</a>, "
      "<a href=\"results.jsonl\">results.jsonl</a>. The sweep:</p>\n<pre>{7}</pre>\n",
      xml_escaped(plan.scenario), plan.points(), plan.variants.size(), plan.runs, rows.size(),
      failed, bites, xml_escaped(plan.to_json().dump(2)));
  if (!svg_files.empty()) html += "<h2>Plots</h2>\n";
  for (const std::string& f : svg_files) {
    html += fmt::format("<p><img src=\"plots/{0}\" alt=\"{0}\"></p>\n", xml_escaped(f));
  }
  html += "<h2>Table</h2>\n" + html_table(plan, rows);
  return html + "</body></html>\n";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw InputError(path, "--plot", "cannot write this file");
}

/** rsvg-convert FILE.svg -> FILE.png, two at a time; fills files.png and files.png_note. */
void convert_to_png(const std::string& converter, ReportFiles& files) {
  for (const std::string& svg : files.svg) {  // a PNG of an earlier drawing would be stale
    std::error_code ec;
    std::filesystem::remove(svg.substr(0, svg.size() - 4) + ".png", ec);
  }
  if (converter.empty()) {
    files.png_note =
        "no PNG: rsvg-convert is not on the PATH (Debian: apt-get install librsvg2-bin); the "
        "SVG files are complete";
    return;
  }
  std::vector<Job> jobs;
  for (std::size_t i = 0; i < files.svg.size(); ++i) {
    const std::string& svg = files.svg[i];
    const std::string png = svg.substr(0, svg.size() - 4) + ".png";
    jobs.push_back({i, {"--format", "png", "--output", png, svg}, png + ".err"});
  }
  std::vector<bool> converted(files.svg.size(), false);
  std::string first_error;
  std::size_t failed = 0;
  const auto finished = [&](const Job& job, const Outcome& outcome) {
    const std::string png = job.args[3];
    std::error_code ec;
    if (outcome.exit_code == 0 && std::filesystem::file_size(png, ec) > 0 && !ec) {
      converted[job.id] = true;
    } else {
      ++failed;
      if (first_error.empty()) {
        const std::string line = last_error_line(job.stderr_path);
        first_error =
            fmt::format("{}: {}", files.svg[job.id],
                        line.empty() ? fmt::format("exit code {}", outcome.exit_code) : line);
      }
      std::filesystem::remove(png, ec);
    }
    std::filesystem::remove(job.stderr_path, ec);
  };
  try {
    run_jobs(converter, jobs, 2, finished);
  } catch (const std::runtime_error& e) {
    files.png_note = fmt::format("no PNG: {}", e.what());
    return;
  }
  for (std::size_t i = 0; i < converted.size(); ++i) {
    if (converted[i]) files.png.push_back(jobs[i].args[3]);
  }
  if (failed > 0) {
    files.png_note = fmt::format("{} of {} SVG files not converted to PNG by {} (first: {})",
                                 failed, files.svg.size(), converter, first_error);
  }
}

}  // namespace

std::string find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string rest = path == nullptr ? "" : std::string(path) + ":";
  for (std::size_t colon; (colon = rest.find(':')) != std::string::npos;
       rest = rest.substr(colon + 1)) {
    const std::string dir = rest.substr(0, colon);
    if (dir.empty()) continue;
    const std::filesystem::path candidate = std::filesystem::path(dir) / program;
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate.string();
    }
  }
  return "";
}

const std::vector<std::pair<std::string, std::string>>& plotted_results() {
  static const std::vector<std::pair<std::string, std::string>> results = {
      {"step_time_s", "step time (s)"},
      {"tokens_per_s_per_node", "tokens/s per node"},
      {"exposed_comm_s", "exposed communication (s)"},
      {"host_stall_s", "host stall, fix A (s)"},
      {"host_sync_s", "host sync (s)"},
      {"races_manifested", "race instances that bite"}};
  return results;
}

std::vector<std::pair<std::string, Chart>> charts(const Plan& plan, const std::vector<Row>& rows) {
  std::vector<std::pair<std::string, Chart>> out;
  for (std::size_t k = 0; k < plan.axes.size(); ++k) {
    for (const auto& [result, label] : plotted_results()) {
      out.emplace_back(fmt::format("{}-vs-{}.svg", result, plan.axes[k].key),
                       chart_of(plan, rows, k, result, label));
    }
  }
  return out;
}

ReportFiles write_report(const Plan& plan, const std::vector<Row>& rows, const std::string& dir,
                         const std::string& converter) {
  ReportFiles files;
  std::vector<std::string> svg_files;
  std::error_code ec;
  std::filesystem::create_directories(dir + "/plots", ec);
  for (const auto& [file, chart] : charts(plan, rows)) {
    write_file(dir + "/plots/" + file, render_svg(chart));
    files.svg.push_back(dir + "/plots/" + file);
    svg_files.push_back(file);
  }
  files.html = dir + "/report.html";
  write_file(files.html, html_report(plan, rows, svg_files));
  convert_to_png(converter, files);
  return files;
}

}  // namespace hpz::sweep
