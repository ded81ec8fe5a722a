#include "tools/hpzlab/sweep/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "sim/error.hpp"
#include "tools/hpzlab/sweep/fields.hpp"

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
/// A sweep's rows (simulations x runs), for the same reason.
constexpr double kMaxRows = 1e7;
/// Scenario loads spent, over the whole validation, trying values the scenario refuses alone with
/// combinations of the other axes (a load takes about 0.05 ms in a Release build): past this a
/// plan is refused instead of validating for minutes (issue 34, item 13).
constexpr std::size_t kMaxCombinationLoads = 100'000;

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
 *  axes' values (the first kMaxCombinations of them, the last axis fastest). Each load counts
 *  against `budget`; false, with `budget` 0, when it runs out. */
bool loads_with_other_axes(const Plan& plan, std::size_t k, const std::string& value,
                           std::size_t& budget) {
  std::size_t others = 1;
  for (std::size_t i = 0; i < plan.axes.size(); ++i) {
    if (i != k) others *= plan.axes[i].values.size();
  }
  if (plan.axes.size() <= 1) return false;
  for (std::size_t m = 0; m < others && m < kMaxCombinations; ++m) {
    if (budget == 0) return false;
    --budget;
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

Plan plan_from_json(const nlohmann::json& j, const std::string& file) {
  const Field root(j, file);
  Plan plan;
  plan.scenario = root.at("scenario").string();
  plan.sets = root.at("sets").strings();
  plan.runs = static_cast<int>(root.at("runs").integer(1, kMaxRuns));
  if (root.at("repro").present()) plan.repro = root.at("repro").boolean();
  if (root.at("flags").present()) {
    plan.flag_args = root.at("flag_args").strings();
    const Field flags = root.at("flags");
    for (std::size_t i = 0; i < flags.size(); ++i) {
      const Field f = flags.item(i);
      plan.flags.push_back({f.at("flag").string(), f.at("key").string(), f.at("value").string()});
    }
  }
  const Field vary = root.at("vary");
  for (std::size_t i = 0; i < vary.size(); ++i) {
    const Field a = vary.item(i);
    plan.axes.push_back({a.at("key").string(), a.at("values").strings()});
  }
  const Field variants = root.at("variants");
  for (std::size_t i = 0; i < variants.size(); ++i) {
    plan.variants.push_back(variant_spec(variants.item(i).one_of(variant_names())));
  }
  check_limits(plan, file);
  return plan;
}

void check_limits(const Plan& plan, const std::string& file) {
  // From the command line the flag is named, from sweep.json the file and its key.
  const auto fail = [&](const std::string& flag, const std::string& flag_key,
                        const std::string& file_key, const std::string& what) {
    if (file.empty()) throw InputError(flag, flag_key, what);
    throw InputError(file, file_key, what);
  };
  if (plan.runs < 1 || plan.runs > kMaxRuns) {
    fail("--runs", "", "runs",
         fmt::format("{} is out of range (allowed: 1 to {})", plan.runs, kMaxRuns));
  }
  if (plan.variants.empty()) {
    fail("--variants", "", "variants",
         "none (allowed: one or more of stock, host-sync, "
         "event-wait, no-hpz)");
  }
  for (std::size_t v = 0; v < plan.variants.size(); ++v) {
    for (std::size_t w = 0; w < v; ++w) {
      if (plan.variants[w].name == plan.variants[v].name) {
        fail("--variants", plan.variants[v].name, fmt::format("variants[{}]", v), "given twice");
      }
    }
  }
  std::set<std::string> keys;
  // The cross product, counted without overflow.
  double simulations = static_cast<double>(plan.variants.size());
  for (std::size_t i = 0; i < plan.axes.size(); ++i) {
    const Axis& axis = plan.axes[i];
    const std::string at = fmt::format("vary[{}]", i);
    if (axis.key.empty()) fail(kVaryWhere, "", at + ".key", "empty (allowed: a scenario key)");
    if (axis.key == "run.variant") {
      fail(kVaryWhere, axis.key, at + ".key",
           "the variant is swept with --variants (allowed: a key other than run.variant)");
    }
    if (!keys.insert(axis.key).second) {
      fail(kVaryWhere, axis.key, at + ".key",
           "given twice (allowed: one --vary per key, with all its values)");
    }
    if (axis.values.empty() || axis.values.size() > kMaxAxisValues) {
      fail(kVaryWhere, axis.key, at + ".values",
           fmt::format("{} values (allowed: 1 to {})", axis.values.size(), kMaxAxisValues));
    }
    for (std::size_t k = 0; k < axis.values.size(); ++k) {
      if (axis.values[k].empty()) {
        fail(kVaryWhere, axis.key, fmt::format("{}.values[{}]", at, k),
             "an empty value (allowed: a value the key takes)");
      }
    }
    simulations *= static_cast<double>(axis.values.size());
  }
  if (simulations > kMaxSimulations) {
    fail(kVaryWhere, "", "vary",
         fmt::format("{:.0f} simulations (allowed: at most {}{})", simulations, kMaxSimulations,
                     file.empty() ? "; use --emit for a cluster, or fewer values" : ""));
  }
  const double rows = simulations * plan.runs;
  if (rows > kMaxRows) {
    fail("--runs", "", "runs",
         fmt::format("{:.0f} rows ({:.0f} simulations x {} runs) (allowed: at most {})", rows,
                     simulations, plan.runs, kMaxRows));
  }
}

void validate(const Plan& plan) {
  load_scenario(plan.scenario, base_overrides(plan), plan.flags);
  check_limits(plan, "");
  std::size_t budget = kMaxCombinationLoads;
  for (std::size_t k = 0; k < plan.axes.size(); ++k) {
    for (const std::string& value : plan.axes[k].values) {
      try {
        load_with(plan, {plan.axes[k].key, value}, kVaryWhere);
      } catch (const InputError& e) {
        // A value the scenario refuses only with the other keys as the file has them (an hpZ
        // size larger than the file's world, while another --vary grows the world) is fine.
        if (loads_with_other_axes(plan, k, value, budget)) continue;
        if (budget > 0) throw;
        throw InputError(
            "", "",
            fmt::format("{} (the scenario refuses it alone; validation stopped after trying {} "
                        "combinations of the other --vary values for the values it refuses "
                        "alone: allowed: fewer such values, or --set what they depend on)",
                        e.what(), kMaxCombinationLoads));
      }
    }
  }
  for (const VariantSpec& v : plan.variants) {
    for (const Override& o : v.overrides) load_with(plan, o, "--variants");
  }
}

}  // namespace hpz::sweep
