// The schedule IR as JSON: the same content as the C++ structures, lossless both ways, so that
// tools outside hpzlab (and hpzlab's own engines, from a file) can read a schedule.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "sim/ir/schedule.hpp"

namespace hpz {

/** The JSON form of a schedule: {"format": "hpzlab-schedule", "version": 1, ...}. An op's
 *  accesses are [buffer, "r"|"w", offset, bytes], or, strided, [buffer, "r"|"w", offset, bytes,
 *  count, stride] (Access: count 2 to 65535, 0 < bytes <= stride < 2^32). */
nlohmann::json schedule_to_json(const Schedule& schedule, bool compact = false);

/** Reads the JSON form back; throws InputError naming `where` and the offending key. Besides
 *  ranks written in full it reads the short form of the others,
 *  {"rank": r, "like": R, "groups": [[g, g2], ...], "accesses": [[op, [access, ...]], ...]}:
 *  rank R's schedule (written in full) with every op on group g moved to g2 and the listed
 *  ops' accesses replaced ("accesses" optional). A recorder writes its unrecorded ranks so;
 *  schedule_to_json(s, true) writes so every rank that shares its op list and buffer table with
 *  a rank written before it (compact: a DeepSpeed builder's 16-rank schedule is ~1/8 the size),
 *  schedule_to_json(s) every rank in full. */
Schedule schedule_from_json(const nlohmann::json& json, const std::string& where = "schedule");

/** Reads a schedule from a JSON file; throws InputError naming the file (unreadable, not JSON,
 *  or whatever schedule_from_json rejects). */
Schedule read_schedule_file(const std::string& path);

}  // namespace hpz
