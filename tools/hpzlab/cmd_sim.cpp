// `hpzlab sim SCENARIO [--set k=v] [--json FILE] [--trace FILE] [--runs N] [--op-times]
// [--schedule FILE]`: plays the scenario's schedule (or the one in FILE) forward in simulated time
// (SimGrid) and reports the step time, tokens/s per node, exposed communication, host stalls, link
// traffic and which races manifested; --op-times puts every op's times into the JSON for `hpzlab
// compare`. Exit 0, or 1 when the simulated job hangs, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/time/report.hpp"
#include "sim/time/simulate.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** What `hpzlab sim` takes. */
struct SimCliOptions {
  ScenarioOptions scenario;
  std::string trace;        ///< --trace FILE: Chrome trace-event JSON of the first run
  std::string trace_ranks;  ///< --trace-ranks LIST: the ranks the trace shows ("" = all)
  std::string trace_steps;  ///< --trace-steps LIST: the steps it shows ("" = all)
  int runs = 1;             ///< --runs N: jitter seeds run.seed .. run.seed + N - 1
  bool op_times = false;    ///< --op-times: per-op times in the JSON (for `hpzlab compare`)
};

/** "0,2,8-11" as numbers, each from 0 to `limit` - 1; `flag` and `what` name them in errors. */
std::vector<int> number_list(const std::string& text, const std::string& flag, int limit,
                             const std::string& what) {
  std::vector<int> out;
  const std::string allowed =
      fmt::format("allowed: {}s from 0 to {}, comma-separated, ranges A-B", what, limit - 1);
  std::size_t from = 0;
  while (from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string part = text.substr(from, comma - from);
    from = comma + 1;
    const std::size_t dash = part.find('-', 1);
    int lo = 0;
    int hi = 0;
    const auto number = [&](const std::string& t, int& n) {
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
      return ec == std::errc() && end == t.data() + t.size() && n >= 0 && n < limit;
    };
    const bool ok = dash == std::string::npos ? number(part, lo) && number(part, hi)
                                              : number(part.substr(0, dash), lo) &&
                                                    number(part.substr(dash + 1), hi) && lo <= hi;
    if (!ok) throw InputError("", flag, fmt::format("'{}' is not a {} ({})", part, what, allowed));
    for (int n = lo; n <= hi; ++n) {
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    }
  }
  return out;
}

/** Runs done, the one in progress counted by its share of ops simulated. */
void progress(double done, int total) {
  progress_bar(done, total,
               fmt::format("{}/{} runs, {:3.0f}% of ops simulated", static_cast<int>(done), total,
                           100.0 * done / total));
}

void run_sim(const SimCliOptions& opts, int& exit_code) {
  require_at_least("--runs", opts.runs, 1);
  check_outputs({{opts.scenario.json, "--json"}, {opts.trace, "--trace"}},
                inputs_of(opts.scenario));
  Scenario sc = load(opts.scenario);
  const Schedule schedule = schedule_for(sc, opts.scenario.schedule);
  time::TraceFilter filter;
  if (!opts.trace_ranks.empty()) {
    filter.ranks = number_list(opts.trace_ranks, "--trace-ranks",
                               static_cast<int>(schedule.ranks.size()), "rank");
  }
  if (!opts.trace_steps.empty()) {
    filter.steps = number_list(opts.trace_steps, "--trace-steps", step_count(schedule), "step");
  }
  time::SimOptions sim_opts;
  sim_opts.runs = opts.runs;
  sim_opts.progress = progress;
  const time::SimResult result =
      on_schedule(opts.scenario.schedule, [&] { return time::simulate(sc, schedule, sim_opts); });
  if (!opts.scenario.json.empty()) {
    write_output(opts.scenario.json,
                 time::JsonReporter(opts.op_times, sc.notes).render(schedule, result), "--json");
  }
  if (!opts.trace.empty()) {
    // FILE.gz: gzip'd, as Perfetto opens it (a 7B trace shrinks about tenfold).
    const std::string trace = time::TraceReporter(filter).render(schedule, result);
    const bool gz = opts.trace.size() > 3 && opts.trace.ends_with(".gz");
    write_output(opts.trace, gz ? gzipped(trace) : trace, "--trace");
  }
  if (opts.scenario.json != "-") {
    const std::string text = time::ConsoleReporter().render(schedule, result) + notes_text(sc);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  exit_code = result.mean.hung ? kExitFindings : kExitOk;
}

}  // namespace

void setup_sim(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<SimCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "sim",
      "Play the schedule forward in simulated time (SimGrid): step time, tokens/s per node, "
      "exposed communication, link traffic, and which races manifest in this timing");
  add_scenario_options(*sub, opts->scenario);
  add_schedule_option(*sub, opts->scenario.schedule);
  sub->add_option("--trace", opts->trace,
                  "Write a Chrome trace-event JSON of the first run to FILE (open in Perfetto); "
                  "FILE.gz: gzip'd");
  sub->add_option("--trace-ranks", opts->trace_ranks,
                  "The ranks the trace shows, e.g. 0,8 or 0-3 (default: every rank)");
  sub->add_option("--trace-steps", opts->trace_steps,
                  "The steps the trace shows, e.g. 1 or 0-1 (default: every step; init's ops "
                  "belong to none)");
  sub->add_option("--runs", opts->runs,
                  "Simulate N runs with jitter seeds run.seed, run.seed + 1, ... and count in how "
                  "many each race manifested (1 or more; default 1)");
  sub->add_flag("--op-times", opts->op_times,
                "Put every op's [issue_s, start_s, end_s] of the first run (null if it never "
                "ran) and its kind/purpose/unit label into the --json output (op_times, "
                "op_labels), for `hpzlab compare`");
  sub->callback([opts, &exit_code] { run_sim(*opts, exit_code); });
}

}  // namespace hpz::cli
