// Interleaving exploration (issue 19, `hpzlab explore`): the checker proves from happens-before
// whether two accesses can race; the timing engine picks one order by timing. This runs a
// schedule's ops one at a time in other orders that happens-before allows, replays the data along
// each, and compares the final weights with the serialized reference's, bit for bit.
//
// An order is built by a scheduler over the IR's semantics (schedule.hpp): every rank's host
// issues as far ahead as it can (it stops only at a host sync whose stream, device or event has
// not finished: issuing earlier never removes an order, since issuing touches no data); a
// stream runs its issued ops first in, first out; a stream wait runs once its event's record has
// run; the k-th collective of a group runs on every member at once, when each has it at the head
// of its stream. Each step runs one op (or one collective on all its members) and is a time slot
// of its own in the timeline the replay follows, so reads and writes never overlap in time.
//
// Two phases:
//  - targeted: for each race pair the checker reports, the two orders of the pair (the first op
//    held back until the second has run, then the reverse), every other choice as the timing
//    engine's run had it (the enabled op that started first there runs first);
//  - random: PCT (Burckhardt, Kothari, Musuvathi, Nagarakatte: "A Randomized Scheduler with
//    Probabilistic Guarantees of Finding Bugs", ASPLOS 2010): every stream of every rank gets a
//    random priority, the highest-priority enabled stream runs next, and at d - 1 random steps the
//    stream that just ran drops below all others.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/replay/replay.hpp"

namespace hpz::replay {

/** Two ops of one rank that the checker found unordered (its race pair). */
struct RacePair {
  Rank rank = 0;
  std::uint32_t first = 0;   ///< earlier in issue order
  std::uint32_t second = 0;  ///< later in issue order
};

/** One stream of one rank: what the scheduler chooses among. */
struct StreamRef {
  Rank rank = 0;
  StreamId stream = 0;
};

/** Picks which of the enabled streams runs its head op next (an index into `enabled`); `heads`
 *  are those ops, `step` counts the steps so far. */
using OrderChooser =
    std::function<std::size_t(const std::vector<StreamRef>& enabled,
                              const std::vector<std::uint32_t>& heads, std::uint64_t step)>;

/** Keeps `held` (an op of `rank`) from running until `until` (same rank) has run. */
struct HoldBack {
  Rank rank = 0;
  std::uint32_t held = 0;
  std::uint32_t until = 0;
};

/** An order as a timeline: step k runs in [2k, 2k + 1); ops that never ran (a hang, or a
 *  hold-back happens-before does not allow) keep NaN times. `held_back_ran` is false when the
 *  hold-back could not be honoured (nothing else could run), which means the pair is ordered. */
struct ExploredOrder {
  Timeline timeline;
  bool complete = true;       ///< every op ran
  bool held_back_ran = true;  ///< the hold-back, if any, was honoured
};

/** Runs the schedule's ops in the order `choose` picks, within happens-before. */
ExploredOrder run_order(const Schedule& schedule, const OrderChooser& choose,
                        const std::optional<HoldBack>& hold = std::nullopt);

/** PCT's chooser for one order: random stream priorities from `seed`, and `depth` - 1 change
 *  points at random steps among the first `steps`. */
OrderChooser pct_chooser(const Schedule& schedule, std::uint64_t seed, int depth,
                         std::uint64_t steps);

/** A chooser that follows a timing engine's run: the enabled op that started first there. */
OrderChooser timing_chooser(const Timeline& timing);

/** What `hpzlab explore` takes. */
struct ExploreOptions {
  int budget = 1000;       ///< orders to explore in all (targeted first)
  std::uint64_t seed = 1;  ///< for the random phase
  int depth = 3;           ///< PCT's d: d - 1 priority change points per order
  Mode mode = Mode::kTaint;
  /** Called after each order with (orders done, budget). */
  std::function<void(int, int)> progress;
};

/** An order whose final weights differ from the reference's. */
struct Counterexample {
  std::string phase;             ///< "targeted" or "random"
  std::optional<RacePair> pair;  ///< targeted: the pair
  bool second_first = false;     ///< targeted: the second op of the pair ran first
  int order = 0;                 ///< which explored order (0-based)
  Timeline timeline;             ///< the order, for `hpzlab repro --order`
  ReplayResult result;           ///< what the replay gave
  int first_bad_step = -1;       ///< the first step that differs from the reference
};

/** What an exploration found. */
struct ExploreResult {
  ReplayResult reference;          ///< along the serialized order
  int targeted = 0;                ///< orders of the targeted phase explored
  int random = 0;                  ///< orders of the random phase explored
  bool reference_complete = true;  ///< every op ran in the serialized order (no hang)
  /** The first step whose reference is itself bad (a non-finite loss, or bad weight elements in
   *  the taint replay: an uninitialized or stale read the checker reports), -1 when none. Where
   *  the reference is bad, a race can change nothing more that the comparison would see. */
  int reference_bad_step = -1;
  int unreached = 0;      ///< targeted orders in which the pair never ran (the run hangs before it)
  int incomplete = 0;     ///< orders that hung (a collective some member never reaches)
  int unreorderable = 0;  ///< targeted orders happens-before did not allow
  std::optional<Counterexample> counterexample;  ///< the first found (the exploration stops)
};

/** Explores `schedule` (built from `scenario`): the targeted phase over `pairs`, then random
 *  orders up to the budget; stops at the first order whose weights differ from the reference. */
ExploreResult explore(const ReplayInputs& in, const Schedule& schedule,
                      const std::vector<RacePair>& pairs, const Timeline& timing,
                      const ExploreOptions& options);

/** The first step in which `a` differs from `reference` (same_result on that step), -1 when
 *  none does. */
int first_difference(const ReplayResult& a, const ReplayResult& reference);

/** True when two replays agree bit for bit: per step the loss and weights hash (numeric), or
 *  the loss's health, bad elements, ranks and units (taint). */
bool same_result(const ReplayResult& a, const ReplayResult& b);

}  // namespace hpz::replay
