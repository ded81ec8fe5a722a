// `hpzlab sweep SCENARIO --vary KEY=VALUES [--vary ...] [--variants LIST] [--runs N] [--jobs J]
// --out DIR [--resume] [--plot] [--set k=v]`: runs `hpzlab sim` at every point of the cross
// product of the --vary values, once per variant, each in a child process, J at a time, and
// writes one table (DIR/results.csv, DIR/results.jsonl) with a row per (point, variant, run);
// --plot adds SVG plots and DIR/report.html. `--emit DIR` writes the simulations as shell
// commands instead, `--collect DIR` makes the table from what they wrote. Exit 0 when every
// simulation gave results, 1 when one or more failed (their rows say why) or, for --collect, has
// not run yet, 2 on bad input (checked before anything runs). docs/sweep.md.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "sim/error.hpp"
#include "tools/hpzlab/commands.hpp"
#include "tools/hpzlab/sweep/emit.hpp"
#include "tools/hpzlab/sweep/report.hpp"
#include "tools/hpzlab/sweep/runner.hpp"
#include "tools/hpzlab/sweep/sweep.hpp"

namespace hpz::cli {
namespace {

/** What `hpzlab sweep` takes. */
struct SweepCliOptions {
  std::string scenario;
  std::vector<std::string> sets;
  std::vector<std::string> vary;  ///< --vary KEY=VALUES, one axis each
  std::string variants;           ///< --variants a,b,... ("" = the scenario's run.variant)
  int runs = 1;
  int jobs = 0;  ///< 0 = the number of cores
  std::string out;
  bool resume = false;
  bool plot = false;    ///< --plot: SVG plots in DIR/plots and DIR/report.html
  bool repro = false;   ///< --repro: `hpzlab repro` once per point, its columns in each row
  std::string emit;     ///< --emit DIR: write the commands instead of running them
  std::string collect;  ///< --collect DIR: the table from what emitted commands wrote
  UserFlags user;       ///< --ds-config, --hf-config, --nodes, ... (the one-command form)
};

std::vector<sweep::VariantSpec> variants_of(const SweepCliOptions& opts) {
  if (opts.variants.empty()) {
    std::vector<Override> overrides;
    for (const std::string& s : opts.sets) overrides.push_back(parse_override(s));
    return {sweep::variant_spec(
        to_string(load_scenario(opts.scenario, overrides, flag_settings(opts.user)).run.variant))};
  }
  std::vector<sweep::VariantSpec> specs;
  std::string rest = opts.variants + ",";
  for (std::size_t comma; (comma = rest.find(',')) != std::string::npos;
       rest = rest.substr(comma + 1)) {
    const std::string name = rest.substr(0, comma);
    for (const sweep::VariantSpec& s : specs) {
      if (s.name == name) throw InputError("--variants", name, "given twice");
    }
    specs.push_back(sweep::variant_spec(name));
  }
  return specs;
}

sweep::Plan plan_of(const SweepCliOptions& opts) {
  sweep::Plan plan;
  plan.scenario = opts.scenario;
  plan.flags = flag_settings(opts.user);
  plan.flag_args = flag_args(opts.user);
  plan.sets = opts.sets;
  for (const std::string& v : opts.vary) plan.axes.push_back(sweep::parse_axis(v));
  plan.variants = variants_of(opts);
  plan.runs = opts.runs;
  plan.repro = opts.repro;
  return plan;
}

int default_jobs() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : static_cast<int>(cores);
}

/** "12/36 simulations, 1 failed, 42 s elapsed, about 84 s left". */
void show_progress(const sweep::Progress& p) {
  const double left = p.done == 0 ? 0
                                  : p.elapsed_s / static_cast<double>(p.done) *
                                        static_cast<double>(p.total - p.done);
  const std::string what =
      fmt::format("{}/{} simulations{}, {} failed, {:.0f} s elapsed, about {:.0f} s left", p.done,
                  p.total, p.repro ? " and replays" : "", p.failed, p.elapsed_s, left);
  if (progress_on()) {
    progress_bar(static_cast<double>(p.done), static_cast<int>(p.total), what);
  } else {
    std::fprintf(stderr, "hpzlab sweep: %s\n", what.c_str());
  }
}

void write_plots(const sweep::Plan& plan, const std::vector<sweep::Row>& table,
                 const std::string& dir) {
  const sweep::ReportFiles files =
      sweep::write_report(plan, table, dir, sweep::find_on_path("rsvg-convert"));
  std::printf("plots: %zu SVG and %zu PNG files in %s/plots, report: %s\n", files.svg.size(),
              files.png.size(), dir.c_str(), files.html.c_str());
  if (!files.png_note.empty()) std::printf("note: %s\n", files.png_note.c_str());
}

std::string count(std::size_t n, const char* what) {
  return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
}

std::size_t failed_rows(const std::vector<sweep::Row>& table) {
  std::size_t failed = 0;
  for (const sweep::Row& row : table) failed += row.value("status", "") == "failed";
  return failed;
}

void collect_sweep(const SweepCliOptions& opts, int& exit_code) {
  const sweep::Collected c = sweep::collect(opts.collect);
  const std::size_t failed = failed_rows(c.table);
  std::printf(
      "collect: %s from %zu of %s (%zu failed, %zu not run yet) in %s/results.csv and "
      "%s/results.jsonl\n",
      count(c.table.size(), "row").c_str(), c.simulations - c.missing,
      count(c.simulations, "simulation").c_str(), failed, c.missing, opts.collect.c_str(),
      opts.collect.c_str());
  if (sweep::read_plan(opts.collect).repro) {
    std::printf("repro: %zu of %s collected (%zu failed, %zu not run yet)\n",
                c.replays - c.replays_missing, count(c.replays, "repro command").c_str(),
                c.replays_failed, c.replays_missing);
  }
  if (opts.plot) write_plots(sweep::read_plan(opts.collect), c.table, opts.collect);
  exit_code = failed > 0 || c.missing > 0 || c.replays_failed > 0 || c.replays_missing > 0
                  ? kExitFindings
                  : kExitOk;
}

void run_sweep(const SweepCliOptions& opts, int& exit_code) {
  if (!opts.collect.empty()) {
    collect_sweep(opts, exit_code);
    return;
  }
  if (opts.scenario.empty() && !has_user_files(opts.user)) {
    throw InputError("", "scenario",
                     "missing (allowed: a scenario file, your own --hf-config FILE --ds-config "
                     "FILE, or --collect DIR)");
  }
  require_at_least("--runs", opts.runs, 1);
  require_at_least("--jobs", opts.jobs, 0);
  const sweep::Plan plan = plan_of(opts);
  sweep::validate(plan);
  if (!opts.emit.empty()) {
    const std::size_t n = sweep::emit(plan, opts.emit, sweep::own_executable());
    std::printf(
        "emit: %s in %s/commands.txt; run them (e.g. parallel --jobs 8 < "
        "%s/commands.txt), then hpzlab sweep --collect %s\n",
        count(n, "command").c_str(), opts.emit.c_str(), opts.emit.c_str(), opts.emit.c_str());
    return;
  }
  if (opts.out.empty()) {
    throw InputError("", "--out",
                     "required: a directory for the results (or --emit DIR, or --collect DIR)");
  }
  const sweep::RunSettings settings{
      opts.out, opts.resume, opts.jobs == 0 ? default_jobs() : opts.jobs, sweep::own_executable()};
  sweep::prepare_dir(plan, settings);
  const sweep::Summary s = sweep::run(plan, settings, show_progress);
  std::printf(
      "sweep: %s x %s x %s: %s (%zu ok, %zu hung, %zu failed) in %s/results.csv and "
      "%s/results.jsonl; %s run in %.1f s, %zu already there\n",
      count(plan.points(), "point").c_str(), count(plan.variants.size(), "variant").c_str(),
      count(static_cast<std::size_t>(plan.runs), "run").c_str(), count(s.rows, "row").c_str(), s.ok,
      s.hung, s.failed, opts.out.c_str(), opts.out.c_str(), count(s.ran, "simulation").c_str(),
      s.elapsed_s, s.skipped);
  if (plan.repro) {
    std::printf(
        "repro: %s of hpzlab repro, %zu failed; columns first_bad_step, final_loss, "
        "repro_error\n",
        count(s.replays, "run").c_str(), s.replays_failed);
  }
  if (opts.plot) write_plots(plan, s.table, opts.out);
  exit_code = s.failed > 0 || s.replays_failed > 0 ? kExitFindings : kExitOk;
}

}  // namespace

void setup_sweep(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<SweepCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "What-if study: `hpzlab sim` at every point of the cross product of --vary values, once "
      "per variant, in child processes; one table of results in DIR (docs/sweep.md)");
  CLI::Option* scenario = sub->add_option(
      "scenario", opts->scenario,
      "Scenario file (TOML), e.g. scenarios/llama2-7b.toml; optional with --hf-config FILE "
      "--ds-config FILE");
  add_user_flags(*sub, opts->user, true);
  CLI::Option* set =
      sub->add_option("--set", opts->sets,
                      "Override a scenario key at every point, e.g. --set run.steps=2 (repeatable)")
          ->take_all()
          ->allow_extra_args(false);
  CLI::Option* vary =
      sub->add_option(
             "--vary", opts->vary,
             "A key and its values: KEY=v1,v2,... where each element may also be a range "
             "start:stop:step (stop included) or log:start:stop:n (n values, log-spaced, 3 "
             "significant digits), e.g. --vary cluster.nic_gbps=log:1:400:9 (repeatable: "
             "the cross product is swept)")
          ->take_all()
          ->allow_extra_args(false);
  CLI::Option* variants =
      sub->add_option("--variants", opts->variants,
                      "Comma-separated variants to run at every point: stock, host-sync, "
                      "event-wait (run.variant) and no-hpz (zero.zero_hpz_partition_size=1, hpZ "
                      "off, run.variant as in the scenario); default: the scenario's run.variant");
  CLI::Option* runs = sub->add_option(
      "--runs", opts->runs,
      "Jitter seeds per simulation (`hpzlab sim --runs`): a row per run (default 1)");
  CLI::Option* jobs = sub->add_option(
      "--jobs", opts->jobs, "Simulations at once, each its own process (default 0: one per core)");
  CLI::Option* out = sub->add_option(
      "--out", opts->out,
      "Directory for results.csv, results.jsonl and sweep.json: new or empty, unless --resume");
  CLI::Option* resume = sub->add_flag(
      "--resume", opts->resume,
      "Finish the sweep in --out: run only the (point, variant) simulations whose rows "
      "are not there yet");
  CLI::Option* repro = sub->add_flag(
      "--repro", opts->repro,
      "Also run `hpzlab repro` once per point (every variant, the same seeds) and add each row's "
      "first_bad_step and final_loss (repro_error says why they are empty: the repro "
      "failed)");
  CLI::Option* plot =
      sub->add_flag("--plot", opts->plot,
                    "Also write DIR/plots/RESULT-vs-KEY.svg (every numeric result against each "
                    "varied key, a line per variant, log axes where values span 2 decades, points "
                    "where a race bites ringed), a PNG of each when rsvg-convert is installed, and "
                    "DIR/report.html (the plots and the table)");
  CLI::Option* emit =
      sub->add_option("--emit", opts->emit,
                      "Do not run: write DIR/commands.txt, one self-contained `hpzlab sim` "
                      "command per (point, variant) (with --repro also an `hpzlab repro` per "
                      "point), for GNU parallel or a Slurm job array (docs/sweep.md), then "
                      "collect with --collect DIR")
          ->excludes(out)
          ->excludes(resume)
          ->excludes(jobs)
          ->excludes(plot);
  sub->add_option("--collect", opts->collect,
                  "Write DIR/results.csv and results.jsonl from what the commands --emit wrote "
                  "to DIR/out (takes no scenario; --plot allowed)")
      ->excludes(scenario)
      ->excludes(set)
      ->excludes(vary)
      ->excludes(variants)
      ->excludes(runs)
      ->excludes(jobs)
      ->excludes(out)
      ->excludes(resume)
      ->excludes(repro)
      ->excludes(emit);
  sub->callback([opts, &exit_code] { run_sweep(*opts, exit_code); });
}

}  // namespace hpz::cli
