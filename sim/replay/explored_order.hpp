// The file an explored order is kept in (`hpzlab explore --order-out`, `hpzlab repro --order`):
// JSON with "format": "hpzlab explored order 1", the scenario and its --set overrides, the
// variant, and "ranks": per rank, per op, [issue, start, end] (null for an op that never ran).
#pragma once

#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"

namespace hpz::replay {

/** The file's text for an order of `schedule` (built from `scenario` with `sets`). */
std::string explored_order_text(const Schedule& schedule, const std::string& scenario,
                                const std::vector<std::string>& sets, const Timeline& order);

/** Reads an order file for `schedule`; throws InputError naming `file` and the key when it is
 *  not one, or was written for another schedule (variant, ranks or op counts differ). */
Timeline read_explored_order(const std::string& text, const std::string& file,
                             const Schedule& schedule);

}  // namespace hpz::replay
