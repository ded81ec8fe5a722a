// `hpzlab compare SIM.json REAL.json [--top N] [--floor S] [--json FILE]`: how well a simulated
// run (`hpzlab sim --op-times --json`) predicted a measured one (`hpzlab real --json`) of the
// same schedule: step-time error, median and 90th-percentile op error, the worst-predicted ops
// (docs/compare.md). Exit 0, or 2 on bad input (unreadable file, no op_times, other schedule).
#include <cstdio>
#include <memory>
#include <string>

#include "sim/error.hpp"
#include "sim/time/compare.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** What `hpzlab compare` takes. */
struct CompareCliOptions {
  std::string sim;   ///< JSON with op_times, the prediction
  std::string real;  ///< JSON with op_times, the measurement
  std::string json;  ///< --json FILE ("-" = standard output)
  time::CompareOptions compare;
};

void run_compare(const CompareCliOptions& opts) {
  const time::Comparison c = time::compare_files(opts.sim, opts.real, opts.compare);
  if (!opts.json.empty()) write_output(opts.json, time::comparison_json(c).dump(2) + "\n");
  if (opts.json != "-") {
    const std::string text = time::render_text(c);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
}

}  // namespace

void setup_compare(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<CompareCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "compare",
      "Compare a simulated run with a measured one of the same schedule, op by op: step-time "
      "error, median and 90th-percentile op error, the worst-predicted ops (two JSON files, "
      "not a scenario)");
  sub->add_option("sim", opts->sim, "JSON of `hpzlab sim --op-times --json FILE` (the prediction)")
      ->required();
  sub->add_option("real", opts->real, "JSON of `hpzlab real --json FILE` (the measurement)")
      ->required();
  sub->add_option("--top", opts->compare.top, "List the N worst-predicted ops (default 10)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--floor", opts->compare.floor_s,
                  "Leave ops shorter than S seconds in the real run out of the median and p90 "
                  "(default 1e-5)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--json", opts->json, "Write the comparison as JSON to FILE ('-' = stdout)");
  sub->callback([opts, &exit_code] {
    run_compare(*opts);
    exit_code = kExitOk;
  });
}

}  // namespace hpz::cli
