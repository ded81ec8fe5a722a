// The reports of `hpzlab repro`: table, CSV, SVG plot and JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "sim/driver/repro.hpp"
#include "sim/xml.hpp"

namespace hpz::replay {
namespace {

const char* health_name(Health h) {
  switch (h) {
    case Health::kGood:
      return "good";
    case Health::kWrong:
      return "wrong";
    case Health::kNan:
      return "nan";
  }
  return "?";
}

std::string loss_text(const ReproResult& r, const StepRecord& s) {
  if (r.mode == Mode::kTaint) return health_name(s.loss_health);
  return fmt::format("{:.6g}", s.loss);
}

std::string first_bad_text(const std::optional<int>& f) {
  return f ? std::to_string(*f) : std::string("-");
}

const char* kColours[] = {"#d62728", "#1f77b4", "#2ca02c", "#000000"};

}  // namespace

std::string repro_table(const ReproResult& r) {
  std::string out =
      fmt::format("repro {}: {} replay, {} step(s), {} run(s) from seed {}, timing: {}\n",
                  r.scenario, r.mode == Mode::kNumeric ? "numeric" : "taint", r.steps,
                  r.variants.empty() ? 0 : r.variants[0].runs.size(), r.first_seed, r.timing);
  if (r.spin_before_copy_us > 0) {
    out += fmt::format(
        "spin: a {} us spin kernel holds S0 ahead of every secondary copy "
        "(run.spin_before_copy_us), as a reproduction on a GPU does; no-hpz makes no copies, so "
        "its tokens/s/node have no spins in them\n",
        r.spin_before_copy_us);
  }
  if (r.baseline == "serialized") {
    // One variant: a schedule read from a file (replay_schedule), which has no hpZ-off run.
    out += r.variants.size() == 1
               ? "first bad: the first step whose loss or weights differ from the same schedule "
                 "replayed one op at a time in issue order\n"
               : "first bad: the first step whose loss or weights differ from the same variant "
                 "replayed one op at a time in issue order (with qwZ, hpZ off rounds its shards "
                 "in other groups than hpZ's secondaries, so its numbers are no baseline)\n";
  }
  out += fmt::format("{:<11} {:>10} {:>14} {:>9} {:>9} {:>14} {:>12}\n", "variant", "first bad",
                     "final loss", "runs bad", "runs NaN", "tokens/s/node", "mixed reads");
  for (const VariantRepro& v : r.variants) {
    const ReplayResult& run0 = v.runs.front();
    const std::string last = !run0.hang.empty()   ? "HANG"
                             : run0.steps.empty() ? "-"
                                                  : loss_text(r, run0.steps.back());
    out += fmt::format("{:<11} {:>10} {:>14} {:>8.0f}% {:>8.0f}% {:>14.4g} {:>12}\n", v.name,
                       first_bad_text(v.first_bad.front()), last, 100 * v.share_bad(),
                       100 * v.share_nan(), v.tokens_per_s_per_node, v.mixed_reads);
  }
  for (const VariantRepro& v : r.variants) {
    const auto hung = std::count_if(v.runs.begin(), v.runs.end(),
                                    [](const ReplayResult& run) { return !run.hang.empty(); });
    const auto first = std::find_if(v.runs.begin(), v.runs.end(),
                                    [](const ReplayResult& run) { return !run.hang.empty(); });
    if (hung == 0) continue;
    out += fmt::format("  {}: the job hangs in {} of {} run(s), not replayed: {}\n", v.name, hung,
                       v.runs.size(), first->hang);
  }
  out += "loss per step (first run):\n";
  for (const VariantRepro& v : r.variants) {
    out += fmt::format("  {:<11}", v.name);
    if (!v.runs.front().hang.empty()) out += " HANG";
    for (const StepRecord& s : v.runs.front().steps) out += " " + loss_text(r, s);
    out += "\n";
  }
  if (r.mode == Mode::kTaint) {
    for (const VariantRepro& v : r.variants) {
      const auto& f = v.first_bad.front();
      if (!f || !v.runs.front().hang.empty()) continue;
      const StepRecord& s = v.runs.front().steps[*f];
      out +=
          fmt::format("  {}: weights bad after step {}: {} element(s) on {} rank(s), {} unit(s)\n",
                      v.name, *f, s.bad_elements, s.bad_ranks.size(), s.bad_units.size());
    }
  }
  return out;
}

std::string repro_csv(const ReproResult& r) {
  std::string out = "variant,run,seed,step,loss\n";
  for (const VariantRepro& v : r.variants) {
    for (std::size_t k = 0; k < v.runs.size(); ++k) {
      const auto& steps = v.runs[k].steps;
      for (std::size_t s = 0; s < steps.size(); ++s) {
        out +=
            fmt::format("{},{},{},{},{}\n", v.name, k, r.first_seed + k, s, loss_text(r, steps[s]));
      }
    }
  }
  return out;
}

namespace {

/** A plot title of at most `most` characters: the scenario by its file name, cut with "..." when
 *  even that is too long. */
std::string fitted_title(const std::string& head, const std::string& scenario,
                         const std::string& tail, std::size_t most) {
  std::string name = std::filesystem::path(scenario).filename().string();
  const std::size_t fixed = head.size() + tail.size();
  if (fixed + name.size() > most && most > fixed + 3) {
    name = name.substr(0, most - fixed - 3) + "...";
  }
  return xml_escaped(head + name + tail);
}

/** A plot of values per step: its size and margins, and the y range it shows. */
struct Frame {
  double w = 640, h = 400, left = 60, right = 150, top = 40, bottom = 50;
  int steps = 2;  ///< x runs over steps 0 .. steps - 1 (at least two positions)
  double lo = 0, hi = 1;
  double x(std::size_t s) const {
    return left + (w - left - right) * static_cast<double>(s) / (std::max(steps, 2) - 1);
  }
  double y(double v) const { return top + (h - top - bottom) * (hi - v) / (hi - lo); }

  /** The SVG's opening, the title, both axes, each step under x (labelled `x_label`) and five
   *  values up y. */
  std::string open(const std::string& title, const char* x_label) const {
    std::string out = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
        "fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n",
        w, h, title);
    out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n",
                       left, top, h - bottom);
    out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n",
                       left, h - bottom, w - right);
    for (int s = 0; s < steps; ++s) {
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                         x(static_cast<std::size_t>(s)), h - bottom + 18, s);
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       (left + w - right) / 2, h - 10, x_label);
    for (int k = 0; k <= 4; ++k) {
      const double v = lo + (hi - lo) * k / 4;
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.4g}</text>\n", left - 6,
                         y(v) + 4, v);
    }
    return out;
  }

  /** Variant `vi`'s line through `path` (SVG path data; none when empty), in its colour and
   *  dashed wider the later the variant so that equal curves stay visible on top of each other,
   *  and its name in the legend. */
  std::string curve(std::size_t vi, const std::string& path, const std::string& name) const {
    const char* c = kColours[vi % 4];
    std::string out;
    if (!path.empty()) {
      out += fmt::format(
          "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" "
          "stroke-dasharray=\"{} {}\"/>\n",
          path, c, 4 + 3 * vi, 3 + vi);
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", w - right + 10,
                       top + 20 * static_cast<double>(vi + 1), c, name);
    return out;
  }
};

// Taint replay: what taint means per step, the weight elements that have gone bad (all ranks'
// primary shards) as a line per variant, each step's loss as a dot (good) or a cross (wrong or
// NaN).
std::string taint_svg(const ReproResult& r) {
  Frame f;
  f.left = 80;
  f.steps = r.steps;
  for (const VariantRepro& v : r.variants) {
    for (const StepRecord& s : v.runs.front().steps) {
      f.hi = std::max(f.hi, static_cast<double>(s.bad_elements));
    }
  }
  std::string out = f.open(fitted_title("Weight elements gone bad, taint replay of ", r.scenario,
                                        fmt::format(" (seed {})", r.first_seed), 78),
                           "after optimizer step");
  for (std::size_t vi = 0; vi < r.variants.size(); ++vi) {
    const char* c = kColours[vi % 4];
    std::string path;
    const auto& steps = r.variants[vi].runs.front().steps;
    for (std::size_t s = 0; s < steps.size(); ++s) {
      // Offset each variant a little so that equal curves (all at 0) stay visible.
      const double px = f.x(s);
      const double py =
          f.y(static_cast<double>(steps[s].bad_elements)) - 3.0 * static_cast<double>(vi);
      path += fmt::format("{}{:.2f},{:.2f} ", path.empty() ? "M" : "L", px, py);
      if (steps[s].loss_health == Health::kGood) {
        out +=
            fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\"/>\n", px, py, c);
      } else {
        out += fmt::format(
            "<text x=\"{:.2f}\" y=\"{:.2f}\" fill=\"{}\" text-anchor=\"middle\" "
            "font-size=\"16\">x</text>\n",
            px, py + 5, c);
      }
    }
    out += f.curve(vi, path, r.variants[vi].name);
  }
  out += fmt::format(
      "<text x=\"{0}\" y=\"{1}\">dot: loss good</text>\n<text x=\"{0}\" y=\"{2}\">x: loss "
      "wrong or NaN</text>\n",
      f.w - f.right + 10, f.top + 20 * static_cast<double>(r.variants.size() + 2),
      f.top + 20 * static_cast<double>(r.variants.size() + 3));
  out += "</svg>\n";
  return out;
}

}  // namespace

// Numeric replay: finite losses as lines; a NaN step as a cross on the top edge. Taint replay:
// taint_svg.
std::string repro_svg(const ReproResult& r) {
  if (r.mode == Mode::kTaint) return taint_svg(r);
  double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
  for (const VariantRepro& v : r.variants) {
    for (const StepRecord& s : v.runs.front().steps) {
      if (std::isfinite(s.loss)) {
        lo = std::min(lo, s.loss);
        hi = std::max(hi, s.loss);
      }
    }
  }
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  Frame f;
  f.steps = r.steps;
  f.lo = lo;
  f.hi = hi;
  std::string out = f.open(fitted_title("Loss per step, ", r.scenario,
                                        fmt::format(" (seed {}; x = NaN)", r.first_seed), 78),
                           "step");
  for (std::size_t vi = 0; vi < r.variants.size(); ++vi) {
    std::string path;
    const auto& steps = r.variants[vi].runs.front().steps;
    for (std::size_t s = 0; s < steps.size(); ++s) {
      if (!std::isfinite(steps[s].loss)) {
        out += fmt::format(
            "<text x=\"{}\" y=\"{}\" fill=\"{}\" text-anchor=\"middle\" "
            "font-size=\"16\">x</text>\n",
            f.x(s), f.top - 2 + 4 * static_cast<double>(vi), kColours[vi % 4]);
        continue;
      }
      path += fmt::format("{}{:.2f},{:.2f} ", path.empty() ? "M" : "L", f.x(s), f.y(steps[s].loss));
    }
    out += f.curve(vi, path, r.variants[vi].name);
  }
  out += "</svg>\n";
  return out;
}

std::string repro_json(const ReproResult& r, const std::vector<std::string>& notes) {
  nlohmann::json j;
  j["scenario"] = r.scenario;
  j["notes"] = notes;
  j["mode"] = r.mode == Mode::kNumeric ? "numeric" : "taint";
  j["timing"] = r.timing;
  j["first_seed"] = r.first_seed;
  j["steps"] = r.steps;
  j["spin_before_copy_us"] = r.spin_before_copy_us;
  j["baseline"] = r.baseline;
  nlohmann::json vars = nlohmann::json::object();
  for (const VariantRepro& v : r.variants) {
    nlohmann::json jv;
    auto loss_of = [&](const ReplayResult& run) {
      nlohmann::json l = nlohmann::json::array();
      for (const StepRecord& s : run.steps) {
        // JSON has no NaN: a non-finite loss is the string "nan" (or "inf"); taint gives tags.
        if (r.mode == Mode::kTaint) {
          l.push_back(health_name(s.loss_health));
        } else if (std::isfinite(s.loss)) {
          l.push_back(s.loss);
        } else {
          l.push_back(std::isnan(s.loss) ? "nan" : "inf");
        }
      }
      return l;
    };
    jv["loss"] = loss_of(v.runs.front());
    const auto& f = v.first_bad.front();
    jv["first_bad_step"] = f ? nlohmann::json(*f) : nlohmann::json(nullptr);
    jv["share_bad"] = v.share_bad();
    jv["share_nan"] = v.share_nan();
    jv["tokens_per_s_per_node"] = v.tokens_per_s_per_node;
    jv["mixed_reads"] = v.mixed_reads;
    nlohmann::json runs = nlohmann::json::array();
    for (std::size_t k = 0; k < v.runs.size(); ++k) {
      nlohmann::json jr;
      jr["seed"] = r.first_seed + k;
      jr["loss"] = loss_of(v.runs[k]);
      jr["first_bad_step"] =
          v.first_bad[k] ? nlohmann::json(*v.first_bad[k]) : nlohmann::json(nullptr);
      nlohmann::json spread = nlohmann::json::array();
      for (const StepRecord& s : v.runs[k].steps) {
        spread.push_back({{"bad_elements", s.bad_elements},
                          {"bad_ranks", s.bad_ranks},
                          {"bad_units", s.bad_units}});
      }
      if (r.mode == Mode::kTaint) jr["spread"] = spread;
      if (!v.runs[k].hang.empty()) jr["hang"] = v.runs[k].hang;
      runs.push_back(jr);
    }
    jv["runs"] = runs;
    vars[v.name] = jv;
  }
  j["variants"] = vars;
  return j.dump(2) + "\n";
}

}  // namespace hpz::replay
