// `hpzlab schedule SCENARIO [--rank N] [--json FILE [--compact]] [--schedule FILE]`: the schedule
// the builder emits (or the one in FILE), summarized, one rank's ops, or all as JSON.
#include <fmt/format.h>

#include <optional>

#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/summary.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

struct ScheduleOptions {
  ScenarioOptions common;
  std::optional<int> rank;
  bool compact = false;
};

void run_schedule(const ScheduleOptions& opts, int& exit_code) {
  check_outputs({{opts.common.json, "--json"}}, inputs_of(opts.common));
  Scenario sc = load(opts.common);
  const Schedule schedule = schedule_for(sc, opts.common.schedule);
  if (opts.rank && (*opts.rank < 0 || *opts.rank >= schedule.world_size)) {
    throw InputError("--rank", "",
                     fmt::format("rank {} does not exist (allowed: 0 to {})", *opts.rank,
                                 schedule.world_size - 1));
  }
  if (opts.compact && opts.common.json.empty()) {
    throw InputError("--compact", "", "shortens the JSON of --json FILE: give --json too");
  }
  if (!opts.common.json.empty())
    write_output(opts.common.json, schedule_to_json(schedule, opts.compact).dump(), "--json");
  if (opts.common.json != "-") {
    std::string text = schedule_summary(sc, schedule);
    if (opts.rank)
      text += format_rank(schedule, *opts.rank);
    else
      text += "(use --rank N for one rank's operations, --json FILE for all ranks)\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  exit_code = kExitOk;
}

}  // namespace

void setup_schedule(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ScheduleOptions>();
  CLI::App* sub = app.add_subcommand(
      "schedule",
      "Build the per-rank schedule (issue order of operations) and print a summary, one rank's "
      "ops (--rank) or all ranks as JSON (--json)");
  add_scenario_options(*sub, opts->common);
  add_schedule_option(*sub, opts->common.schedule);
  sub->add_option("--rank", opts->rank, "Print the operations of this rank, one line each");
  sub->add_flag(
      "--compact", opts->compact,
      "With --json: write each rank that issues another's ops on its own groups as "
      "{\"like\": R, \"groups\", \"accesses\"}, only the accesses that differ (a "
      "DeepSpeed builder's schedule shrinks several times); read back like the full form");
  sub->callback([opts, &exit_code] { run_schedule(*opts, exit_code); });
}

}  // namespace hpz::cli
