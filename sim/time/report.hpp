// Outputs of `hpzlab sim`, one file per format behind one interface: the console summary, the
// JSON results (--json) and the Chrome trace-event file (--trace) that Perfetto opens.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/time/simulate.hpp"

namespace hpz::time {

/** Renders a simulation result. */
class Reporter {
 public:
  virtual ~Reporter() = default;
  /** The whole output as text; `schedule` is the one that was simulated. */
  virtual std::string render(const Schedule& schedule, const SimResult& result) const = 0;
};

/** The terminal summary: step time, tokens/s/node, exposed communication, host stall, races
 *  manifested, the busiest links, the network model and its factors. */
class ConsoleReporter : public Reporter {
 public:
  std::string render(const Schedule& schedule, const SimResult& result) const override;
};

/** A duration for a person: "1.234 s", "2.170 ms", "32.6 us", signed when negative. */
std::string duration_text(double seconds);

/** ConsoleReporter's race lines alone: each race group with the runs it manifested in, its margin
 *  (how far it bit or missed) and its first manifestation; "" without races. `hpzlab real`
 *  prints them under its own table, from measured times. */
std::string render_races(const SimResult& result);

/** Machine-readable results: step_time_s, tokens_per_s_per_node, races_manifested, per-link
 *  bytes and utilisation, the manifested races with timestamps and overlap. No wall-clock
 *  values, so the same scenario and seed give the same bytes. */
class JsonReporter : public Reporter {
 public:
  /** With `op_times`, the JSON also has `op_times` (per rank, per op in IR order:
   *  [issue_s, start_s, end_s], null for an op that never ran) and `op_labels` (per rank, per
   *  op: "kind/purpose/unit"), which `hpzlab compare` aligns. */
  explicit JsonReporter(bool op_times = false, std::vector<std::string> notes = {})
      : op_times_(op_times), notes_(std::move(notes)) {}
  std::string render(const Schedule& schedule, const SimResult& result) const override;

 private:
  bool op_times_;
  std::vector<std::string> notes_;  ///< what loading the scenario noted, as "notes"
};

/** The JSON object JsonReporter writes, for callers that add keys of their own (`hpzlab real`
 *  sets `source` to "real" and adds its corruption counts). */
nlohmann::json to_json(const Schedule& schedule, const SimResult& result, bool op_times);

/** Chrome trace-event JSON of the first run: one process per rank, one thread (track) per stream
 *  plus "host", flow arrows for event waits and collective rendezvous, manifested races marked. */
/** Which ops a trace shows (issue 35: a trace of Llama-2-7B's 16 ranks was 224 MB). */
struct TraceFilter {
  std::vector<Rank> ranks;  ///< empty: every rank
  std::vector<int> steps;   ///< empty: every step (an op with step -1, at init, is in none)
};

class TraceReporter : public Reporter {
 public:
  TraceReporter() = default;
  explicit TraceReporter(TraceFilter filter) : filter_(std::move(filter)) {}
  std::string render(const Schedule& schedule, const SimResult& result) const override;

 private:
  TraceFilter filter_;
};

}  // namespace hpz::time
