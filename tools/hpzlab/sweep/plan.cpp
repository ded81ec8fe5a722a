#include "tools/hpzlab/sweep/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "sim/error.hpp"

namespace hpz::sweep {
namespace {

constexpr const char* kVaryWhere = "--vary";
constexpr const char* kListForms = "(allowed: v1,v2,..., start:stop:step, log:start:stop:n)";
/// More values than this on one axis is a typo, not a sweep.
constexpr std::size_t kMaxAxisValues = 10'000;
/// Combinations of the other axes tried for a value the scenario refuses on its own.
constexpr std::size_t kMaxCombinations = 1000;
/// A sweep's points x variants; beyond this the table alone is gigabytes.
constexpr double kMaxSimulations = 1e7;

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

bool parse_number(const std::string& text, double& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end && !text.empty() && std::isfinite(value);
}

double number_in_range(const std::string& key, const std::string& range, const std::string& part) {
  double value = 0;
  if (parse_number(part, value)) return value;
  throw InputError(kVaryWhere, key + "=" + range,
                   fmt::format("'{}' is not a number {}", part, kListForms));
}

void require_range(bool ok, const std::string& key, const std::string& range,
                   const std::string& what) {
  if (!ok) throw InputError(kVaryWhere, key + "=" + range, what);
}

/** start:stop:step, stop included when a step lands on it (within rounding). */
std::vector<std::string> linear_range(const std::string& key, const std::string& range,
                                      const std::vector<std::string>& parts) {
  const double start = number_in_range(key, range, parts[0]);
  const double stop = number_in_range(key, range, parts[1]);
  const double step = number_in_range(key, range, parts[2]);
  require_range(step != 0, key, range, "the step is zero (allowed: a step that reaches stop)");
  const double steps = (stop - start) / step;
  require_range(steps >= 0, key, range,
                "the step leads away from stop (allowed: a step of the sign of stop - start)");
  require_range(steps < kMaxAxisValues, key, range,
                fmt::format("more than {} values (allowed: fewer)", kMaxAxisValues));
  const auto count = static_cast<std::size_t>(std::floor(steps + 1e-9)) + 1;
  std::vector<std::string> values;
  for (std::size_t i = 0; i < count; ++i) {
    values.push_back(fmt::format("{:.12g}", start + static_cast<double>(i) * step));
  }
  return values;
}

/** log:start:stop:n, n values evenly spaced on a log scale, 3 significant digits (so that a
 *  value of an integer key such as 3.16e+07 is a whole number). */
std::vector<std::string> log_range(const std::string& key, const std::string& range,
                                   const std::vector<std::string>& parts) {
  const double start = number_in_range(key, range, parts[1]);
  const double stop = number_in_range(key, range, parts[2]);
  const double n = number_in_range(key, range, parts[3]);
  require_range(start > 0 && stop > 0, key, range,
                "a log range needs start and stop above zero (allowed: log:start:stop:n)");
  require_range(
      n >= 1 && n <= kMaxAxisValues && std::trunc(n) == n, key, range,
      fmt::format("n = {} (allowed: a whole number of values, 1 to {})", parts[3], kMaxAxisValues));
  const auto count = static_cast<std::size_t>(n);
  std::vector<std::string> values;
  for (std::size_t i = 0; i < count; ++i) {
    const double f = count == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(count - 1);
    values.push_back(fmt::format("{:.3g}", start * std::pow(stop / start, f)));
  }
  return values;
}

/** One comma-separated element: a plain value or a range. */
std::vector<std::string> expand(const std::string& key, const std::string& element) {
  const std::vector<std::string> parts = split(element, ':');
  if (parts[0] == "log") {
    require_range(parts.size() == 4, key, element,
                  "a log range has four parts (allowed: log:start:stop:n)");
    return log_range(key, element, parts);
  }
  double ignored = 0;
  if (parts.size() == 3 && parse_number(parts[0], ignored))
    return linear_range(key, element, parts);
  return {element};
}

/** The message of an InputError raised for `--set KEY=...`, without its "--set: " and "KEY: "
 *  start (the caller names the key and value). */
std::string without_set_prefix(const std::string& message, const std::string& key) {
  std::string rest = message;
  for (const std::string& prefix : {std::string("--set: "), key + ": "}) {
    if (rest.rfind(prefix, 0) == 0) rest = rest.substr(prefix.size());
  }
  return rest;
}

std::vector<Override> base_overrides(const Plan& plan) {
  std::vector<Override> overrides;
  for (const std::string& s : plan.sets) overrides.push_back(parse_override(s));
  return overrides;
}

void load_with(const Plan& plan, const Override& extra, const char* where) {
  std::vector<Override> overrides = base_overrides(plan);
  overrides.push_back(extra);
  try {
    load_scenario(plan.scenario, overrides, plan.flags);
  } catch (const InputError& e) {
    throw InputError(where, extra.first + "=" + extra.second,
                     without_set_prefix(e.what(), extra.first));
  }
}

/** Whether the scenario takes axis k's `value` together with some combination of the other
 *  axes' values (the first kMaxCombinations of them, the last axis fastest). */
bool loads_with_other_axes(const Plan& plan, std::size_t k, const std::string& value) {
  std::size_t others = 1;
  for (std::size_t i = 0; i < plan.axes.size(); ++i) {
    if (i != k) others *= plan.axes[i].values.size();
  }
  if (plan.axes.size() <= 1) return false;
  for (std::size_t m = 0; m < others && m < kMaxCombinations; ++m) {
    std::vector<Override> overrides = base_overrides(plan);
    std::size_t rest = m;
    for (std::size_t i = plan.axes.size(); i-- > 0;) {
      const Axis& axis = plan.axes[i];
      if (i == k) {
        overrides.emplace_back(axis.key, value);
        continue;
      }
      overrides.emplace_back(axis.key, axis.values[rest % axis.values.size()]);
      rest /= axis.values.size();
    }
    try {
      load_scenario(plan.scenario, overrides, plan.flags);
      return true;
    } catch (const InputError&) {
      // try the next combination
    }
  }
  return false;
}

}  // namespace

Axis parse_axis(const std::string& text) {
  const std::size_t equals = text.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw InputError(kVaryWhere, text,
                     "expected section.key=values, e.g. --vary cluster.nic_gbps=12.5,25,100");
  }
  Axis axis{text.substr(0, equals), {}};
  const std::string list = text.substr(equals + 1);
  require_range(!list.empty(), axis.key, list, fmt::format("an empty list {}", kListForms));
  for (const std::string& element : split(list, ',')) {
    require_range(!element.empty(), axis.key, list, fmt::format("an empty value {}", kListForms));
    for (std::string& v : expand(axis.key, element)) axis.values.push_back(std::move(v));
  }
  require_range(axis.values.size() <= kMaxAxisValues, axis.key, list,
                fmt::format("more than {} values (allowed: fewer)", kMaxAxisValues));
  return axis;
}

const std::vector<std::string>& variant_names() {
  static const std::vector<std::string> names = {"stock", "host-sync", "event-wait", "no-hpz"};
  return names;
}

VariantSpec variant_spec(const std::string& name) {
  if (name == "no-hpz") return {name, {{"zero.zero_hpz_partition_size", "1"}}};
  for (const std::string& known : variant_names()) {
    if (known == name) return {name, {{"run.variant", name}}};
  }
  std::string allowed;
  for (const std::string& n : variant_names()) {
    if (!allowed.empty()) allowed += ", ";
    allowed += n;
  }
  const std::optional<std::string> close = closest_name(name, variant_names());
  throw InputError("--variants", name,
                   fmt::format("unknown variant{} (allowed: {})",
                               close ? "; did you mean '" + *close + "'?" : "", allowed));
}

std::size_t Plan::points() const {
  std::size_t n = 1;
  for (const Axis& a : axes) n *= a.values.size();
  return n;
}

std::vector<std::string> Plan::values_at(std::size_t point) const {
  std::vector<std::string> values(axes.size());
  for (std::size_t i = axes.size(); i-- > 0;) {
    values[i] = axes[i].values[point % axes[i].values.size()];
    point /= axes[i].values.size();
  }
  return values;
}

std::vector<Override> Plan::overrides(std::size_t point, std::size_t variant) const {
  std::vector<Override> all = base_overrides(*this);
  const std::vector<std::string> values = values_at(point);
  for (std::size_t i = 0; i < axes.size(); ++i) all.emplace_back(axes[i].key, values[i]);
  for (const Override& o : variants.at(variant).overrides) all.push_back(o);
  return all;
}

std::vector<std::string> Plan::sim_args(std::size_t point, std::size_t variant,
                                        const std::string& json_path) const {
  std::vector<std::string> args = {"sim"};
  if (!scenario.empty()) args.push_back(scenario);
  args.insert(args.end(), flag_args.begin(), flag_args.end());
  for (const auto& [key, value] : overrides(point, variant)) {
    args.push_back("--set");
    args.push_back(key + "=" + value);
  }
  args.insert(args.end(), {"--runs", std::to_string(runs), "--json", json_path});
  return args;
}

std::vector<std::string> Plan::repro_args(std::size_t point, const std::string& json_path) const {
  std::vector<std::string> args = {"repro"};
  if (!scenario.empty()) args.push_back(scenario);
  args.insert(args.end(), flag_args.begin(), flag_args.end());
  std::vector<Override> all = base_overrides(*this);
  const std::vector<std::string> values = values_at(point);
  for (std::size_t i = 0; i < axes.size(); ++i) all.emplace_back(axes[i].key, values[i]);
  for (const auto& [key, value] : all) {
    args.push_back("--set");
    args.push_back(key + "=" + value);
  }
  args.insert(args.end(), {"--runs", std::to_string(runs), "--json", json_path});
  return args;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j = {{"scenario", scenario}, {"sets", sets}, {"runs", runs}};
  if (repro) j["repro"] = true;  // absent without --repro: sweep.json as before
  if (!flags.empty()) {          // absent without the one-command flags, as before
    j["flag_args"] = flag_args;
    j["flags"] = nlohmann::json::array();
    for (const FlagSetting& f : flags) {
      j["flags"].push_back({{"flag", f.flag}, {"key", f.key}, {"value", f.value}});
    }
  }
  j["vary"] = nlohmann::json::array();
  for (const Axis& a : axes) j["vary"].push_back({{"key", a.key}, {"values", a.values}});
  j["variants"] = nlohmann::json::array();
  for (const VariantSpec& v : variants) j["variants"].push_back(v.name);
  return j;
}

Plan plan_from_json(const nlohmann::json& j) {
  Plan plan;
  try {
    plan.scenario = j.at("scenario").get<std::string>();
    plan.sets = j.at("sets").get<std::vector<std::string>>();
    plan.runs = j.at("runs").get<int>();
    plan.repro = j.value("repro", false);
    if (j.contains("flags")) {
      plan.flag_args = j.at("flag_args").get<std::vector<std::string>>();
      for (const nlohmann::json& f : j.at("flags")) {
        plan.flags.push_back({f.at("flag").get<std::string>(), f.at("key").get<std::string>(),
                              f.at("value").get<std::string>()});
      }
    }
    for (const nlohmann::json& a : j.at("vary")) {
      plan.axes.push_back(
          {a.at("key").get<std::string>(), a.at("values").get<std::vector<std::string>>()});
    }
    for (const nlohmann::json& v : j.at("variants")) {
      plan.variants.push_back(variant_spec(v.get<std::string>()));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError("sweep.json", "", std::string("not a sweep's plan: ") + e.what());
  }
  return plan;
}

void validate(const Plan& plan) {
  load_scenario(plan.scenario, base_overrides(plan), plan.flags);
  // The cross product, counted without overflow.
  double simulations = static_cast<double>(plan.variants.size());
  for (const Axis& axis : plan.axes) simulations *= static_cast<double>(axis.values.size());
  if (simulations > kMaxSimulations) {
    throw InputError(kVaryWhere, "",
                     fmt::format("{:.0f} simulations (allowed: at most {}; use --emit for a "
                                 "cluster, or fewer values)",
                                 simulations, kMaxSimulations));
  }
  std::set<std::string> keys;
  for (const Axis& axis : plan.axes) {
    if (axis.key == "run.variant") {
      throw InputError(kVaryWhere, axis.key,
                       "the variant is swept with --variants (allowed: a key other than "
                       "run.variant)");
    }
    if (!keys.insert(axis.key).second) {
      throw InputError(kVaryWhere, axis.key,
                       "given twice (allowed: one --vary per key, with all its values)");
    }
  }
  for (std::size_t k = 0; k < plan.axes.size(); ++k) {
    for (const std::string& value : plan.axes[k].values) {
      try {
        load_with(plan, {plan.axes[k].key, value}, kVaryWhere);
      } catch (const InputError&) {
        // A value the scenario refuses only with the other keys as the file has them (an hpZ
        // size larger than the file's world, while another --vary grows the world) is fine.
        if (!loads_with_other_axes(plan, k, value)) throw;
      }
    }
  }
  for (const VariantSpec& v : plan.variants) {
    for (const Override& o : v.overrides) load_with(plan, o, "--variants");
  }
}

}  // namespace hpz::sweep
