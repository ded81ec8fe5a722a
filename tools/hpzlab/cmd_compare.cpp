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
  std::string sim;        ///< JSON with op_times, the prediction
  std::string real;       ///< JSON with op_times, the measurement
  std::string json;       ///< --json FILE ("-" = standard output)
  long long top = 10;     ///< --top N (checked, then CompareOptions::top)
  double floor_s = 1e-5;  ///< --floor S (checked, then CompareOptions::floor_s)
};

/** The most ops --top lists (a million: more than any schedule's ops per step). */
constexpr double kMaxTop = 1e6;

void run_compare(const CompareCliOptions& opts) {
  // CLI11 stores 2^63 and beyond as the largest long long: an upper bound refuses them.
  require_between("--top", static_cast<double>(opts.top), 0, kMaxTop);
  require_at_least("--floor", opts.floor_s, 0);
  check_outputs({{opts.json, "--json"}}, {opts.sim, opts.real});
  time::CompareOptions compare;
  compare.top = static_cast<std::size_t>(opts.top);
  compare.floor_s = opts.floor_s;
  const time::Comparison c = time::compare_files(opts.sim, opts.real, compare);
  if (!opts.json.empty())
    write_output(opts.json, time::comparison_json(c).dump(2) + "\n", "--json");
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
  sub->add_option("--top", opts->top, "List the N worst-predicted ops (0 to 1000000; default 10)");
  sub->add_option("--floor", opts->floor_s,
                  "Leave ops shorter than S seconds in the real run out of the median and p90 "
                  "(0 or more; default 1e-5)");
  sub->add_option("--json", opts->json, "Write the comparison as JSON to FILE ('-' = stdout)");
  sub->callback([opts, &exit_code] {
    run_compare(*opts);
    exit_code = kExitOk;
  });
}

}  // namespace hpz::cli
