// What the files of `hpzlab check` share: its options, a verdict (Checked) and the functions one
// file calls in another. cmd_check.cpp binds the options and runs the check; check_matrix.cpp
// builds and checks each scenario under each epoch of releases; check_record.cpp records
// DeepSpeed, compares with the builder and checks a --schedule FILE; check_text.cpp writes the
// text; check_reports.cpp the JSON, JUnit and SARIF. Not a public face: only these files
// include it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/check/checker.hpp"
#include "sim/check/explain.hpp"
#include "sim/check/release_history.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/ir/projection.hpp"
#include "sim/time/sensitivity.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {

/** What `hpzlab check` takes. */
struct CheckOptions {
  std::vector<std::string> scenarios;  ///< scenario files, checked in order
  std::vector<std::string> sets;       ///< --set key=value, applied to every scenario
  std::string json;                    ///< --json FILE ("-" = standard output)
  std::string schedule;                ///< --schedule FILE: check it instead of building one
  std::string deepspeed;     ///< --deepspeed V1,V2,...: the version matrix (DeepSpeed builder)
  std::string junit;         ///< --junit FILE: JUnit XML, a test case per checked schedule
  std::string sarif;         ///< --sarif FILE: SARIF 2.1.0, a result per finding group
  UserFlags user;            ///< --ds-config, --hf-config, --nodes, --gpus-per-node
  bool record = false;       ///< --record: the matrix over recordings of real DeepSpeed
  std::string record_dir;    ///< --record-dir DIR: keep the recordings and their inputs there
  bool explain = false;      ///< --explain: say what orders the secondary copies of a clean run
  bool sensitivity = false;  ///< --sensitivity: how close each race came in the simulation
  bool per_rank = false;     ///< --per-rank: check every rank, not one per symmetry class
};

/** One line of the version matrix: releases whose schedules the builder makes alike (equal
 *  rules, sim/deepspeed_releases.hpp), checked once as the first of them; or, where the builder
 *  lacks a rule they need, the rule. With --record each release is its own epoch. */
struct MatrixEpoch {
  std::vector<std::string> releases;  ///< oldest first
  const ReleaseRule* missing = nullptr;
};

/** --explain: one config key at ten times the run's value, and what the checker then finds on
 *  the secondary shards. */
struct Probe {
  std::string key;  ///< scenario key, e.g. "zero.stage3_max_live_parameters"
  std::int64_t value = 0;
  std::uint64_t races = 0;
  std::uint64_t stale = 0;
  std::string refused;  ///< the builder refused the changed run (its one line)
};

/** A verdict and what it covered. */
struct Checked {
  check::CheckResult result;
  int steps = 0;                   ///< optimizer steps in the checked schedule
  bool from_file = false;          ///< --schedule FILE: its steps are the recording's
  std::vector<std::string> notes;  ///< what loading the scenario noted (Scenario::notes)
  /** --record: the DeepSpeed builder's schedule of the same scenario against the recording. */
  std::optional<RecordingComparison> builder;
  /** --deepspeed: the releases this verdict covers (one epoch of the matrix), oldest first. */
  std::vector<std::string> releases;
  /** Not checked: why the builder refused these releases (a rule it lacks, or DeepSpeed raising
   *  on this configuration); `result` then holds only the scenario's name. */
  std::string refused;
  /** The DeepSpeed defects of this release on this run (known_defects): not the checker's
   *  kinds, but findings all the same (the exit status, `clean`, JUnit). */
  std::vector<const ReleaseRule*> defects;
  /** The DeepSpeed release checked alone (no --deepspeed matrix; the DeepSpeed builder). */
  std::string release;
  /** --explain on a clean verdict: what orders the secondary copies, and which keys break it. */
  std::optional<check::OrderExplanation> explanation;
  std::vector<Probe> probes;
  /** --sensitivity on a verdict with a race: the simulated timeline's closest race, and which
   *  single change of cluster or cost model would flip it (sim/time/sensitivity.hpp). */
  std::optional<time::SensitivityResult> sensitivity;
  /** Why the check ran rank by rank rather than by symmetry class ("": by class, or --per-rank),
   *  for standard error. */
  std::string rank_by_rank;

  /** Checked, nothing found and no known defect: a release to run this on. */
  bool clean() const { return refused.empty() && result.clean() && defects.empty(); }
};

// check_matrix.cpp: the scenarios built (or recorded) and checked.

/** The --set overrides, parsed. */
std::vector<Override> overrides_of(const CheckOptions& opts);

/** The releases --deepspeed names (a release, latest, all, A..B, or a comma-separated list of
 *  these), oldest first. */
std::vector<std::string> releases_of(const CheckOptions& opts);

/** Whether --deepspeed names more than one release: a refused release then gets its line and
 *  the matrix goes on; one release alone is refused in one line (exit 2). */
bool is_matrix(const std::vector<std::string>& releases);

/** The check of one schedule (`what` names it): one rank per symmetry class, the same report as
 *  rank by rank, unless --per-rank. A schedule whose ranks are not alike is checked rank by
 *  rank, and `note` says so, for standard error (not the report, the same either way). */
check::CheckResult check_one(const Schedule& schedule, const CheckOptions& opts,
                             const std::string& what, std::string& note);

/** --sensitivity: the schedule simulated once (the scenario's seed) and, when a race is in it,
 *  every cost input scaled alone (`hpzlab sim --sensitivity`); none for a race-free schedule. */
std::optional<time::SensitivityResult> timing_margin(const Scenario& sc, const Schedule& schedule,
                                                     const check::CheckResult& result,
                                                     bool show_progress);

/** Each scenario (or the user's files) checked once, or under each epoch of `releases` (the
 *  version matrix), in the scenarios' order. */
std::vector<Checked> check_scenarios(const CheckOptions& opts,
                                     const std::vector<std::string>& releases);

// check_record.cpp: recordings of real DeepSpeed and schedules read from a file.

/** --record: the recording against the DeepSpeed builder's schedule of the same scenario
 *  (sim/projection.hpp); the builder's refusal is the comparison's error. */
RecordingComparison compare_with_builder(const Scenario& sc, const Schedule& rec);

/** --record: the schedule real DeepSpeed issues for `sc` (its version, cluster, model and
 *  ds_config: sim/record_inputs.hpp), recorded by tools/record into `dir`. */
Schedule record_schedule(const Scenario& sc, const std::filesystem::path& dir);

/** --schedule FILE: one schedule; a scenario, if given, only has to agree on the world size. */
Checked check_file(const CheckOptions& opts);

// check_text.cpp: the verdicts as text.

/** A known DeepSpeed defect in one sentence: short (a matrix's line, JUnit's message) or whole
 *  (one release's text, SARIF's message). */
std::string defect_sentence(const ReleaseRule& r, bool whole);

/** A clean verdict on one step says nothing about the hpZ race: the note that says so ("" where
 *  it does not apply). */
std::string one_step_note(const Checked& c);

/** A refused epoch's one line, in the verdict line's form. */
std::string refused_line(const Checked& c);

/** The matrix's epochs of one scenario, for the history across releases. */
std::vector<check::EpochVerdict> epochs_of_scenario(const std::vector<Checked>& checked,
                                                    const std::string& scenario);

/** The releases of `scenario`'s matrix that are clean (Checked::clean), consecutive clean epochs
 *  joined into one run ("0.13.5-0.14.2"). */
std::vector<std::string> clean_runs(const std::vector<Checked>& checked,
                                    const std::string& scenario);

/** The text output: each verdict's report (`reports`, one per verdict) with its defects, builder
 *  comparison, explanation, margin and notes; a line per epoch when `matrix`. */
std::string check_text(const CheckOptions& opts, const std::vector<Checked>& checked,
                       const std::vector<std::string>& reports, bool matrix);

// check_reports.cpp: the machine-readable outputs.

/** --json: the checker's JSON of `results` with the notes, defects, builder comparisons,
 *  explanations, margins and the matrix's releases of `checked`. */
nlohmann::json check_json(const CheckOptions& opts, const std::vector<Checked>& checked,
                          const std::vector<check::CheckResult>& results);

/** --junit: a test case per verdict, `reports` its text. */
std::string junit_xml(const std::vector<Checked>& checked, const std::vector<std::string>& reports);

/** --sarif: `results` with the known DeepSpeed defects of each checked release. */
std::string sarif_text(const std::vector<Checked>& checked,
                       const std::vector<check::CheckResult>& results);

}  // namespace hpz::cli
