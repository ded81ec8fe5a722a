#include "sim/driver/repro.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/time/engine.hpp"

namespace hpz::replay {
namespace {

/** Tokens per second per node over the timeline's last step. */
double throughput(const Scenario& sc, const Schedule& s, const Timeline& t) {
  const int last = sc.run.steps - 1;
  double end_last = 0, end_prev = 0;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
      const double e = t.ranks[r][i].end_s;
      if (!std::isfinite(e)) return 0;
      if (s.ranks[r].ops[i].step == last) end_last = std::max(end_last, e);
      if (s.ranks[r].ops[i].step == last - 1) end_prev = std::max(end_prev, e);
    }
  }
  const double tokens = static_cast<double>(sc.training.seq_len) * sc.training.micro_batch *
                        sc.training.grad_accum * sc.cluster.gpus_per_node;
  return end_last > end_prev ? tokens / (end_last - end_prev) : 0;
}

bool step_bad(const StepRecord& s, const StepRecord* base, Mode mode) {
  if (mode == Mode::kTaint) return s.loss_health != Health::kGood || s.bad_elements > 0;
  if (!std::isfinite(s.loss)) return true;
  return base != nullptr && (s.loss != base->loss || s.weights_hash != base->weights_hash);
}

std::optional<int> first_bad(const ReplayResult& run, const ReplayResult* base) {
  if (!run.hang.empty()) return 0;  // it never finishes a step
  for (std::size_t k = 0; k < run.steps.size(); ++k) {
    const StepRecord* b = base != nullptr && k < base->steps.size() ? &base->steps[k] : nullptr;
    if (step_bad(run.steps[k], b, run.mode)) return static_cast<int>(k);
  }
  return std::nullopt;
}

/** `o.runs` seeded replays of one schedule; `serialized`: also each along the issue order. */
VariantRepro replay_runs(const std::string& name, const Scenario& sc, const Schedule& given,
                         Mode mode, const ReproOptions& o, int& done, int total,
                         bool serialized = false) {
  // Strided accesses written out once for all the runs, not at each replay().
  std::optional<Schedule> unfolded;
  if (has_strided_accesses(given)) unfolded = unfold_strided(given);
  const Schedule& s = unfolded ? *unfolded : given;
  VariantRepro v;
  v.name = name;
  for (int k = 0; k < o.runs; ++k) {
    Scenario run = sc;
    run.run.seed = sc.run.seed + static_cast<std::uint64_t>(k);
    const Timeline t = o.timeline(run, s, run.run.seed);
    const ReplayInputs in = replay_inputs_of(run);
    // A job that hangs has no data past the hang to replay: replaying what ran fed the numeric
    // model a gather's unwritten output (an empty span, a segfault with gathers on the compute
    // stream). Reported as the hang it is, as `sim` and `real` do.
    if (std::string hang = hang_of(s, t); !hang.empty()) {
      v.runs.push_back(ReplayResult{mode, {}, 0, std::move(hang)});
    } else {
      v.runs.push_back(replay(in, s, t, mode));
    }
    if (serialized) {
      v.serialized.push_back(replay(in, s, serialized_timeline(s), mode));
    }
    v.mixed_reads += v.runs.back().mixed_reads;
    v.tokens_per_s_per_node += throughput(run, s, t) / o.runs;
    if (o.progress) o.progress(++done, total);
  }
  return v;
}

VariantRepro run_variant(const std::string& name, const Scenario& sc, Mode mode,
                         const ReproOptions& o, int& done, int total, bool serialized) {
  // The seed moves times and data, not the schedule: one build for every run.
  return replay_runs(name, sc, build_schedule(sc), mode, o, done, total, serialized);
}

}  // namespace

Timeline sim_timeline(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed) {
  return time::run_isolated(timing_inputs_of(scenario), schedule, seed).timeline;
}

double VariantRepro::share_bad() const {
  if (first_bad.empty()) return 0;
  return static_cast<double>(std::count_if(first_bad.begin(), first_bad.end(),
                                           [](const auto& f) { return f.has_value(); })) /
         static_cast<double>(first_bad.size());
}

double VariantRepro::share_nan() const {
  if (runs.empty()) return 0;
  int n = 0;
  for (const auto& r : runs) {
    n += std::any_of(r.steps.begin(), r.steps.end(),
                     [](const StepRecord& s) { return s.loss_health == Health::kNan; });
  }
  return static_cast<double>(n) / static_cast<double>(runs.size());
}

Mode default_mode(const Scenario& scenario) {
  return numeric_fits(replay_inputs_of(scenario)) ? Mode::kNumeric : Mode::kTaint;
}

ReproResult run_repro(const Scenario& scenario, const ReproOptions& o) {
  ReproResult out;
  out.mode = o.mode.value_or(default_mode(scenario));
  out.scenario = scenario.path;
  out.timing = o.timing_name;
  out.first_seed = scenario.run.seed;
  out.steps = scenario.run.steps;
  out.spin_before_copy_us = scenario.run.spin_before_copy_us;
  constexpr Variant kHpzVariants[] = {Variant::kStock, Variant::kHostSync, Variant::kEventWait};
  const int total = static_cast<int>(std::size(kHpzVariants) + 1) * o.runs;  // and no-hpz
  int done = 0;
  const bool serialized = out.mode == Mode::kNumeric && scenario.zero.zero_quantized_weights;
  if (serialized) out.baseline = "serialized";
  for (Variant v : kHpzVariants) {
    Scenario sc = scenario;
    sc.run.variant = v;
    out.variants.push_back(run_variant(to_string(v), sc, out.mode, o, done, total, serialized));
  }
  Scenario off = scenario;
  off.run.variant = Variant::kStock;
  off.zero.zero_hpz_partition_size = 1;
  out.variants.push_back(run_variant("no-hpz", off, out.mode, o, done, total, serialized));
  const VariantRepro& base = out.variants.back();
  for (VariantRepro& v : out.variants) {
    for (std::size_t k = 0; k < v.runs.size(); ++k) {
      const ReplayResult* ref = serialized    ? &v.serialized[k]
                                : &v == &base ? nullptr
                                              : &base.runs[k];
      v.first_bad.push_back(first_bad(v.runs[k], ref));
    }
  }
  return out;
}

Mode schedule_mode(const Scenario& scenario, const Schedule& schedule, const std::string& name,
                   std::optional<Mode> asked) {
  if (const std::string why = replay_unsupported(schedule); !why.empty()) {
    throw InputError(name, "", "the data replay cannot follow this schedule: " + why);
  }
  // Numbers where the scenario's Llama is the schedule's model (a recording of it names the same
  // parameters, as the builder does), else taint.
  const ReplayInputs in = replay_inputs_of(scenario);
  const std::string unfit = numeric_fits(in) ? llama_unsupported(in, schedule)
                                             : "the scenario's model is too big or no Llama";
  if (asked == Mode::kNumeric && !unfit.empty()) {
    throw InputError(name, "--mode", "the numeric replay cannot compute this schedule: " + unfit);
  }
  return asked.value_or(unfit.empty() ? Mode::kNumeric : Mode::kTaint);
}

ReproResult replay_schedule(const Scenario& scenario, const Schedule& schedule,
                            const std::string& name, const ReproOptions& o) {
  ReproResult out;
  out.scenario = name;
  out.mode = schedule_mode(scenario, schedule, name, o.mode);
  out.timing = o.timing_name;
  out.first_seed = scenario.run.seed;
  out.steps = scenario.run.steps;
  // A schedule read from a file has no variants to compare: its numbers are held against the
  // same schedule replayed one op at a time in issue order, where no race can bite.
  const bool serialized = out.mode == Mode::kNumeric;
  if (serialized) out.baseline = "serialized";
  int done = 0;
  const std::string variant = schedule.variant.empty() ? "recorded" : schedule.variant;
  out.variants.push_back(
      replay_runs(variant, scenario, schedule, out.mode, o, done, o.runs, serialized));
  VariantRepro& v = out.variants.back();
  for (std::size_t k = 0; k < v.runs.size(); ++k) {
    v.first_bad.push_back(first_bad(v.runs[k], serialized ? &v.serialized[k] : nullptr));
  }
  return out;
}

}  // namespace hpz::replay
