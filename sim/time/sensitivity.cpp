#include "sim/time/sensitivity.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>

#include "sim/check/finding_log.hpp"
#include "sim/time/by_class.hpp"
#include "sim/time/engine.hpp"
#include "sim/time/report.hpp"
#include "sim/time/simulate.hpp"

namespace hpz::time {
namespace {

constexpr int kParallel = kSensitivityRunsAtOnce;  // child processes at once (two cores)
constexpr int kBisections = 5;  // halvings of a flip's bracket, in log factor: to 2^(1/32)-ish

struct Margin {
  std::optional<double> min;
  std::uint32_t group = 0;  ///< the race group (SimResult::races) of the smallest
};

/** The smallest margin of any of `simulated`'s race instances in the timeline `t` (with
 *  `quotient`, perhaps a run by class's). */
Margin margin_of(const SimResult& simulated, const Timeline& t, const NodeQuotient* quotient) {
  Margin m;
  for (const RaceInstance& race : simulated.race_instances) {
    const Manifestation x = manifestation(t, race, quotient);
    if (x.first_end_s < 0 || x.second_start_s < 0) continue;  // one of them never ran
    const double margin = x.second_start_s - x.first_end_s;
    if (m.min && margin >= *m.min) continue;
    m.min = margin;
    m.group = race.group;
  }
  return m;
}

/** Margins of the variants, up to kParallel engine runs at once, each with its seed; with
 *  `quotient`, each by class. */
std::vector<Margin> margins(const std::vector<TimingInputs>& variants, const Schedule& schedule,
                            const SimResult& simulated, const NodeQuotient* quotient, int& done,
                            int total, const std::function<void(int, int)>& progress) {
  std::vector<Margin> out(variants.size());
  std::deque<std::pair<std::size_t, ChildRun>> running;
  std::size_t next = 0;
  while (next < variants.size() || !running.empty()) {
    while (next < variants.size() && static_cast<int>(running.size()) < kParallel) {
      running.emplace_back(next, ChildRun(variants[next], schedule, variants[next].seed, quotient));
      ++next;
    }
    auto [index, child] = std::move(running.front());
    running.pop_front();
    out[index] = margin_of(simulated, child.wait().timeline, quotient);
    if (progress) progress(++done, total);
  }
  return out;
}

bool bites(const std::optional<double>& margin) {
  return margin && *margin < 0;
}

std::string seconds(double s) {
  return duration_text(s);
}

std::string factor_text(double f) {
  if (f >= 1) return fmt::format("x{:.3g}", f);
  return fmt::format("x1/{:.3g}", 1 / f);
}

}  // namespace

const std::vector<SensitivityInput>& sensitivity_inputs() {
  static const std::vector<SensitivityInput> inputs = {
      {"sim.compute_efficiency", "share of peak FLOP/s kernels reach",
       [](TimingInputs& s) -> double& { return s.sim.compute_efficiency; }, 1},
      {"sim.memory_efficiency", "share of HBM bandwidth copies reach",
       [](TimingInputs& s) -> double& { return s.sim.memory_efficiency; }, 1},
      {"sim.launch_overhead_us", "host time to issue an op (host speed)",
       [](TimingInputs& s) -> double& { return s.sim.launch_overhead_us; }, 0},
      {"sim.kernel_latency_us", "shortest kernel or copy",
       [](TimingInputs& s) -> double& { return s.sim.kernel_latency_us; }, 0},
      {"cluster.nic_gbps", "NIC bandwidth",
       [](TimingInputs& s) -> double& { return s.cluster.nic_gbps; }, 0},
      {"cluster.internode_latency_us", "latency between nodes",
       [](TimingInputs& s) -> double& { return s.cluster.internode_latency_us; }, 0},
      {"cluster.nvlink_gbytes_per_s", "NVLink bandwidth",
       [](TimingInputs& s) -> double& { return s.cluster.nvlink_gbytes_per_s; }, 0},
      {"cluster.nvlink_latency_us", "NVLink latency",
       [](TimingInputs& s) -> double& { return s.cluster.nvlink_latency_us; }, 0},
      {"sim.bandwidth_factor", "share of link bandwidth NCCL reaches (SimGrid)",
       [](TimingInputs& s) -> double& { return s.sim.bandwidth_factor; }, 0},
      {"sim.latency_factor", "NCCL latency factor (SimGrid)",
       [](TimingInputs& s) -> double& { return s.sim.latency_factor; }, 0},
  };
  return inputs;
}

const std::vector<double>& sensitivity_factors() {
  static const std::vector<double> factors = {0.25, 0.5, 0.8, 1, 1.25, 2, 4};
  return factors;
}

namespace {

/** A sign change between two factors of one row, bisected towards the flip. */
struct Bracket {
  std::size_t row;
  double inner, outer;  // factors: inner on the scenario's side, outer beyond the flip
  bool outer_bites;
};

/** Adds each row's flips to `out` (its rows sampled at every factor): each sign change between
 *  neighbouring factors, bisected in log factor. */
void add_flips(const TimingInputs& in, const Schedule& schedule, const SimResult& simulated,
               const NodeQuotient* quotient, int& done, int total,
               const std::function<void(int, int)>& progress, SensitivityResult& out) {
  const auto& inputs = sensitivity_inputs();
  // Each row's brackets nearest to the scenario's value first; all rows' brackets of one
  // halving run together.
  std::vector<Bracket> brackets;
  for (std::size_t i = 0; i < out.rows.size(); ++i) {
    const auto& smp = out.rows[i].samples;
    const auto one = std::find_if(smp.begin(), smp.end(),
                                  [](const SensitivitySample& x) { return x.factor == 1; });
    const auto at = static_cast<std::size_t>(one - smp.begin());
    for (std::size_t k = at; k + 1 < smp.size(); ++k) {  // upwards: the first change only
      if (bites(smp[k].min_margin_s) != bites(smp[k + 1].min_margin_s)) {
        brackets.push_back({i, smp[k].factor, smp[k + 1].factor, bites(smp[k + 1].min_margin_s)});
        break;
      }
    }
    for (std::size_t k = at; k > 0; --k) {  // downwards
      if (bites(smp[k].min_margin_s) != bites(smp[k - 1].min_margin_s)) {
        brackets.push_back({i, smp[k].factor, smp[k - 1].factor, bites(smp[k - 1].min_margin_s)});
        break;
      }
    }
  }
  for (int h = 0; h < kBisections && !brackets.empty(); ++h) {
    std::vector<TimingInputs> mids;
    for (const Bracket& b : brackets) {
      TimingInputs s = in;
      inputs[b.row].field(s) = out.rows[b.row].value * std::sqrt(b.inner * b.outer);
      mids.push_back(std::move(s));
    }
    const std::vector<Margin> mm =
        margins(mids, schedule, simulated, quotient, done, total, progress);
    for (std::size_t k = 0; k < brackets.size(); ++k) {
      Bracket& b = brackets[k];
      const double mid = std::sqrt(b.inner * b.outer);
      (bites(mm[k].min) == b.outer_bites ? b.outer : b.inner) = mid;
    }
  }
  for (const Bracket& b : brackets) {
    SensitivityRow& row = out.rows[b.row];
    row.flips.push_back({b.outer, row.value * b.outer, b.outer_bites});
  }
  for (SensitivityRow& row : out.rows) {
    std::sort(row.flips.begin(), row.flips.end(),
              [](const SensitivityFlip& a, const SensitivityFlip& b) {
                return std::abs(std::log(a.factor)) < std::abs(std::log(b.factor));
              });
  }
}

}  // namespace

SensitivityResult sensitivity(const TimingInputs& in, const Schedule& schedule,
                              const SimResult& simulated,
                              const std::function<void(int, int)>& progress,
                              const std::function<void()>& before_every_rank) {
  const auto& inputs = sensitivity_inputs();
  const auto& factors = sensitivity_factors();
  SensitivityResult out;
  // By class where the first run was, exactly (not forced with jitter): the inputs varied are
  // costs, which do not change the fold (the cluster's shape, the jitter and the collective
  // model), so every re-simulation folds as the first one did.
  const NodeQuotient* folded =
      simulated.quotient && simulated.quotient->exact ? &*simulated.quotient : nullptr;
  if (folded == nullptr && before_every_rank) before_every_rank();
  // The scenario's own values: the simulated run (seed run.seed) already timed them.
  const Margin own = margin_of(simulated, simulated.timeline, folded);
  std::vector<double> values;  // each input's value in the scenario
  TimingInputs probe = in;     // field() gives a reference: read from a copy
  for (const SensitivityInput& input : inputs) values.push_back(input.field(probe));
  // The grid: every input at every factor its bound allows, but 1.
  std::vector<TimingInputs> grid;
  std::vector<std::pair<std::size_t, double>> where;  // grid[k]: (input, factor)
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double value = values[i];
    bool bound_done = false;
    for (std::size_t f = 0; f < factors.size(); ++f) {
      if (factors[f] == 1 || value == 0) continue;
      double factor = factors[f];
      if (inputs[i].max > 0 && value * factor > inputs[i].max) {
        // Past the bound (an efficiency of 1): the bound itself, once, if above the value.
        if (bound_done || value >= inputs[i].max) continue;
        bound_done = true;
        factor = inputs[i].max / value;
      }
      TimingInputs s = in;
      inputs[i].field(s) = value * factor;
      grid.push_back(std::move(s));
      where.emplace_back(i, factor);
    }
  }
  // The bisections are counted as if every input had one flip on each side (an estimate).
  int done = 0;
  const int total = static_cast<int>(grid.size()) + static_cast<int>(inputs.size()) * kBisections;
  const std::vector<Margin> m = margins(grid, schedule, simulated, folded, done, total, progress);
  out.min_margin_s = own.min;
  if (own.min) {
    const check::Finding& race = simulated.races[own.group].group.example;
    out.closest_race =
        check::describe_short(race.first) + " vs " + check::describe_short(race.second);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    SensitivityRow row;
    row.key = inputs[i].key;
    row.what = inputs[i].what;
    row.value = values[i];
    row.samples.push_back({1, row.value, own.min});
    for (std::size_t k = 0; k < grid.size(); ++k) {
      if (where[k].first != i) continue;
      const double f = where[k].second;
      row.samples.push_back({f, row.value * f, m[k].min});
    }
    std::sort(
        row.samples.begin(), row.samples.end(),
        [](const SensitivitySample& a, const SensitivitySample& b) { return a.factor < b.factor; });
    out.rows.push_back(std::move(row));
  }
  add_flips(in, schedule, simulated, folded, done, total, progress, out);
  out.by_class = folded != nullptr;
  out.runs = done;
  return out;
}

std::string sensitivity_sentence(const SensitivityResult& r) {
  if (!r.min_margin_s) return "No instance of a race ran both its ops in this timeline.";
  const bool bit = *r.min_margin_s < 0;
  // The flip nearest to the scenario's values, over every input.
  const SensitivityRow* best_row = nullptr;
  const SensitivityFlip* best = nullptr;
  for (const SensitivityRow& row : r.rows) {
    for (const SensitivityFlip& f : row.flips) {
      if (best == nullptr || std::abs(std::log(f.factor)) < std::abs(std::log(best->factor))) {
        best = &f;
        best_row = &row;
      }
    }
  }
  std::string s = fmt::format("The closest race ({}) {} by {} in this timeline", r.closest_race,
                              bit ? "bites" : "misses", seconds(std::abs(*r.min_margin_s)));
  if (best == nullptr) {
    return s + fmt::format("; no single input scaled from x1/4 to x4 makes it {}.",
                           bit ? "stop biting" : "bite");
  }
  return s + fmt::format("; it would {} with {} at {} ({:.4g}, {} the scenario's {:.4g}).",
                         best->bites ? "bite" : "stop biting", best_row->key,
                         factor_text(best->factor), best->value, best_row->what, best_row->value);
}

std::string sensitivity_table(const SensitivityResult& r) {
  std::string out = fmt::format(
      "sensitivity: the smallest margin of any race (second op's start minus first op's end; "
      "negative: it bites), each input scaled alone, same seed ({} timelines{})\n",
      r.runs, r.by_class ? ", each one node per kind of node" : "");
  out += fmt::format("  {:<28} {:>10}", "input", "value");
  for (double f : sensitivity_factors()) out += fmt::format(" {:>10}", factor_text(f));
  out += "  flips at\n";
  for (const SensitivityRow& row : r.rows) {
    out += fmt::format("  {:<28} {:>10.4g}", row.key, row.value);
    for (double f : sensitivity_factors()) {
      const auto s = std::find_if(row.samples.begin(), row.samples.end(),
                                  [f](const SensitivitySample& x) { return x.factor == f; });
      out += fmt::format(" {:>10}", s == row.samples.end() ? "-"
                                    : !s->min_margin_s     ? "none"
                                                           : seconds(*s->min_margin_s));
    }
    for (const SensitivitySample& s : row.samples) {
      const auto& grid = sensitivity_factors();
      if (std::find(grid.begin(), grid.end(), s.factor) != grid.end()) continue;
      out += fmt::format("  (at its bound {:.4g}, {}: {})", s.value, factor_text(s.factor),
                         s.min_margin_s ? seconds(*s.min_margin_s) : "none");
    }
    std::string flips;
    for (const SensitivityFlip& f : row.flips) {
      flips += fmt::format("{}{} ({:.4g}): {}", flips.empty() ? "  " : "; ", factor_text(f.factor),
                           f.value, f.bites ? "bites" : "stops biting");
    }
    out += (flips.empty() ? "  -" : flips) + "\n";
  }
  out += "  " + sensitivity_sentence(r) + "\n";
  return out;
}

nlohmann::json sensitivity_json(const SensitivityResult& r) {
  const auto margin = [](const std::optional<double>& m) {
    return m ? nlohmann::json(*m) : nlohmann::json(nullptr);
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const SensitivityRow& row : r.rows) {
    nlohmann::json samples = nlohmann::json::array(), flips = nlohmann::json::array();
    for (const auto& s : row.samples) {
      samples.push_back(
          {{"factor", s.factor}, {"value", s.value}, {"min_margin_s", margin(s.min_margin_s)}});
    }
    for (const auto& f : row.flips) {
      flips.push_back({{"factor", f.factor}, {"value", f.value}, {"bites", f.bites}});
    }
    rows.push_back({{"key", row.key},
                    {"what", row.what},
                    {"value", row.value},
                    {"samples", samples},
                    {"flips", flips}});
  }
  return {{"min_margin_s", margin(r.min_margin_s)},
          {"closest_race", r.closest_race},
          {"timelines", r.runs},
          {"by_class", r.by_class},
          {"inputs", rows},
          {"sentence", sensitivity_sentence(r)}};
}

bool has_race(const SimResult& r) {
  return std::any_of(r.races.begin(), r.races.end(), [](const RaceReport& race) {
    return race.group.example.kind == check::FindingKind::kRace;
  });
}

}  // namespace hpz::time
