// `hpzlab repro SCENARIO [--steps N] [--runs N] [--mode M] [--json FILE] [--csv FILE]
// [--plot FILE]`: replays stock, host-sync, event-wait and hpZ off on the same seeds and shows
// whether the loss goes NaN (or wrong) and whether both fixes train bit for bit like no-hpz.
// Exit 0 when both fixes match no-hpz, 1 when a fix does not or a variant hangs (mismatched
// collectives: reported, not replayed), 2 on bad input. With --schedule FILE: the replay of
// that one schedule, with numbers against its serialized replay where the scenario's Llama
// computes it (a recording of tiny.toml's model), else taint; exit 1 when it went bad in a run.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/driver/repro.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/replay/explore.hpp"
#include "sim/replay/explored_order.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** What `hpzlab repro` takes. */
struct ReproCliOptions {
  ScenarioOptions common;
  std::optional<int> steps;  ///< none: the scenario's run.steps
  int runs = 1;
  std::string mode = "auto";
  std::string csv;
  std::string plot;
  std::string order;  ///< --order FILE: replay that explored order (hpzlab explore --order-out)
};

}  // namespace

replay::Mode replay_mode(const std::string& mode, const Scenario& sc, const std::string& file) {
  const replay::Mode m = mode == "auto"    ? replay::default_mode(sc)
                         : mode == "taint" ? replay::Mode::kTaint
                                           : replay::Mode::kNumeric;
  if (m == replay::Mode::kNumeric && !replay::numeric_fits(replay_inputs_of(sc))) {
    throw InputError(file, "--mode",
                     "numeric replay needs a small Llama (no biases, untied embeddings; under 4e7 "
                     "parameters over all ranks, 4096 tokens; use taint or auto)");
  }
  return m;
}

namespace {

/** The four variants of the scenario; exit 0 when both fixes match no-hpz. */
/** Whether a stock run went bad first in its last step with that step's loss still good: the
 *  bite reached the weights through the step's update, and only the next step's loss shows it. */
bool bite_unseen_in_the_loss(const replay::ReproResult& r) {
  for (const replay::VariantRepro& v : r.variants) {
    if (v.name != "stock") continue;
    for (std::size_t i = 0; i < v.runs.size() && i < v.first_bad.size(); ++i) {
      const std::vector<replay::StepRecord>& steps = v.runs[i].steps;
      if (!steps.empty() && v.first_bad[i] == static_cast<int>(steps.size()) - 1 &&
          steps.back().loss_health == replay::Health::kGood) {
        return true;
      }
    }
  }
  return false;
}

/** Why a fix went bad, where the checker can say: the reads its schedule has that no ordering
 *  fix touches (uninitialized or stale; e.g. DeepSpeed 0.13.4's secondary copy bounds, which
 *  leave slices unwritten where a parameter does not divide the world). "" when it has none. */
std::string fix_defect_note(const Scenario& sc, const std::string& variant) {
  Scenario fixed = sc;
  fixed.run.variant = variant == "host-sync" ? Variant::kHostSync : Variant::kEventWait;
  const check::CheckResult c = check::check_schedule_by_class(build_schedule(fixed));
  const std::uint64_t uninit = c.count(check::FindingKind::kUninitializedRead);
  const std::uint64_t stale = c.count(check::FindingKind::kStaleRead);
  if (uninit + stale == 0) return "";
  return fmt::format(
      "{} went bad with the race ordered: its schedule has {} uninitialized and {} stale read(s), "
      "which no ordering fix touches (`hpzlab check` on the same scenario and keys with --set "
      "run.variant={} names them and what to do)",
      variant, uninit, stale, variant);
}

replay::ReproResult repro_variants(const ReproCliOptions& o, Scenario& sc, replay::ReproOptions ro,
                                   int& exit_code) {
  if (o.steps) sc.run.steps = *o.steps;
  ro.mode = replay_mode(o.mode, sc, sc.path);
  ro.progress = [](int done, int total) {
    progress_bar(done, total, fmt::format("{}/{} replays (4 variants x --runs)", done, total));
  };
  replay::ReproResult r = replay::run_repro(sc, ro);
  // A bite in the last step shows in the weights only (its loss was computed before it): without
  // --steps, one more step is replayed so that the default shows what the bite does to the loss
  // (issue 35: `repro scenarios/llama2-7b.toml` read "final loss good" for its 2 steps).
  if (!o.steps && bite_unseen_in_the_loss(r)) {
    const int asked = sc.run.steps;
    sc.run.steps = asked + 1;
    sc.notes.push_back(fmt::format(
        "run.steps = {} (the scenario's {} and one more): the weights went bad in step {}, the "
        "last, and only the next step's loss shows what they do (--steps {} keeps the scenario's)",
        asked + 1, asked, asked - 1, asked));
    r = replay::run_repro(sc, ro);
  }
  bool fixes_ok = true;
  bool hangs = false;
  for (const auto& v : r.variants) {
    const bool fix = v.name == "host-sync" || v.name == "event-wait";
    if (fix && fixes_ok && v.share_bad() > 0) {
      if (std::string why = fix_defect_note(sc, v.name); !why.empty()) {
        sc.notes.push_back(std::move(why));
      }
    }
    if (fix) fixes_ok = fixes_ok && v.share_bad() == 0;
    for (const auto& run : v.runs) hangs = hangs || !run.hang.empty();
  }
  exit_code = fixes_ok && !hangs ? kExitOk : kExitFindings;
  return r;
}

/** --schedule FILE: the replay of that schedule; exit 0 when no run went bad. */
replay::ReproResult repro_file(const ReproCliOptions& o, Scenario sc, replay::ReproOptions ro,
                               int& exit_code) {
  const std::string& file = o.common.schedule;
  // auto: numbers where the scenario's Llama computes the schedule (replay_schedule decides).
  if (o.mode == "numeric") ro.mode = replay::Mode::kNumeric;
  if (o.mode == "taint") ro.mode = replay::Mode::kTaint;
  if (o.steps) throw InputError(file, "--steps", "a schedule read from a file has its steps");
  const Schedule schedule = schedule_for(sc, file);
  ro.progress = [](int done, int total) {
    progress_bar(done, total, fmt::format("{}/{} replays", done, total));
  };
  replay::ReproResult r = replay::replay_schedule(sc, schedule, file, ro);
  exit_code = r.variants.front().share_bad() == 0 ? kExitOk : kExitFindings;
  return r;
}

/** --order FILE: the scenario's schedule replayed along that order and along the serialized
 *  one; exit 1 when the weights differ (the order corrupts them), 0 when they agree. */
void repro_order(const ReproCliOptions& o, int& exit_code) {
  if (!o.common.schedule.empty() || o.steps || o.runs != 1 || !o.csv.empty() || !o.plot.empty()) {
    throw InputError("", "--order",
                     "replays one order of the scenario's own schedule: it takes no --schedule, "
                     "--steps, --runs, --csv or --plot");
  }
  std::vector<std::string> inputs = inputs_of(o.common);
  inputs.push_back(o.order);
  check_outputs({{o.common.json, "--json"}}, inputs);
  const Scenario sc = load(o.common);
  const replay::Mode mode = replay_mode(o.mode, sc, sc.path);
  const Schedule schedule = build_schedule(sc);
  const Timeline order = replay::read_explored_order(
      read_input_file(o.order, o.order, "--order", "cannot read this order file"), o.order,
      schedule);
  const replay::ReplayResult r = replay::replay(replay_inputs_of(sc), schedule, order, mode);
  const replay::ReplayResult ref =
      replay::replay(replay_inputs_of(sc), schedule, replay::serialized_timeline(schedule), mode);
  const int bad = replay::first_difference(r, ref);
  const char* mode_name = mode == replay::Mode::kNumeric ? "numeric" : "taint";
  std::string text =
      fmt::format("{} [{}] along the order in {} ({} replay):\n", sc.path,
                  schedule_label(schedule.variant, schedule.source), o.order, mode_name);
  nlohmann::json steps = nlohmann::json::array();
  for (std::size_t k = 0; k < r.steps.size() && k < ref.steps.size(); ++k) {
    const bool same = bad < 0 || static_cast<int>(k) < bad;
    text += fmt::format("  step {}: {}; serialized reference: {}{}\n", k,
                        replay::describe_step(r.steps[k], mode),
                        replay::describe_step(ref.steps[k], mode), same ? "" : "  <- differs");
    steps.push_back({{"step", k},
                     {"loss", r.steps[k].loss},
                     {"reference_loss", ref.steps[k].loss},
                     {"weights_hash", r.steps[k].weights_hash},
                     {"reference_weights_hash", ref.steps[k].weights_hash},
                     {"bad_elements", r.steps[k].bad_elements},
                     {"reference_bad_elements", ref.steps[k].bad_elements}});
  }
  text += bad < 0
              ? "the weights are the serialized reference's, bit for bit\n"
              : fmt::format("the weights differ from the serialized reference from step {}\n", bad);
  if (!o.common.json.empty()) {
    const nlohmann::json j{{"scenario", sc.path}, {"variant", schedule.variant},
                           {"order", o.order},    {"mode", mode_name},
                           {"steps", steps},      {"first_bad_step", bad},
                           {"notes", sc.notes}};
    write_output(o.common.json, j.dump(2) + "\n", "--json");
  }
  text += notes_text(sc);
  if (o.common.json != "-") std::fwrite(text.data(), 1, text.size(), stdout);
  exit_code = bad < 0 ? kExitOk : kExitFindings;
}

void run_repro_cmd(const ReproCliOptions& o, int& exit_code) {
  if (!o.order.empty()) {
    repro_order(o, exit_code);
    return;
  }
  if (o.steps) require_at_least("--steps", *o.steps, 1);
  require_at_least("--runs", o.runs, 1);
  check_outputs({{o.common.json, "--json"}, {o.csv, "--csv"}, {o.plot, "--plot"}},
                inputs_of(o.common));
  replay::ReproOptions ro;
  ro.runs = o.runs;
  Scenario sc = load(o.common);
  const replay::ReproResult r = o.common.schedule.empty() ? repro_variants(o, sc, ro, exit_code)
                                                          : repro_file(o, sc, ro, exit_code);
  if (!o.common.json.empty())
    write_output(o.common.json, replay::repro_json(r, sc.notes), "--json");
  if (!o.csv.empty()) write_output(o.csv, replay::repro_csv(r), "--csv");
  if (!o.plot.empty()) write_output(o.plot, replay::repro_svg(r), "--plot");
  if (o.common.json != "-") {
    const std::string text = replay::repro_table(r) + notes_text(sc);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
}

}  // namespace

void setup_repro(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ReproCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "repro",
      "Replay the data of stock, host-sync, event-wait and no-hpz on the same seeds: first bad "
      "step, losses, share of runs that went bad (exit 0 when both fixes match no-hpz)");
  add_scenario_options(*sub, o->common);
  add_schedule_option(*sub, o->common.schedule);
  sub->add_option("--steps", o->steps,
                  "Optimizer steps, 1 or more (default: the scenario's run.steps)");
  sub->add_option("--runs", o->runs, "Runs, seeds run.seed, run.seed + 1, ... (1 or more)");
  sub->add_option("--mode", o->mode, "numeric | taint | auto (numeric when the model is small)")
      ->check(CLI::IsMember({"auto", "numeric", "taint"}));
  sub->add_option("--csv", o->csv, "Write the loss per step, variant and run as CSV to FILE");
  sub->add_option("--plot", o->plot, "Write the loss curves as an SVG plot to FILE");
  sub->add_option(
      "--order", o->order,
      "Replay the scenario's schedule along this explored order (hpzlab explore "
      "--order-out FILE) and compare with the serialized one (exit 1 when they differ)");
  sub->callback([o, &exit_code] { run_repro_cmd(*o, exit_code); });
}

}  // namespace hpz::cli
