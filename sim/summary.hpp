// Human-readable views of a schedule: a summary of all ranks and one rank's op list.
#pragma once

#include <string>

#include "sim/scenario.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz {

/** A few lines: cluster, model, units, groups, op counts by kind and stream, hpZ copies, and a
 *  recorded schedule's source, one key a line. */
std::string schedule_summary(const Scenario& scenario, const Schedule& schedule);

/** One line per op of rank r: index, stream, kind, purpose, labels, buffer ranges. */
std::string format_rank(const Schedule& schedule, Rank r);

}  // namespace hpz
