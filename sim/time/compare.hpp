// `hpzlab compare SIM.json REAL.json`: aligns two timed runs of the same schedule op by op (a
// simulated one from `hpzlab sim --op-times --json`, a measured one from `hpzlab real --json`;
// both carry `op_times` and `op_labels`, see report.hpp) and says how well the simulator
// predicted the step and each op. The format and the meaning of the numbers: docs/compare.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hpz::time {

/** What to compare and how much to report. */
struct CompareOptions {
  std::size_t top = 10;   ///< worst-predicted ops to keep
  double floor_s = 1e-5;  ///< ops shorter than this in the real run stay out of the percentiles
};

/** One op's predicted and measured duration (end_s - start_s). */
struct OpError {
  int rank = 0;
  std::uint32_t op = 0;  ///< index in the rank's IR order
  std::string label;     ///< "kind/purpose/unit"
  double sim_s = 0;
  double real_s = 0;
  double error_s = 0;   ///< sim_s - real_s
  double relative = 0;  ///< error_s / real_s
};

/** How well one timed run predicted the other. */
struct Comparison {
  std::string sim_file, real_file;
  std::string sim_source, real_source;  ///< their `source` keys ("sim", "real"; "?" if absent)
  std::string scenario, variant;
  int world_size = 0;
  double sim_step_s = 0, real_step_s = 0;  ///< top-level step_time_s; NaN when a file has null
  double step_error = 0;                   ///< (sim - real) / real; NaN without both
  double floor_s = 0;                      ///< CompareOptions::floor_s
  std::size_t ops_compared = 0;            ///< stream ops with a duration in both runs
  std::size_t ops_over_floor = 0;          ///< of those, measured at least floor_s
  double median_abs_relative = 0;          ///< median |relative| over ops_over_floor (NaN if none)
  double p90_abs_relative = 0;             ///< 90th percentile of |relative| over the same ops
  double median_relative = 0;              ///< median signed relative error: the model's bias
  std::vector<OpError> worst;              ///< largest |error_s| first, at most CompareOptions::top
};

/** Reads the JSON that `hpzlab sim --op-times` or `hpzlab real` wrote. Throws InputError naming
 *  the file when it cannot be read, is not JSON, or has no op_times. */
nlohmann::json read_timed_json(const std::string& path);

/** Compares two parsed files; the names are only for messages. Throws InputError naming the file
 *  and key when either is malformed or the two time different schedules (scenario file name,
 *  variant, world_size, steps, ops per rank, op_labels). */
Comparison compare(const nlohmann::json& sim, const std::string& sim_name,
                   const nlohmann::json& real, const std::string& real_name,
                   const CompareOptions& options = {});

/** read_timed_json on both files, then compare. */
Comparison compare_files(const std::string& sim_path, const std::string& real_path,
                         const CompareOptions& options = {});

/** The short table `hpzlab compare` prints. */
std::string render_text(const Comparison& comparison);

/** The same as JSON (`hpzlab compare --json`); NaN becomes null. */
nlohmann::json comparison_json(const Comparison& comparison);

/** The p-quantile (0 <= p <= 1) of sorted values, linearly interpolated; NaN when empty. */
double quantile(const std::vector<double>& sorted, double p);

}  // namespace hpz::time
