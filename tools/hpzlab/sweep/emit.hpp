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

/** Writes DIR/sweep.json, DIR/commands.txt (a line per (point, variant), in point order) and
 *  the empty DIR/out/ the commands write to. The scenario is copied to DIR/scenario.toml when
 *  it loads from there (it names no file by a relative path), else the commands use its absolute
 *  path. Commands run `${HPZLAB:-PROGRAM}` with absolute paths, so they run from any directory
 *  (and on any host that sees DIR and PROGRAM at the same paths). Throws InputError when DIR is
 *  not new or empty. Returns the number of commands. */
std::size_t emit(const Plan& plan, const std::string& dir, const std::string& program);

/** The plan a sweep wrote to DIR/sweep.json. Throws InputError if there is none. */
Plan read_plan(const std::string& dir);

/** What --collect found. */
struct Collected {
  std::size_t simulations = 0;  ///< commands emitted
  std::size_t missing = 0;      ///< of which neither JSON nor standard error is in DIR/out
  std::vector<Row> table;       ///< the rows, sorted, as written to DIR/results.*
};

/** Reads DIR/out/pP-vV.json (or, where a command failed, its .err) for every simulation of the
 *  plan in DIR and writes DIR/results.csv and DIR/results.jsonl. */
Collected collect(const std::string& dir);

}  // namespace hpz::sweep
