// `hpzlab schedule SCENARIO [--rank N] [--json FILE] [--schedule FILE]`: the schedule the builder
// emits (or the one in FILE), summarized, one rank's ops, or all as JSON.
#include <fmt/format.h>

#include <optional>

#include "sim/error.hpp"
#include "sim/schedule_json.hpp"
#include "sim/summary.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

struct ScheduleOptions {
  ScenarioOptions common;
  std::optional<int> rank;
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
  if (!opts.common.json.empty())
    write_output(opts.common.json, schedule_to_json(schedule).dump(), "--json");
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
  const CLI::Option* rank =
      sub->add_option("--rank", opts->rank, "Print the operations of this rank, one line each");
  sub->callback([opts, rank, &exit_code] {
    require_value(*rank, opts->rank.has_value());
    run_schedule(*opts, exit_code);
  });
}

}  // namespace hpz::cli
