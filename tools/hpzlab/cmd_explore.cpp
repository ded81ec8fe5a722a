// `hpzlab explore SCENARIO [--schedule FILE] [--budget N] [--seed S] [--depth D] [--mode M]
// [--order-out FILE] [--json FILE]`: runs the schedule (the scenario's, or the one in FILE: a
// recording of every rank, say) in orders happens-before allows (the checker's race pairs both
// ways, then PCT random orders), replays the data along each and compares the final weights with
// the serialized reference (sim/replay/explore.hpp, docs/explore.md). Exit 0 when every explored
// order gives the reference's weights, 1 with a counterexample, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "sim/check/checker.hpp"
#include "sim/check/finding_log.hpp"
#include "sim/check/report.hpp"
#include "sim/driver/repro.hpp"
#include "sim/error.hpp"
#include "sim/replay/explore.hpp"
#include "sim/replay/explored_order.hpp"
#include "sim/time/engine.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

struct ExploreCliOptions {
  ScenarioOptions common;
  int budget = 1000;
  std::uint64_t seed = 1;
  int depth = 3;
  std::string mode = "auto";
  std::string order_out;
};

/** The checker's race pairs, every occurrence of every race group, each pair once. */
std::vector<replay::RacePair> race_pairs(const check::CheckResult& result) {
  std::vector<replay::RacePair> out;
  std::set<std::tuple<Rank, std::uint32_t, std::uint32_t>> seen;
  for (const check::FindingGroup& g : result.groups) {
    if (g.example.kind != check::FindingKind::kRace) continue;
    for (const check::OpPair& p : g.occurrences) {
      if (seen.emplace(p.rank, p.first, p.second).second)
        out.push_back({p.rank, p.first, p.second});
    }
  }
  return out;
}

/** What explore found, with what its text and JSON name it by. */
struct Explored {
  const Scenario& sc;
  const Schedule& schedule;
  const replay::ExploreResult& r;
  replay::Mode mode;
  std::string name;       ///< "SCENARIO [label]", the verdict's name
  std::size_t pairs = 0;  ///< the checker's race pairs
  bool checker_clean = false;

  const char* mode_name() const { return mode == replay::Mode::kNumeric ? "numeric" : "taint"; }
  int orders() const { return r.targeted + r.random; }
};

/** The options explore runs with: the command line's, and the replay mode, decided once: the
 *  scenario's for its own schedule; for a file's, numbers only where the scenario's Llama
 *  computes its parameters (replay::schedule_mode). */
replay::ExploreOptions explore_options(const ExploreCliOptions& o, const Scenario& sc,
                                       const Schedule& schedule, const std::string& file) {
  replay::ExploreOptions eo;
  eo.budget = o.budget;
  eo.seed = o.seed;
  eo.depth = o.depth;
  if (file.empty()) {
    eo.mode = replay_mode(o.mode, sc, sc.path);
  } else {
    std::optional<replay::Mode> asked;
    if (o.mode != "auto") asked = o.mode == "taint" ? replay::Mode::kTaint : replay::Mode::kNumeric;
    eo.mode = replay::schedule_mode(sc, schedule, file, asked);
  }
  eo.progress = [](int done, int total) {
    progress_bar(done, total, fmt::format("{}/{} orders explored", done, total));
  };
  return eo;
}

/** The text when every explored order gives the reference's weights, with a note on a reference
 *  that hangs or is bad itself, or on orders that hung. */
std::string identical_text(const Explored& e) {
  const replay::ExploreResult& r = e.r;
  const int orders = e.orders();
  std::string text = fmt::format(
      "{}: {} order{} explored ({} targeted over {} race pair{}, {} random, {} replay), all "
      "bit-identical to the serialized reference\n",
      e.name, orders, orders == 1 ? "" : "s", r.targeted, e.pairs, e.pairs == 1 ? "" : "s",
      r.random, e.mode_name());
  if (!r.reference_complete) {
    text += fmt::format(
        "  note: the serialized reference hangs (a collective some member never reaches), and "
        "{} of the {} explored orders hung like it; in {} targeted order(s) the race pair lies "
        "after the hang and never ran\n",
        r.incomplete, orders, r.unreached);
  } else if (r.reference_bad_step >= 0) {
    text += fmt::format(
        "  note: the serialized reference itself is bad from step {} ({}): the checker's "
        "uninitialized or stale reads; where every order is bad alike, a race changes nothing "
        "this comparison sees\n",
        r.reference_bad_step,
        replay::describe_step(r.reference.steps[static_cast<std::size_t>(r.reference_bad_step)],
                              e.mode));
  } else if (r.incomplete > 0) {
    text += fmt::format("  note: {} order(s) hung (a collective some member never reaches)\n",
                        r.incomplete);
  }
  return text;
}

/** The counterexample's lines: the race pair it ran the other way (also into `cj`), then the
 *  steps from the first that differs (three at most), this order's and the reference's. */
std::string counterexample_steps(const Explored& e, const replay::Counterexample& c,
                                 nlohmann::json& cj) {
  std::string text;
  if (c.pair) {
    const check::FindingLog log(e.schedule);
    const auto ran_first = c.second_first ? c.pair->second : c.pair->first;
    const auto ran_later = c.second_first ? c.pair->first : c.pair->second;
    text += fmt::format("  ran first: {}\n  then:      {}\n",
                        check::describe(log.label(c.pair->rank, ran_first)),
                        check::describe(log.label(c.pair->rank, ran_later)));
    cj["rank"] = c.pair->rank;
    cj["ran_first"] = ran_first;
    cj["ran_later"] = ran_later;
  }
  // The steps from the first that differs (three at most): this order, then the reference.
  for (std::size_t k = static_cast<std::size_t>(std::max(c.first_bad_step, 0));
       k < std::min({c.result.steps.size(), e.r.reference.steps.size(),
                     static_cast<std::size_t>(std::max(c.first_bad_step, 0)) + 3});
       ++k) {
    text += fmt::format("  step {}: {} in this order; {} in the serialized reference\n", k,
                        replay::describe_step(c.result.steps[k], e.mode),
                        replay::describe_step(e.r.reference.steps[k], e.mode));
  }
  return text;
}

/** The counterexample's text and (in `cj`) JSON; writes its order to --order-out if given. */
std::string counterexample_text(const ExploreCliOptions& o, const Explored& e, nlohmann::json& cj) {
  const replay::Counterexample& c = *e.r.counterexample;
  std::string text =
      fmt::format("{}: counterexample in the {} phase (order {} of {} explored, {} replay)\n",
                  e.name, c.phase, c.order + 1, e.orders(), e.mode_name());
  cj = {{"phase", c.phase}, {"order", c.order}, {"first_bad_step", c.first_bad_step}};
  text += counterexample_steps(e, c, cj);
  if (e.checker_clean) {
    text +=
        "  note: the checker proves this schedule race-free: a counterexample contradicts "
        "it (please report)\n";
  }
  if (!o.order_out.empty()) {
    write_output(o.order_out,
                 replay::explored_order_text(e.schedule, e.sc.path, o.common.sets, c.timeline),
                 "--order-out");
    std::string sets;
    for (const std::string& set : o.common.sets) sets += " --set " + set;
    text += fmt::format("  the order: {} (replay it: hpzlab repro {}{} --order {})\n", o.order_out,
                        e.sc.path, sets, o.order_out);
  }
  return text;
}

void run_explore(const ExploreCliOptions& o, int& exit_code) {
  require_at_least("--budget", o.budget, 1);
  require_at_least("--depth", o.depth, 1);
  check_outputs({{o.common.json, "--json"}, {o.order_out, "--order-out"}}, inputs_of(o.common));
  const std::string& file = o.common.schedule;
  if (!file.empty() && !o.order_out.empty()) {
    throw InputError(file, "--order-out",
                     "`repro --order` replays an order of the scenario's own schedule, not of a "
                     "schedule read from a file: drop --order-out or --schedule");
  }
  Scenario sc = load(o.common);
  const Schedule schedule = schedule_for(sc, file);
  const replay::ExploreOptions eo = explore_options(o, sc, schedule, file);
  check::CheckResult checked;
  run_showing_progress(0, o.budget, "checking the schedule",
                       [&] { checked = check::check_schedule(schedule); });
  const std::vector<replay::RacePair> pairs = race_pairs(checked);
  Timeline timing;
  run_showing_progress(0, o.budget, "one timed run (the targeted phase's other choices)", [&] {
    timing = time::run_isolated(timing_inputs_of(sc), schedule, sc.run.seed).timeline;
  });
  const replay::ExploreResult r =
      replay::explore(replay_inputs_of(sc), schedule, pairs, timing, eo);
  end_progress_line();

  const Explored e{sc,
                   schedule,
                   r,
                   eo.mode,
                   fmt::format("{} [{}]", file.empty() ? sc.path : file,
                               schedule_label(schedule.variant, schedule.source)),
                   pairs.size(),
                   checked.clean()};
  std::string text;
  nlohmann::json j{{"scenario", sc.path},
                   {"variant", schedule.variant},
                   {"mode", e.mode_name()},
                   {"budget", o.budget},
                   {"seed", o.seed},
                   {"depth", o.depth},
                   {"race_pairs", pairs.size()},
                   {"checker_clean", checked.clean()},
                   {"targeted", r.targeted},
                   {"random", r.random},
                   {"incomplete", r.incomplete},
                   {"unreorderable", r.unreorderable}};
  if (!r.counterexample) {
    text = identical_text(e);
    j["counterexample"] = nullptr;
    exit_code = kExitOk;
  } else {
    nlohmann::json cj;
    text = counterexample_text(o, e, cj);
    j["counterexample"] = cj;
    exit_code = kExitFindings;
  }
  j["notes"] = sc.notes;
  text += notes_text(sc);
  if (!o.common.json.empty()) write_output(o.common.json, j.dump(2) + "\n", "--json");
  if (o.common.json != "-") std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void setup_explore(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ExploreCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "explore",
      "Run the schedule in orders happens-before allows (each race pair both ways, then PCT "
      "random orders), replay the data along each and compare the weights with the serialized "
      "reference (exit 0 all identical, 1 counterexample)");
  add_scenario_options(*sub, opts->common);
  add_schedule_option(*sub, opts->common.schedule);
  sub->add_option("--budget", opts->budget,
                  "Orders to explore in all, targeted first (default 1000)");
  sub->add_option("--seed", opts->seed, "Seed of the random phase (default 1)");
  sub->add_option("--depth", opts->depth,
                  "PCT's bug depth d: d - 1 priority change points per random order (default 3)");
  sub->add_option("--mode", opts->mode,
                  "Replay: auto (numeric when the model fits), numeric, taint")
      ->check(CLI::IsMember({"auto", "numeric", "taint"}));
  sub->add_option("--order-out", opts->order_out,
                  "Write the counterexample's order (every op's issue, start and end) as JSON");
  sub->callback([opts, &exit_code] { run_explore(*opts, exit_code); });
}

}  // namespace hpz::cli
