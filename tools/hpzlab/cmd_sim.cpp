// `hpzlab sim SCENARIO [--set k=v] [--json FILE] [--trace FILE] [--runs N] [--op-times]
// [--schedule FILE]`: plays the scenario's schedule (or the one in FILE) forward in simulated time
// (SimGrid) and reports the step time, tokens/s per node, exposed communication, host stalls, link
// traffic and which races manifested; --op-times puts every op's times into the JSON for `hpzlab
// compare`; --sensitivity says which cost inputs decide whether the races bite. Exit 0, or 1 when
// the simulated job hangs, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/time/report.hpp"
#include "sim/time/sensitivity.hpp"
#include "sim/time/simulate.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** What `hpzlab sim` takes. */
struct SimCliOptions {
  ScenarioOptions scenario;
  TraceOptions trace;        ///< --trace FILE, --trace-ranks, --trace-steps: the first run's
  int runs = 1;              ///< --runs N: jitter seeds run.seed .. run.seed + N - 1
  bool op_times = false;     ///< --op-times: per-op times in the JSON (for `hpzlab compare`)
  bool sensitivity = false;  ///< --sensitivity: which cost inputs decide the races' bite
  bool per_rank = false;     ///< --per-rank: simulate every rank, not node 0 for every node
  bool by_class = false;     ///< --by-class: node 0 for every node also with jitter (not exact)
};

/** Runs done, the one in progress counted by its share of ops simulated. */
void progress(double done, int total) {
  progress_bar(done, total,
               fmt::format("{}/{} runs, {:3.0f}% of ops simulated", static_cast<int>(done), total,
                           100.0 * done / total));
}

void run_sim(const SimCliOptions& opts, int& exit_code) {
  require_at_least("--runs", opts.runs, 1);
  check_outputs({{opts.scenario.json, "--json"}, {opts.trace.file, "--trace"}},
                inputs_of(opts.scenario));
  Scenario sc = load(opts.scenario);
  const Schedule schedule = schedule_for(sc, opts.scenario.schedule, Engines::kByClass);
  const TimingInputs platform = timing_inputs_of(sc);
  const time::TraceFilter filter = trace_filter(opts.trace, schedule);
  time::SimOptions sim_opts;
  sim_opts.runs = opts.runs;
  sim_opts.progress = progress;
  if (opts.per_rank && opts.by_class) {
    throw InputError("", "--by-class", "not with --per-rank (one or the other)");
  }
  sim_opts.by_class = opts.per_rank   ? time::ByClass::kPerRank
                      : opts.by_class ? time::ByClass::kForce
                                      : time::ByClass::kAuto;
  guard_simulation(sim_opts, schedule);
  // The simulated ranks' times stand for every rank's; only these outputs read every rank's,
  // unfolded from a run by class: refused before any run starts where they would not fit.
  sim_opts.full_timeline = opts.op_times || !opts.trace.file.empty();
  if (sim_opts.full_timeline) guard_every_rank_times(schedule);
  const time::SimResult result = on_schedule(
      opts.scenario.schedule, [&] { return time::simulate(platform, schedule, sim_opts); });
  if (!result.by_class() && !result.by_class_how.empty()) {
    std::fprintf(stderr, "sim: every rank simulated, not one node per symmetry class (%s)\n",
                 result.by_class_how.c_str());
  } else if (result.by_class() && !opts.trace.file.empty()) {
    std::fprintf(stderr, "sim: the trace shows every rank with its node-0 counterpart's times\n");
  }
  std::optional<time::SensitivityResult> sens;
  if (opts.sensitivity && time::has_race(result)) {
    sens = time::sensitivity(
        platform, schedule, result,
        [](int done, int total) {
          progress_bar(done, std::max(done, total),
                       fmt::format("sensitivity: {} timelines (about {})", done, total));
        },
        [&schedule] { guard_sensitivity_every_rank(schedule); });
  }
  if (!opts.scenario.json.empty()) {
    std::string json = time::JsonReporter(opts.op_times, sc.notes).render(schedule, result);
    if (sens) {
      nlohmann::json j = nlohmann::json::parse(json);
      j["sensitivity"] = time::sensitivity_json(*sens);
      json = j.dump(2) + "\n";
    }
    write_output(opts.scenario.json, json, "--json");
  }
  if (!opts.trace.file.empty()) {
    write_trace(opts.trace, time::TraceReporter(filter).render(schedule, result));
  }
  if (opts.scenario.json != "-") {
    std::string text = time::ConsoleReporter().render(schedule, result);
    if (sens) text += time::sensitivity_table(*sens);
    if (opts.sensitivity && !sens) {
      text +=
          "sensitivity: no race in this schedule (the checker proves it race-free), nothing to "
          "be sensitive to\n";
    }
    text += notes_text(sc);
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
  add_trace_options(*sub, opts->trace, "of the first run");
  sub->add_option("--runs", opts->runs,
                  "Simulate N runs with jitter seeds run.seed, run.seed + 1, ... and count in how "
                  "many each race manifested (1 or more; default 1)");
  sub->add_flag("--op-times", opts->op_times,
                "Put every op's [issue_s, start_s, end_s] of the first run (null if it never "
                "ran) and its kind/purpose/unit label into the --json output (op_times, "
                "op_labels), for `hpzlab compare`");
  sub->add_flag("--sensitivity", opts->sensitivity,
                "Scale each cost input (compute and memory efficiency, launch overhead, kernel "
                "latency, NIC and NVLink bandwidth and latency, SimGrid's factors) alone from x1/4 "
                "to x4, simulate again with the same seed, and say at which factor the closest "
                "race would start or stop biting");
  sub->add_flag("--per-rank", opts->per_rank,
                "Simulate every rank, not node 0's ranks for every node (the default where every "
                "node issues node 0's ops on its own groups, the network is the same on every "
                "node and sim.jitter is 0: the times are the same)");
  sub->add_flag("--by-class", opts->by_class,
                "Simulate node 0's ranks for every node also where sim.jitter > 0: every node "
                "then draws node 0's noise, which is not the per-rank model (an approximation)");
  sub->callback([opts, &exit_code] { run_sim(*opts, exit_code); });
}

}  // namespace hpz::cli
