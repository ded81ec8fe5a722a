// `hpzlab sweep`'s engine: prepares DIR, runs the simulations that are not done yet as child
// processes, appends their rows as they finish and writes the final, sorted table.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "tools/hpzlab/sweep/plan.hpp"
#include "tools/hpzlab/sweep/table.hpp"

namespace hpz::sweep {

/** Where and how to run a plan. */
struct RunSettings {
  std::string out;      ///< DIR: results.csv, results.jsonl, sweep.json
  bool resume = false;  ///< run only the simulations DIR does not hold yet
  int jobs = 1;         ///< child processes at once
  std::string program;  ///< the hpzlab to run children with (own_executable())
};

/** Progress of a running sweep, for a progress line. */
struct Progress {
  std::size_t done = 0;    ///< simulations finished in this invocation
  std::size_t failed = 0;  ///< of which failed
  std::size_t total = 0;   ///< simulations this invocation runs
  double elapsed_s = 0;    ///< wall time since the first started
  bool repro = false;      ///< done, failed and total count --repro's replays (one a point) too
};

/** What a finished sweep holds. */
struct Summary {
  std::size_t ran = 0;                       ///< simulations run by this invocation
  std::size_t skipped = 0;                   ///< simulations found done in DIR (--resume)
  std::size_t replays = 0;                   ///< --repro: `hpzlab repro` runs (one a point)
  std::size_t replays_failed = 0;            ///< of which failed (their rows' repro_error)
  std::size_t rows = 0;                      ///< rows in the final table
  std::size_t ok = 0, hung = 0, failed = 0;  ///< rows by status
  double elapsed_s = 0;                      ///< wall time of this invocation's simulations
  std::vector<Row> table;                    ///< the final rows, sorted
};

/** Checks DIR: a new or empty directory, or with `resume` one that a sweep of this same plan
 *  wrote (its sweep.json). Throws InputError otherwise; creates DIR and writes sweep.json. */
void prepare_dir(const Plan& plan, const RunSettings& settings);

/** Runs the plan (after validate() and prepare_dir()); calls progress after each simulation. */
Summary run(const Plan& plan, const RunSettings& settings,
            const std::function<void(const Progress&)>& progress);

}  // namespace hpz::sweep
