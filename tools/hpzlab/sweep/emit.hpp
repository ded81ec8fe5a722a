// Sweeps beyond one machine: `--emit DIR` writes one self-contained shell command per
// simulation (DIR/commands.txt, for GNU parallel or a Slurm job array), `--collect DIR` turns
// what they wrote into the same table a local sweep writes. No scheduler of our own.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tools/hpzlab/sweep/plan.hpp"
#include "tools/hpzlab/sweep/table.hpp"

namespace hpz::sweep {

/** Writes DIR/sweep.json, DIR/commands.txt (a line per (point, variant), in point order; with
 *  plan.repro also a `hpzlab repro` line after each replayable point's) and the empty DIR/out/
 *  the commands write to. The scenario is copied to DIR/scenario.toml when
 *  it loads from there (it names no file by a relative path), else the commands use its absolute
 *  path. Commands run `${HPZLAB:-PROGRAM}` with absolute paths, so they run from any directory
 *  (and on any host that sees DIR and PROGRAM at the same paths). Throws InputError when DIR is
 *  not new or empty. Returns the number of commands. */
std::size_t emit(const Plan& plan, const std::string& dir, const std::string& program);

/** The plan a sweep wrote to DIR/sweep.json. Throws InputError if there is none. */
Plan read_plan(const std::string& dir);

/** What --collect found. */
struct Collected {
  std::size_t simulations = 0;      ///< simulation commands emitted
  std::size_t missing = 0;          ///< of which neither JSON nor standard error is in DIR/out
  std::size_t replays = 0;          ///< --repro: repro commands emitted (one a replayable point)
  std::size_t replays_missing = 0;  ///< of which neither JSON nor standard error is there
  std::size_t replays_failed = 0;   ///< of which only the standard error is there
  std::vector<Row> table;           ///< the rows, sorted, as written to DIR/results.*
};

/** Reads DIR/out/pP-vV.json (or, where a command failed, its .err) for every simulation of the
 *  plan in DIR, with --repro DIR/out/pP-repro.json (or .err) for each point, and writes
 *  DIR/results.csv and DIR/results.jsonl. A point whose repro has not run yet gets its rows with
 *  repro_error "hpzlab repro has not run yet". */
Collected collect(const std::string& dir);

}  // namespace hpz::sweep
