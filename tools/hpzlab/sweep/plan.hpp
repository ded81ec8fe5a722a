// What a sweep runs: the scenario, the axes (`--vary KEY=VALUES`), the variants (`--variants`)
// and how many jittered runs each simulation makes; the cross product of the axes' values gives
// the points, and every point runs once per variant.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/scenario.hpp"

namespace hpz::sweep {

/** One `--vary`: a scenario key and the values it takes, as `--set` text. */
struct Axis {
  std::string key;                  ///< dotted scenario key, e.g. cluster.nic_gbps
  std::vector<std::string> values;  ///< in the order given, ranges expanded
};

/** One variant of the sweep: its name (a column value) and the overrides that make it. */
struct VariantSpec {
  std::string name;                 ///< stock | host-sync | event-wait | no-hpz
  std::vector<Override> overrides;  ///< applied after the axes' values
};

/** Parses "KEY=LIST": LIST is comma-separated values, each a plain value, a range
 *  start:stop:step (stop included when reached) or log:start:stop:n (n values spaced evenly on
 *  a log scale, 3 significant digits). Throws InputError("--vary", ...) naming the bad part. */
Axis parse_axis(const std::string& text);

/** The names --variants accepts, in their documented order. */
const std::vector<std::string>& variant_names();

/** The overrides of a variant: run.variant=NAME, or for no-hpz
 *  zero.zero_hpz_partition_size=1 (hpZ off; the scenario's run.variant is kept). Throws
 *  InputError("--variants", ...) for an unknown name. */
VariantSpec variant_spec(const std::string& name);

/** A whole sweep. Points are numbered in the cross product's order, the last axis fastest. */
struct Plan {
  std::string scenario;  ///< the scenario file, as given ("" = the one-command form)
  /// The one-command flags (--ds-config FILE, --nodes N, ...: issue 35) as the keys they set,
  /// applied after the scenario's keys and before --set, as `hpzlab sim` applies them ...
  std::vector<FlagSetting> flags;
  /// ... and as each child is given them, e.g. {"--ds-config", "ds.json", "--hf-trainer"}.
  std::vector<std::string> flag_args;
  std::vector<std::string> sets;  ///< --set key=value, applied first
  std::vector<Axis> axes;         ///< --vary, in the order given
  std::vector<VariantSpec> variants;
  int runs = 1;  ///< jitter seeds per simulation (`hpzlab sim --runs`)
  /// --repro: also `hpzlab repro` once per point (all four variants, the same seeds), for the
  /// first bad step and the final loss of each row
  bool repro = false;

  /** Number of points: the product of the axes' sizes (1 without axes). */
  std::size_t points() const;
  /** The axes' values at a point, one per axis. */
  std::vector<std::string> values_at(std::size_t point) const;
  /** Every override of one simulation, in the order they apply: --set, the axes, the variant. */
  std::vector<Override> overrides(std::size_t point, std::size_t variant) const;
  /** The `hpzlab sim` arguments of one simulation (after the program name), writing its JSON
   *  to json_path. */
  std::vector<std::string> sim_args(std::size_t point, std::size_t variant,
                                    const std::string& json_path) const;
  /** The `hpzlab repro` arguments of one point (its --set and axis values; repro runs every
   *  variant itself), writing its JSON to json_path. */
  std::vector<std::string> repro_args(std::size_t point, const std::string& json_path) const;
  /** What sweep.json records: enough to tell on --resume whether DIR holds this sweep. */
  nlohmann::json to_json() const;
};

/** The plan Plan::to_json() wrote to `file` (DIR/sweep.json), every field read through Field and
 *  the plan held to check_limits(): a value that is not what a sweep writes there is
 *  InputError(file, KEY, ...) naming the key and what was expected. */
Plan plan_from_json(const nlohmann::json& j, const std::string& file = "sweep.json");

/** The limits the command line holds a plan to, whatever it came from (issue 34: a sweep.json of
 *  "runs": 2000000000 built 2e9 rows): --runs 1 to kMaxRuns, at least one variant and none
 *  twice, each --vary key once and not run.variant, each with 1 to 10,000 non-empty values, at
 *  most 1e7 simulations (points x variants) and 1e7 rows (simulations x runs). With `file` empty
 *  the message names the flag (--runs, --vary, --variants), else the file and its key. */
void check_limits(const Plan& plan, const std::string& file);

/** Most jitter runs a sweep's simulation may have (`--runs`). */
inline constexpr int kMaxRuns = 10'000;

/** Checks the plan before anything runs: loads the scenario with the --set overrides, then once
 *  more for each axis value and each variant on its own. Throws InputError naming the key and
 *  the value ("--vary: KEY=VALUE: what is wrong"). */
void validate(const Plan& plan);

}  // namespace hpz::sweep
