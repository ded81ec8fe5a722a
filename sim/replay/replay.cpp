#include "sim/replay/replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>

#include "sim/ir/projection.hpp"
#include "sim/replay/data_engine.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/replay/taint_domain.hpp"

namespace hpz::replay {

bool numeric_fits(const ReplayInputs& m) {
  const double params =
      2.0 * m.vocab * m.hidden + m.layers * (4.0 * m.hidden * m.hidden + 3.0 * m.hidden * m.ffn);
  // Every rank's buffers (a few copies of the model each) in memory, and a Llama: transformers'
  // (llama_model.hpp; llama_unsupported checks the schedule's parameters). In 64 bits: both are
  // ints of up to 2^31 - 1, whose product wraps an int (to 1 for both at the maximum, which passed
  // this check).
  const std::int64_t tokens = std::int64_t{m.seq_len} * m.micro_batch;
  return m.family == "llama" && m.llama_shaped && params * m.world_size < 4e7 && tokens <= 4096;
}

std::string describe_step(const StepRecord& s, Mode mode) {
  if (mode == Mode::kNumeric)
    return fmt::format("loss {}, weights after it {:016x}", s.loss, s.weights_hash);
  return fmt::format("{} bad weight element{} after it", s.bad_elements,
                     s.bad_elements == 1 ? "" : "s");
}

Timeline serialized_timeline(const Schedule& s) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::size_t ranks = s.ranks.size();
  Timeline t;
  t.ranks.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) t.ranks[r].assign(s.ranks[r].ops.size(), {nan, nan, nan});
  std::vector<std::size_t> next(ranks, 0);
  std::vector<double> clock(ranks, 0);
  std::vector<std::map<GroupId, int>> issued(ranks);  // collectives passed, per group
  const auto at_collective = [&](std::size_t r) -> std::optional<Op> {
    if (next[r] >= s.ranks[r].ops.size()) return std::nullopt;
    const Op o = s.ranks[r].ops[next[r]];  // by value: OpList gives each rank's group
    return is_collective(o.kind) ? std::optional<Op>(o) : std::nullopt;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t r = 0; r < ranks; ++r) {  // everything up to the next collective
      for (; next[r] < s.ranks[r].ops.size() && !at_collective(r); ++next[r]) {
        t.ranks[r][next[r]] = {clock[r], clock[r], clock[r] + 1};
        clock[r] += 2;
        moved = true;
      }
    }
    for (std::size_t r = 0; r < ranks; ++r) {  // collectives every member has reached
      const std::optional<Op> o = at_collective(r);
      if (!o) continue;
      const int k = issued[r][o->group];
      const auto& members = s.groups[o->group].ranks;
      const bool all = std::all_of(members.begin(), members.end(), [&](Rank m) {
        const std::optional<Op> x = at_collective(static_cast<std::size_t>(m));
        return x && x->group == o->group && issued[m][o->group] == k;
      });
      if (!all) continue;
      double start = 0;
      for (Rank m : members) start = std::max(start, clock[m]);
      for (Rank m : members) {
        t.ranks[m][next[m]] = {start, start, start + 1};
        clock[m] = start + 2;
        ++issued[m][o->group];
        ++next[m];
      }
      moved = true;
    }
  }
  return t;
}

namespace {

bool has_access(const Schedule& s, Rank r, const Op& op, AccessMode mode) {
  const auto accesses = s.accesses_of(r, op);
  return std::any_of(accesses.begin(), accesses.end(),
                     [mode](const Access& a) { return a.mode == mode; });
}

/** A write of some primary shard: the builder's per-unit optimizer step. A recording's
 *  optimizer kernels write DeepSpeed's flat fp32 partition and their temporaries (scratch): its
 *  step lands in the copy that writes the primaries back (data_engine.hpp). */
bool writes_primary(const Schedule& s, Rank r, const Op& op) {
  const auto accesses = s.accesses_of(r, op);
  return std::any_of(accesses.begin(), accesses.end(), [&](const Access& a) {
    return a.mode == AccessMode::kWrite &&
           s.ranks[r].buffers[a.buffer].role == BufferRole::kPrimary;
  });
}

/** What the data engine and the taint domain need of one op ("" when it has it). */
std::string unsupported_op(const Schedule& s, Rank r, const Op& op) {
  const bool writes = has_access(s, r, op, AccessMode::kWrite);
  const bool reads = has_access(s, r, op, AccessMode::kRead);
  // Followed by byte ranges, gathers and dequantizes need no unit's layout, and an optimizer
  // step that writes nothing (the DeepSpeed builder's AdamW .item()) no unit.
  const bool needs_unit = (op.kind == OpKind::kCopy && writes && !reads) ||
                          (op.kind == OpKind::kKernel && op.purpose == Purpose::kOptimizerStep &&
                           writes_primary(s, r, op));
  if (needs_unit && op.unit == kNoUnit) return "needs a parameter unit (its shard layout)";
  const bool reduces = op.kind == OpKind::kReduceScatter || op.kind == OpKind::kAllReduce ||
                       op.kind == OpKind::kAllToAll;
  if (reduces && writes && !reads) return "receives but sends nothing (no read access)";
  return "";
}

}  // namespace

std::string replay_unsupported(const Schedule& s) {
  // A recording of one rank (or a few) gives every other rank a copy of a recorded one: the
  // same ops at the recorded rank's byte offsets, which are not the copy's own (each rank
  // holds another slice of every parameter), so its data cannot be followed.
  if (is_recording(s)) {
    const std::vector<Rank> recorded = recorded_ranks(s);
    if (recorded.size() < s.ranks.size()) {
      return fmt::format(
          "is a recording of {} of its {} ranks (source.recorded_rank {}): the others are copies "
          "at the recorded ranks' byte offsets, not their own; a replay needs every rank's own "
          "schedule (hpzlab record --rank all)",
          recorded.size(), s.ranks.size(), s.source.at("recorded_rank"));
    }
    // Each rank's gradient is taken where the bucket copy reads the parameter's gradient
    // tensor, which the recorder claims in DeepSpeed's gradient hook since 2026-11-29.
    const RankSchedule& first = s.ranks.front();
    const bool reduces = std::any_of(first.ops.begin(), first.ops.end(),
                                     [](const Op& op) { return op.phase == Phase::kGradReduce; });
    if (reduces && std::none_of(first.buffers.begin(), first.buffers.end(),
                                [](const Buffer& b) { return b.role == BufferRole::kGradFull; })) {
      return "is a recording without gradient tensors (grad_full, which `hpzlab record` claims "
             "in DeepSpeed's gradient hook since 2026-11-29): record it again";
    }
  }
  for (const RankSchedule& rs : s.ranks) {
    for (std::size_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      const std::string why = unsupported_op(s, rs.rank, op);
      if (!why.empty()) {
        return fmt::format("rank {} op {} ({} {}) {}", rs.rank, i, to_string(op.kind),
                           to_string(op.purpose), why);
      }
    }
  }
  return "";
}

std::string hang_of(const Schedule& s, const Timeline& t) {
  std::uint64_t never_ran = 0;
  std::string first;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
      const Op& op = s.ranks[r].ops[i];
      // Never ran: NaN (serialized_timeline) or -1 (the timing engine's mark).
      const double end = t.ranks[r][i].end_s;
      if (op.kind == OpKind::kAlloc || (std::isfinite(end) && end >= 0)) continue;
      if (never_ran++ == 0) {
        first = fmt::format("rank {} op {} ({} {}, step {})", r, i, to_string(op.kind),
                            to_string(op.purpose), op.step);
      }
    }
  }
  if (never_ran == 0) return "";
  return fmt::format(
      "HANG: {} op(s) never ran (a collective that not every rank of its group issues, "
      "mismatched collectives); the first: {}",
      never_ran, first);
}

ReplayResult replay(const ReplayInputs& scenario, const Schedule& given, const Timeline& timeline,
                    Mode mode) {
  // The data engine and the domains index accesses one range each: strided ones written out.
  std::optional<Schedule> unfolded;
  if (has_strided_accesses(given)) unfolded = unfold_strided(given);
  const Schedule& schedule = unfolded ? *unfolded : given;
  ReplayResult out;
  out.mode = mode;
  if (mode == Mode::kNumeric) {
    NumericDomain d(scenario, schedule);
    out.mixed_reads = DataEngine<NumericDomain>(schedule, timeline, d).run();
    out.steps = d.steps();
  } else {
    TaintDomain d(scenario, schedule);
    out.mixed_reads = DataEngine<TaintDomain>(schedule, timeline, d).run();
    out.steps = d.steps();
  }
  return out;
}

}  // namespace hpz::replay
