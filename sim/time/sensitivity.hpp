// `hpzlab sim --sensitivity`: which inputs of the cost model decide whether a race bites. The
// schedule and the checker's races stay fixed; each input is scaled by factors from 1/4 to 4
// (within what the scenario allows), one at a time, the timeline simulated again with the same
// seed, and the smallest margin of any race read off it (second start minus first end,
// races.hpp: negative, it bit). Where the sign changes between two factors, the factor is
// bisected to where it changes: the change of cluster or config under which the race would start
// (or stop) biting.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/platform.hpp"
#include "sim/time/simulate.hpp"

namespace hpz::time {

/** Re-simulations sensitivity() runs at once, each a child process simulating every rank. */
inline constexpr int kSensitivityRunsAtOnce = 2;

/** One input the sensitivity scales. */
struct SensitivityInput {
  std::string key;                              ///< scenario key, e.g. "cluster.nic_gbps"
  std::string what;                             ///< what it stands for, in a few words
  std::function<double&(TimingInputs&)> field;  ///< the key's field in the engine's inputs
  double max = 0;                               ///< largest allowed value (0: none)
};

/** The inputs: compute and memory efficiency, launch overhead (host speed), kernel latency, the
 *  NIC's and NVLink's bandwidth and latency, SimGrid's bandwidth and latency factors. */
const std::vector<SensitivityInput>& sensitivity_inputs();

/** The smallest margin at one value of an input. */
struct SensitivitySample {
  double factor = 1;
  double value = 0;
  std::optional<double> min_margin_s;  ///< none: no instance of any race ran in both ops
};

/** Where the race starts or stops biting along one input. */
struct SensitivityFlip {
  double factor = 1;  ///< the first factor (from 1 outwards) on the other side of the flip
  double value = 0;
  bool bites = false;  ///< whether it bites beyond the flip
};

struct SensitivityRow {
  std::string key;
  std::string what;
  double value = 0;                        ///< the scenario's
  std::vector<SensitivitySample> samples;  ///< by factor, the scenario's value (1) included
  std::vector<SensitivityFlip> flips;      ///< nearest to the scenario's value first
};

struct SensitivityResult {
  std::optional<double> min_margin_s;  ///< at the scenario's values
  std::string closest_race;            ///< the race group with the smallest margin there
  std::vector<SensitivityRow> rows;
  int runs = 0;           ///< timelines simulated
  bool by_class = false;  ///< they simulated one node of each kind (by_class.hpp), not every rank
};

/** The factors every input is scaled by (1 is the scenario's own value). */
const std::vector<double>& sensitivity_factors();

/** Runs the sensitivity of `schedule` on the platform `in` from `simulated`, its
 *  simulate() result: its races and race instances, and its first run's timeline for the
 *  scenario's own values (call only with at least one race; by class, the simulated ranks' or
 *  every rank's). `progress(done, total)` after each further timeline. The re-simulations fold
 *  as `simulated` did where it folded exactly; otherwise they simulate every rank, and
 *  `before_every_rank` (may throw) is called first. */
SensitivityResult sensitivity(const TimingInputs& in, const Schedule& schedule,
                              const SimResult& simulated,
                              const std::function<void(int, int)>& progress = {},
                              const std::function<void()>& before_every_rank = {});

/** One sentence for a user: how close the closest race came and what would flip it. */
std::string sensitivity_sentence(const SensitivityResult& r);

/** The text table `hpzlab sim --sensitivity` prints. */
std::string sensitivity_table(const SensitivityResult& r);

/** Whether the simulated schedule has a race (a data race the checker found; not a stale read or
 *  a mismatched collective): what the sensitivity needs. */
bool has_race(const SimResult& r);

/** The sensitivity as `sim --json` and `check --json` write it. */
nlohmann::json sensitivity_json(const SensitivityResult& r);

}  // namespace hpz::time
