// The projection of a schedule that a builder must issue exactly as DeepSpeed does: per rank, in
// issue order, the collectives (kind, group, bytes), copies that write a secondary or a gathered
// parameter or read a secondary, allocations and frees of secondaries and gathered parameters,
// event records and stream waits, and host syncs. Kernels and temporaries are left out (a
// builder may be coarser there). Each op becomes one canonical line with no ids in it: streams,
// groups and units by name, an event by the stream it was recorded on and its ordinal there.
// A host sync right after an identical one, with no projected op between, is left out: the host
// already waited for the same stream (or device) and no projected op was issued since: it orders
// nothing more (kernels between are not projected). (The recorder logs every `.item()` as a host
// sync, also on a tensor a GPU run would already hold on the host: DeepSpeed 0.17.6's
// get_lst_from_rank0 calls `.item()` per element after one `.cpu()`.)
// One order DeepSpeed itself leaves open is taken out: fetch_sub_module's wait loop iterates a
// set of parameters (COORD:300 at v0.18.2, a frozenset at v0.13.4), in CPython's order for it,
// which follows the parameters' addresses. Where the loop waits for more than one gather handle
// (a z3 leaf's parameters, some prefetched), which handle's wait (and unpack) comes first is
// that order; the loop's records and throttling host waits are the same in any order. So on the
// fetch stream S_ag, a run of one module's records, throttles, handle waits and unpacks is
// projected as its handle waits, each with its unpack, sorted, then its records and throttles.
// Likewise a hook's releases: release_sub_module iterates a set of the module's parameters from
// DeepSpeed 0.19.3 (COORD:518, PR 8148), so a run of one hook's per-parameter releases (the
// secondary's allocation, copy and host wait, then the free of the gathered copy) is projected
// sorted by the parameter freed. Neither order is an edge between streams: each is one host
// thread's issue order on one stream.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"

namespace hpz {

struct ProjectedOp {
  std::size_t op = 0;  ///< index in the rank's ops
  std::string line;    ///< what is compared
  std::string where;   ///< context for reports: step, phase, module label
};

/** Rank r's projection; ops of Phase::kInit are left out when `with_init` is false. */
std::vector<ProjectedOp> project(const Schedule& s, Rank r, bool with_init);

/** first_difference's answer when the projections are equal. */
inline constexpr std::size_t kEqual = static_cast<std::size_t>(-1);

/** The index of the first projected op where `a` and `b` differ (one ending before the other
 *  differs there too); kEqual when they are equal. */
std::size_t first_difference(const std::vector<ProjectedOp>& a, const std::vector<ProjectedOp>& b);

/** Projected op i of v as a report line: its index, line, context and op index, or "(ends)"
 *  past the end. */
std::string numbered(const std::vector<ProjectedOp>& v, std::size_t i);

/** Lines of context a divergence shows before the first difference. */
inline constexpr std::size_t kDivergenceContext = 6;

/** The first difference of two projections, with `context` lines before it from each side, as
 *  text; empty when they are equal. */
std::string first_divergence(const std::vector<ProjectedOp>& expected,
                             const std::string& expected_name,
                             const std::vector<ProjectedOp>& actual, const std::string& actual_name,
                             std::size_t context = kDivergenceContext);

/** A recording of real DeepSpeed (`hpzlab record`) against a built schedule of the same
 *  scenario: the projections of every rank DeepSpeed ran as, compared op by op (as
 *  tests/test_deepspeed_builder.cpp holds the committed recordings). */
struct RecordingComparison {
  std::vector<Rank> ranks;   ///< the ranks compared: those DeepSpeed ran as
  std::size_t ops = 0;       ///< projected ops of the recording compared, all ranks together
  std::string divergence;    ///< empty when equal: first_divergence's text for the first rank
  Rank diverging_rank = -1;  ///< that rank
  std::string recorded_op;   ///< where they differ, the recording's op (numbered)
  std::string built_op;      ///< and the builder's
  std::string error;         ///< set by a caller whose builder refused the scenario
  /// Set by a caller that knows why the two differ on this scenario (a documented difference,
  /// docs/deepspeed-builder.md); empty where a difference is a defect to report.
  std::string expected_because;
  bool equal() const { return error.empty() && divergence.empty(); }
};

/** The ranks DeepSpeed ran as in a recording: its source's "recorded_rank" (a rank, ranks
 *  joined by commas, or "all"); rank 0 where it holds nothing readable. */
std::vector<Rank> recorded_ranks(const Schedule& recording);

/** Compares `built` with `recording` on recorded_ranks(recording) (with init). */
RecordingComparison compare_recording(const Schedule& recording, const Schedule& built);

/** One line: "builder: equal to this recording, op for op (...)" or where it first differs,
 *  DeepSpeed's op and the builder's. */
std::string describe(const RecordingComparison& c);

}  // namespace hpz
