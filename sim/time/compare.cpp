#include "sim/time/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string_view>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::time {
namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/** NaN and infinities as null, already in the object (nlohmann only does so when dumping). */
json number_or_null(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

/** One file: its parsed JSON and the name messages use. */
struct Side {
  const json& j;
  const std::string& name;
};

/** An entry of op_times is null or [issue_s, start_s, end_s] with numbers or nulls. */
bool is_op_time(const json& t) {
  if (t.is_null()) return true;
  if (!t.is_array() || t.size() != 3) return false;
  return std::all_of(t.begin(), t.end(),
                     [](const json& v) { return v.is_null() || v.is_number(); });
}

void check_rank_shape(const Side& f, std::size_t r) {
  const json& times = f.j["op_times"][r];
  const json& labels = f.j["op_labels"][r];
  if (!times.is_array()) {
    throw InputError(f.name, "op_times", fmt::format("rank {} is not an array of ops", r));
  }
  if (!labels.is_array() || labels.size() != times.size()) {
    throw InputError(f.name, "op_labels",
                     fmt::format("rank {} needs one label per op ({})", r, times.size()));
  }
  for (std::size_t i = 0; i < times.size(); ++i) {
    if (!is_op_time(times[i])) {
      throw InputError(f.name, "op_times",
                       fmt::format("rank {} op {}: expected [issue_s, start_s, end_s] or null, "
                                   "got {}",
                                   r, i, shown_json(times[i])));
    }
    if (!labels[i].is_string()) {
      throw InputError(f.name, "op_labels", fmt::format("rank {} op {} is not a string", r, i));
    }
    const std::string& label = labels[i].get_ref<const std::string&>();
    try {
      parse_op_kind(std::string_view(label).substr(0, label.find('/')));
    } catch (const InputError&) {
      throw InputError(
          f.name, "op_labels",
          fmt::format("rank {} op {}: '{}' is not \"kind/purpose/unit\"", r, i, shown(label)));
    }
  }
}

/** Everything compare() reads from a file has the type it expects, so no json accessor throws. */
void check_shape(const Side& f) {
  if (!f.j.is_object()) throw InputError(f.name, "", "not a JSON object");
  if (!f.j.contains("op_times")) {
    throw InputError(f.name, "", "no op_times; run `hpzlab sim --op-times` / `hpzlab real`");
  }
  if (!f.j["op_times"].is_array()) {
    throw InputError(f.name, "op_times", "not an array (one array of ops per rank)");
  }
  if (!f.j.contains("op_labels") || !f.j["op_labels"].is_array() ||
      f.j["op_labels"].size() != f.j["op_times"].size()) {
    throw InputError(f.name, "op_labels", "missing or not one array of labels per rank");
  }
  const json& step = f.j.value("step_time_s", json("missing"));
  if (!step.is_number() && !step.is_null()) {
    throw InputError(f.name, "step_time_s", "missing or not a number");
  }
  for (std::size_t r = 0; r < f.j["op_times"].size(); ++r) check_rank_shape(f, r);
}

/** A top-level key as text: strings as they are, other values as JSON, "" when absent. */
std::string key_text(const json& j, const char* key) {
  if (!j.contains(key)) return "";
  const json& v = j[key];
  return v.is_string() ? v.get<std::string>() : shown_json(v);
}

void check_same_key(const Side& sim, const Side& real, const char* key) {
  std::string a = key_text(sim.j, key);
  std::string b = key_text(real.j, key);
  if (std::string_view(key) == "scenario") {
    // The measured run usually happens on another machine, from another directory.
    a = std::filesystem::path(a).filename().string();
    b = std::filesystem::path(b).filename().string();
  }
  if (a != b) {
    throw InputError("", key,
                     fmt::format("'{}' in {} but '{}' in {}: the files time different schedules",
                                 shown(b), real.name, shown(a), sim.name));
  }
}

void check_same_ops(const Side& sim, const Side& real) {
  const json& st = sim.j["op_times"];
  const json& rt = real.j["op_times"];
  if (st.size() != rt.size()) {
    throw InputError(
        "", "op_times",
        fmt::format("{} ranks in {} but {} in {}", rt.size(), real.name, st.size(), sim.name));
  }
  for (std::size_t r = 0; r < st.size(); ++r) {
    if (st[r].size() != rt[r].size()) {
      throw InputError("", "op_times",
                       fmt::format("rank {} has {} ops in {} but {} in {}", r, rt[r].size(),
                                   real.name, st[r].size(), sim.name));
    }
    const json& sl = sim.j["op_labels"][r];
    const json& rl = real.j["op_labels"][r];
    for (std::size_t i = 0; i < sl.size(); ++i) {
      if (sl[i] != rl[i]) {
        throw InputError("", "op_labels",
                         fmt::format("rank {} op {} is {} in {} but {} in {}", r, i,
                                     shown_json(rl[i]), real.name, shown_json(sl[i]), sim.name));
      }
    }
  }
}

/** end_s - start_s, or NaN for an op that never ran or lacks a time. */
double duration(const json& t) {
  if (!t.is_array() || !t[1].is_number() || !t[2].is_number()) return kNaN;
  return t[2].get<double>() - t[1].get<double>();
}

/** Host syncs run on no stream, and event records and waits take no time on theirs: a
 *  measured duration of either says nothing about the model. */
bool has_modelled_duration(const std::string& label) {
  const OpKind kind = parse_op_kind(std::string_view(label).substr(0, label.find('/')));
  return !is_host_sync(kind) && kind != OpKind::kEventRecord && kind != OpKind::kStreamWaitEvent &&
         kind != OpKind::kRecordStream;
}

double step_time(const json& j) {
  const json& v = j["step_time_s"];
  return v.is_number() ? v.get<double>() : kNaN;
}

/** Every stream op with a positive duration in both runs, in rank and IR order. */
std::vector<OpError> op_errors(const Side& sim, const Side& real) {
  std::vector<OpError> out;
  const json& st = sim.j["op_times"];
  const json& rt = real.j["op_times"];
  for (std::size_t r = 0; r < st.size(); ++r) {
    for (std::size_t i = 0; i < st[r].size(); ++i) {
      const std::string& label = sim.j["op_labels"][r][i].get_ref<const std::string&>();
      const double a = duration(st[r][i]);
      const double b = duration(rt[r][i]);
      if (!(a > 0) || !(b > 0) || !std::isfinite(a) || !std::isfinite(b)) continue;
      if (!has_modelled_duration(label)) continue;
      out.push_back(
          {static_cast<int>(r), static_cast<std::uint32_t>(i), label, a, b, a - b, (a - b) / b});
    }
  }
  return out;
}

void fill_percentiles(const std::vector<OpError>& errors, Comparison& c) {
  std::vector<double> abs_rel;
  std::vector<double> rel;
  for (const OpError& e : errors) {
    if (e.real_s < c.floor_s) continue;
    abs_rel.push_back(std::abs(e.relative));
    rel.push_back(e.relative);
  }
  std::sort(abs_rel.begin(), abs_rel.end());
  std::sort(rel.begin(), rel.end());
  c.ops_over_floor = abs_rel.size();
  c.median_abs_relative = quantile(abs_rel, 0.5);
  c.p90_abs_relative = quantile(abs_rel, 0.9);
  c.median_relative = quantile(rel, 0.5);
}

/** Largest |error_s| first; ties in rank and op order, so the output is deterministic. */
std::vector<OpError> worst_of(std::vector<OpError> errors, std::size_t top) {
  const auto worse = [](const OpError& x, const OpError& y) {
    const double ax = std::abs(x.error_s);
    const double ay = std::abs(y.error_s);
    if (ax != ay) return ax > ay;
    return x.rank != y.rank ? x.rank < y.rank : x.op < y.op;
  };
  const std::size_t n = std::min(top, errors.size());
  std::partial_sort(errors.begin(), errors.begin() + static_cast<std::ptrdiff_t>(n), errors.end(),
                    worse);
  errors.resize(n);
  return errors;
}

/** Seconds in a unit that keeps three significant decimals readable. */
std::string seconds_text(double s) {
  if (!std::isfinite(s)) return "n/a";
  const double a = std::abs(s);
  if (a >= 1) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} us", s * 1e6);
}

/** The floor as given: "10 us", not "10.000 us". */
std::string floor_text(double s) {
  if (s >= 1) return fmt::format("{:g} s", s);
  if (s >= 1e-3) return fmt::format("{:g} ms", s * 1e3);
  return fmt::format("{:g} us", s * 1e6);
}

std::string percent_text(double fraction, bool sign) {
  if (!std::isfinite(fraction)) return "n/a";
  return sign ? fmt::format("{:+.2f}%", fraction * 100) : fmt::format("{:.2f}%", fraction * 100);
}

}  // namespace

double quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return kNaN;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

json read_timed_json(const std::string& path) {
  const std::string text = read_input_file(path, path, "", "cannot read this file");
  json j = parse_json_input(text, path, "not valid JSON");
  check_shape({j, path});
  return j;
}

Comparison compare(const json& sim_json, const std::string& sim_name, const json& real_json,
                   const std::string& real_name, const CompareOptions& options) {
  const Side sim{sim_json, sim_name};
  const Side real{real_json, real_name};
  check_shape(sim);
  check_shape(real);
  for (const char* key : {"scenario", "variant", "world_size", "steps"}) {
    check_same_key(sim, real, key);
  }
  check_same_ops(sim, real);
  Comparison c;
  c.sim_file = sim_name;
  c.real_file = real_name;
  c.sim_source = sim_json.contains("source") ? key_text(sim_json, "source") : "?";
  c.real_source = real_json.contains("source") ? key_text(real_json, "source") : "?";
  c.scenario = key_text(sim_json, "scenario");
  c.variant = key_text(sim_json, "variant");
  c.world_size = static_cast<int>(sim_json["op_times"].size());
  c.sim_step_s = step_time(sim_json);
  c.real_step_s = step_time(real_json);
  c.step_error = c.real_step_s > 0 ? (c.sim_step_s - c.real_step_s) / c.real_step_s : kNaN;
  c.floor_s = options.floor_s;
  std::vector<OpError> errors = op_errors(sim, real);
  c.ops_compared = errors.size();
  fill_percentiles(errors, c);
  c.worst = worst_of(std::move(errors), options.top);
  return c;
}

Comparison compare_files(const std::string& sim_path, const std::string& real_path,
                         const CompareOptions& options) {
  const json sim = read_timed_json(sim_path);
  const json real = read_timed_json(real_path);
  return compare(sim, sim_path, real, real_path, options);
}

std::string render_text(const Comparison& c) {
  std::string s =
      fmt::format("hpzlab compare: {} ({}) vs {} ({}); {}, variant {}, {} ranks\n", c.sim_file,
                  c.sim_source, c.real_file, c.real_source, c.scenario, c.variant, c.world_size);
  s += fmt::format("step time   sim {}  real {}  error {}\n", seconds_text(c.sim_step_s),
                   seconds_text(c.real_step_s), percent_text(c.step_error, true));
  s += fmt::format(
      "op error    median |error| {}  p90 |error| {}  median {} (over {} ops >= {} in the real "
      "run; {} ops compared)\n",
      percent_text(c.median_abs_relative, false), percent_text(c.p90_abs_relative, false),
      percent_text(c.median_relative, true), c.ops_over_floor, floor_text(c.floor_s),
      c.ops_compared);
  if (c.worst.empty()) return s;
  s += fmt::format(
      "worst-predicted ops (largest |sim - real|):\n{:>5} {:>7}  {:>12}  {:>12}  {:>9}  {}\n",
      "rank", "op", "sim", "real", "error", "label");
  for (const OpError& e : c.worst) {
    s +=
        fmt::format("{:>5} {:>7}  {:>12}  {:>12}  {:>9}  {}\n", e.rank, e.op, seconds_text(e.sim_s),
                    seconds_text(e.real_s), percent_text(e.relative, true), e.label);
  }
  return s;
}

json comparison_json(const Comparison& c) {
  json worst = json::array();
  for (const OpError& e : c.worst) {
    worst.push_back({{"rank", e.rank},
                     {"op", e.op},
                     {"label", e.label},
                     {"sim_s", number_or_null(e.sim_s)},
                     {"real_s", number_or_null(e.real_s)},
                     {"error_s", number_or_null(e.error_s)},
                     {"relative_error", number_or_null(e.relative)}});
  }
  return {{"sim_file", c.sim_file},
          {"real_file", c.real_file},
          {"sim_source", c.sim_source},
          {"real_source", c.real_source},
          {"scenario", c.scenario},
          {"variant", c.variant},
          {"world_size", c.world_size},
          {"step_time_s",
           {{"sim", number_or_null(c.sim_step_s)}, {"real", number_or_null(c.real_step_s)}}},
          {"step_time_error", number_or_null(c.step_error)},
          {"floor_s", c.floor_s},
          {"ops_compared", c.ops_compared},
          {"ops_over_floor", c.ops_over_floor},
          {"op_error",
           {{"median_abs", number_or_null(c.median_abs_relative)},
            {"p90_abs", number_or_null(c.p90_abs_relative)},
            {"median", number_or_null(c.median_relative)}}},
          {"worst", std::move(worst)}};
}

}  // namespace hpz::time
