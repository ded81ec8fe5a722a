// `hpzlab check SCENARIO... [--set k=v] [--json FILE]` and `hpzlab check --schedule FILE
// [SCENARIO]`: proves or refutes, independent of timing, that each scenario's schedule (or the
// schedule in FILE, whose world size a scenario given with it must match) is free of races,
// stale and uninitialized reads and mismatched collectives. Exit 0 when all are clean, 1 when
// anything was found, 2 on bad input.
//
// This file binds the options and runs the check; check_internal.hpp says which file does what.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sim/check/checker.hpp"
#include "sim/check/report.hpp"
#include "sim/error.hpp"
#include "tools/hpzlab/check_internal.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** Checks the output flags before anything runs: at most one writes to standard output, each
 *  can be written and none is an input. Returns whether the text goes to standard output. */
bool check_output_flags(const CheckOptions& opts) {
  const int to_stdout = static_cast<int>(opts.json == "-") + static_cast<int>(opts.junit == "-") +
                        static_cast<int>(opts.sarif == "-");
  if (to_stdout > 1) {
    throw InputError("", "--json/--junit/--sarif",
                     "only one of them can write to standard output ('-')");
  }
  std::vector<std::string> inputs = opts.scenarios;
  inputs.insert(inputs.end(), {opts.schedule, opts.user.ds_config, opts.user.hf_config});
  check_outputs({{opts.json, "--json"}, {opts.junit, "--junit"}, {opts.sarif, "--sarif"}}, inputs);
  return to_stdout == 0;
}

/** The checker's results of the verdicts that were checked (not refused); says on standard
 *  error which of them were checked rank by rank. */
std::vector<check::CheckResult> results_of(const std::vector<Checked>& checked) {
  std::vector<check::CheckResult> results;
  for (const Checked& c : checked) {
    if (c.refused.empty()) results.push_back(c.result);
    if (!c.rank_by_rank.empty()) {
      end_progress_line();
      std::fprintf(stderr, "%s\n", c.rank_by_rank.c_str());
    }
  }
  return results;
}

/** Each verdict's text report (or a refused epoch's line), rendered once for the text and the
 *  JUnit output. */
std::vector<std::string> reports_of(const std::vector<Checked>& checked) {
  std::vector<std::string> reports;
  for (const Checked& c : checked) {
    reports.push_back(c.refused.empty() ? check::TextReporter().render_one(c.result)
                                        : refused_line(c));
  }
  return reports;
}

void run_check(const CheckOptions& opts, int& exit_code) {
  const bool text_out = check_output_flags(opts);
  // --deepspeed's releases, read once: they decide the jobs and whether the text is a matrix.
  const std::vector<std::string> releases =
      opts.schedule.empty() ? releases_of(opts) : std::vector<std::string>{};
  const bool matrix = is_matrix(releases);
  if (opts.sensitivity && (matrix || opts.record)) {
    throw InputError("", "--sensitivity",
                     "simulates one release's schedule (seconds to minutes a scenario): give "
                     "--deepspeed one release, without --record");
  }
  const std::vector<Checked> checked = opts.schedule.empty()
                                           ? check_scenarios(opts, releases)
                                           : std::vector<Checked>{check_file(opts)};
  const std::vector<check::CheckResult> results = results_of(checked);
  if (!opts.json.empty()) {
    write_output(opts.json, check_json(opts, checked, results).dump(2) + "\n", "--json");
  }
  const std::vector<std::string> reports =
      text_out || !opts.junit.empty() ? reports_of(checked) : std::vector<std::string>{};
  if (!opts.junit.empty()) write_output(opts.junit, junit_xml(checked, reports), "--junit");
  if (!opts.sarif.empty()) write_output(opts.sarif, sarif_text(checked, results), "--sarif");
  if (text_out) {
    const std::string text = check_text(opts, checked, reports, matrix);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  bool clean = true;
  for (const auto& r : results) clean = clean && r.clean();
  for (const Checked& c : checked) clean = clean && c.defects.empty();
  exit_code = clean ? kExitOk : kExitFindings;
}

}  // namespace

void setup_check(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<CheckOptions>();
  CLI::App* sub = app.add_subcommand(
      "check",
      "Prove or refute, independent of timing, that each scenario's schedule (or the one in "
      "--schedule FILE) is free of races, stale or uninitialized reads and mismatched collectives "
      "(exit 0 clean, 1 findings)");
  sub->add_option("scenario", opts->scenarios,
                  "Scenario files (TOML), e.g. scenarios/llama2-7b.toml (with --schedule: at most "
                  "one, whose world size the schedule must have)");
  sub->add_option("--set", opts->sets,
                  "Override a scenario key in every scenario, e.g. --set zero.overlap_comm=false "
                  "(repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  sub->add_option("--json", opts->json,
                  "Also write the findings as JSON to FILE ('-' = stdout, instead of the text)");
  sub->add_option("--deepspeed", opts->deepspeed,
                  "The version matrix: check each scenario under these DeepSpeed releases, built "
                  "by the DeepSpeed builder: a release, latest, all, a range A..B, or a "
                  "comma-separated list (e.g. 0.13.1,0.13.4 or 0.13.0..0.19.8); one verdict line "
                  "(and the worst finding) per epoch of releases that issue the same schedule, "
                  "then each finding's first release and the release that fixed it");
  sub->add_option("--junit", opts->junit,
                  "Also write JUnit XML to FILE ('-' = stdout, instead of the text): a test case "
                  "per checked schedule, failed by any finding");
  sub->add_option("--sarif", opts->sarif,
                  "Also write SARIF 2.1.0 to FILE ('-' = stdout, instead of the text) for code "
                  "scanning: a result per group of findings, a rule per kind (docs/ci.md)");
  add_user_flags(*sub, opts->user, false);
  sub->add_flag("--record", opts->record,
                "With --deepspeed: record each version's schedule with real DeepSpeed on this CPU "
                "(hpzlab record: minutes per version, the first use installs its environment) "
                "and check the recordings instead of the builder's schedules");
  sub->add_option("--record-dir", opts->record_dir,
                  "With --record: keep the recordings and the files given to DeepSpeed in DIR "
                  "(VERSION-schedule.json, VERSION-config.json, VERSION-ds_config.json)");
  sub->add_flag("--explain", opts->explain,
                "On a clean verdict, say what orders each hpZ secondary copy before the gathers "
                "that read it (the schedule checked again without each kind of sync) and which "
                "config keys would break it (each at ten times its value); seconds to a minute");
  sub->add_option("--schedule", opts->schedule,
                  "Check the schedule in FILE (hpzlab's schedule JSON, e.g. from `hpzlab record` "
                  "or `hpzlab schedule --json`) instead of building one");
  sub->add_flag("--sensitivity", opts->sensitivity,
                "For a race: simulate the schedule on the scenario's cluster and say how close "
                "the closest race came to biting (or by how much it bit) and which single "
                "change of cluster or cost model (each scaled from x1/4 to x4) would flip it, "
                "as `hpzlab sim --sensitivity` does; seconds to minutes");
  sub->add_flag("--per-rank", opts->per_rank,
                "Check every rank's bytes, not one rank per symmetry class (ranks that issue the "
                "same ops at offsets in the same order; the report is the same)");
  sub->callback([opts, &exit_code] { run_check(*opts, exit_code); });
}

}  // namespace hpz::cli
