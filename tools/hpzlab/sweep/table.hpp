// The sweep's results: one tidy table, a row per (point, variant, run), kept in DIR as CSV
// (results.csv) and JSON Lines (results.jsonl). Rows are appended as simulations finish, each
// simulation's rows with one write() on an O_APPEND descriptor, so that an interrupted sweep
// keeps whole rows; the finished sweep rewrites both files sorted by (point, variant, run).
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tools/hpzlab/sweep/plan.hpp"

namespace hpz::sweep {

/** One row; its keys in column order (nlohmann::ordered_json keeps insertion order). */
using Row = nlohmann::ordered_json;

/** (point, variant index): what one simulation (one child process) produces rows for. */
using SimKey = std::pair<std::size_t, std::size_t>;

/** The table's columns: point, variant, run, the varied keys, then the results. */
std::vector<std::string> columns(const Plan& plan);

/** The rows of one finished simulation from the JSON `hpzlab sim --json` wrote to `file`: one
 *  per run, status "ok" or "hung". Every field is read through Field (issue 34): a wrong type,
 *  a missing key, a null count or a number of runs other than the plan's is
 *  InputError(file, KEY, "expected ..."). */
std::vector<Row> rows_from_sim(const Plan& plan, SimKey key, const nlohmann::json& sim,
                               const std::string& file = "hpzlab sim --json");

/** The rows of a simulation that failed (no JSON): one per run, status "failed", `error` set. */
std::vector<Row> failed_rows(const Plan& plan, SimKey key, const std::string& error);

/** Fills the --repro columns of one point's rows from the JSON `hpzlab repro --json` wrote for
 *  it (to `file`): first_bad_step and final_loss of the row's variant and run (repro_error "" ),
 *  or, with `error` not empty (repro failed or was not run), empty columns and repro_error =
 *  error. A field of the wrong type is InputError(file, KEY, ...). */
void fill_repro(std::vector<Row>& rows, const nlohmann::json& repro, const std::string& error,
                const std::string& file = "hpzlab repro --json");

/** A row as one CSV line (with its newline), fields in columns(plan) order, quoted when needed. */
std::string csv_line(const std::vector<std::string>& columns, const Row& row);

/** The CSV header line (with its newline). */
std::string csv_header(const std::vector<std::string>& columns);

/** The results files in DIR and the rows they hold. */
class Table {
 public:
  Table(const Plan& plan, std::string dir);

  /** Reads the rows already in DIR (for --resume): a simulation counts as done when all its
   *  runs are in both files; the files are then rewritten to hold exactly the done ones. */
  std::set<SimKey> resume();

  /** Starts empty files (header only). */
  void start();

  /** Appends one simulation's rows to both files, one write() each. */
  void append(const std::vector<Row>& rows);

  /** Rewrites both files from results.jsonl, sorted by (point, variant, run), one row per
   *  (point, variant, run) (the last written wins). Returns the rows. */
  std::vector<Row> finish();

  std::string csv_path() const { return dir_ + "/results.csv"; }
  std::string jsonl_path() const { return dir_ + "/results.jsonl"; }

 private:
  void rewrite(std::vector<Row> rows) const;

  const Plan& plan_;
  std::string dir_;
  std::vector<std::string> columns_;
};

/** A results.jsonl row of this plan, checked column by column (issue 34: `"status": 5` was an
 *  internal error): point, variant and run of the plan, the varied keys at the point's values,
 *  every result of its type, no other key. Returned in column order. Throws
 *  InputError(where, KEY, "expected ..."), `where` being e.g. "DIR/results.jsonl:3". */
Row checked_row(const Plan& plan, const nlohmann::json& row, const std::string& where);

/** The rows of results.jsonl's text (`path` for messages): a line that does not parse (cut by a
 *  kill) is skipped, every other one goes through checked_row(). */
std::vector<Row> rows_from_jsonl(const Plan& plan, const std::string& text,
                                 const std::string& path);

/** rows_from_jsonl() of the file at `path` (none when there is none), read through the guarded
 *  reader (a regular file of at most kMaxInputBytes). */
std::vector<Row> read_rows(const Plan& plan, const std::string& path);

}  // namespace hpz::sweep
