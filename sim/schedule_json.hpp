// The schedule IR as JSON: the same content as the C++ structures, lossless both ways, so that
// tools outside hpzlab (and hpzlab's own engines, from a file) can read a schedule.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "sim/schedule.hpp"

namespace hpz {

/** The JSON form of a schedule: {"format": "hpzlab-schedule", "version": 1, ...}. An op's
 *  accesses are [buffer, "r"|"w", offset, bytes], or, strided, [buffer, "r"|"w", offset, bytes,
 *  count, stride] (Access: count 2 to 65535, 0 < bytes <= stride < 2^32). */
nlohmann::json schedule_to_json(const Schedule& schedule);

/** Reads the JSON form back; throws InputError naming `where` and the offending key. Besides
 *  ranks written in full it reads a recorder's short form of the others,
 *  {"rank": r, "like": R, "groups": [[g, g2], ...]}: rank R's schedule (written in full) with
 *  every op on group g moved to g2; schedule_to_json writes every rank in full. */
Schedule schedule_from_json(const nlohmann::json& json, const std::string& where = "schedule");

/** Reads a schedule from a JSON file; throws InputError naming the file (unreadable, not JSON,
 *  or whatever schedule_from_json rejects). */
Schedule read_schedule_file(const std::string& path);

}  // namespace hpz
