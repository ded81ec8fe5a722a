// Golden orders: a canonical text of each rank's issue order, for CI systems that guard
// scheduling orders (docs/orders.md).
//
// One line per op: stream, kind, purpose, step, phase, label, group and bytes for collectives,
// the event by name, the buffers and byte ranges by name. No op index, no event or buffer id:
// a line stays the same when an unrelated op is added elsewhere. Costs (FLOPs, HBM bytes) are
// left out: they are the cost model's, not the order's. A golden file holds, for one scenario
// with its overrides, every rank's op count and digest and rank 0's order in full (or, for a
// long order, a digest per section: a run of ops with the same step, phase and label).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"

namespace hpz {

/** Rank r's issue order, one canonical line per op. */
std::vector<std::string> canonical_order(const Schedule& schedule, Rank r);

/** FNV-1a (64 bit) over the lines, each followed by '\n', as 16 hex digits. */
std::string order_digest(const std::vector<std::string>& lines);

/** Rank r's order cut into sections, one line each: "NAME | N ops | DIGEST", NAME saying the
 *  step, phase and label the section's ops share. `lines` is canonical_order(schedule, r). */
std::vector<std::string> order_sections(const Schedule& schedule, Rank r,
                                        const std::vector<std::string>& lines);

/** What a golden file holds. */
struct GoldenOrder {
  std::string scenario;           ///< the scenario file, as given
  std::vector<std::string> sets;  ///< --set overrides, in order
  std::string built_by;           ///< e.g. "coarse builder" or "DeepSpeed 0.13.4 built", for people
  struct RankDigest {
    std::size_t ops = 0;
    std::string digest;
  };
  std::vector<RankDigest> ranks;      ///< one per rank
  std::vector<std::string> order;     ///< rank 0's canonical lines, when stored in full
  std::vector<std::string> sections;  ///< rank 0's order_sections, when `order` is not stored
};

/** Rank 0's order is stored in full when it has at most this many ops, else as sections. */
inline constexpr std::size_t kFullOrderLimit = 5000;

/** The golden order of a built schedule. */
GoldenOrder make_golden_order(const Schedule& schedule, const std::string& scenario,
                              const std::vector<std::string>& sets, const std::string& built_by,
                              std::size_t full_order_limit = kFullOrderLimit);

/** The file text of a golden order (format 1, docs/orders.md). */
std::string golden_order_text(const GoldenOrder& golden);

/** Parses a golden file's text; throws InputError naming `file` and the line on bad input. */
GoldenOrder parse_golden_order(const std::string& text, const std::string& file);

/** A readable account of how `now` differs from `golden`: which ranks differ, then rank 0's
 *  first differences (- golden, + now) with `context` lines around each, at most `max_hunks`
 *  of them. Empty when the two are equal. */
std::string golden_order_diff(const GoldenOrder& golden, const GoldenOrder& now,
                              std::size_t context = 3, std::size_t max_hunks = 4);

/** One edit of a line diff: both sides' line indexes of a kept line, or one side's of a
 *  removed (`a`) or added (`b`) line (the other side is npos). */
struct LineEdit {
  std::size_t a = 0;
  std::size_t b = 0;
};

/** The shortest edit script from a to b (Myers' O(ND) algorithm, "An O(ND) Difference Algorithm
 *  and Its Variations", Algorithmica 1986), as kept, removed and added lines in order; empty, with
 *  `too_far` set, when more than max_edits lines differ. */
std::vector<LineEdit> line_diff(const std::vector<std::string>& a,
                                const std::vector<std::string>& b, std::size_t max_edits,
                                bool& too_far);

}  // namespace hpz
