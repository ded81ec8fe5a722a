#include "sim/check/finding_log.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sim/check/byte_history.hpp"

namespace hpz::check {
namespace {

std::uint64_t pack(std::initializer_list<unsigned> fields) {
  std::uint64_t key = 0;
  for (unsigned f : fields) key = (key << 8) | (f & 0xffu);
  return key;
}

unsigned stream_code(const Op& op) {
  return static_cast<unsigned>(op.stream + 1);
}

const char* verb(AccessMode m) {
  return m == AccessMode::kRead ? "reads" : "writes";
}

}  // namespace

std::string_view to_string(FindingKind k) {
  switch (k) {
    case FindingKind::kRace:
      return "race";
    case FindingKind::kUseAfterFree:
      return "use-after-free";
    case FindingKind::kStaleRead:
      return "stale-read";
    case FindingKind::kUninitializedRead:
      return "uninitialized-read";
    case FindingKind::kCollectiveMismatch:
      return "collective-mismatch";
  }
  return "?";
}

OpLabel FindingLog::label(Rank r, std::uint32_t index) const {
  const RankSchedule& rs = schedule_.ranks[r];
  OpLabel l;
  l.rank = r;
  l.index = index;
  if (index == kNoOp || index >= rs.ops.size()) {
    l.stream = "none";
    return l;
  }
  const Op& op = rs.ops[index];
  l.stream = op.stream == kHostStream ? "host" : rs.streams[op.stream].name;
  l.kind = op.kind;
  l.purpose = op.purpose;
  l.phase = op.phase;
  l.step = op.step;
  l.micro_step = op.micro_step;
  if (op.unit >= 0 && op.unit < static_cast<UnitId>(schedule_.units.size())) {
    l.unit = schedule_.units[op.unit].name;
    l.layer = schedule_.units[op.unit].layer;
  }
  if (op.label >= 0 && op.label < static_cast<LabelId>(schedule_.labels.size())) {
    l.label = schedule_.labels[op.label];
  }
  return l;
}

FindingGroup* FindingLog::slot(std::uint64_t key, Rank r, std::uint32_t first, std::uint32_t op,
                               bool pair) {
  auto [it, fresh] = index_.try_emplace(key, groups_.size());
  if (fresh) groups_.emplace_back();
  FindingGroup& g = groups_[it->second];
  ++g.count;
  if (pair) g.occurrences.push_back({r, first, op});
  g.ranks.insert(r);
  const OpLabel l = label(r, op);
  if (l.layer >= 0) g.layers.insert(l.layer);
  g.steps.insert(l.step);
  return fresh ? &g : nullptr;
}

void FindingLog::race(Rank r, std::uint32_t prior, AccessMode prior_mode, std::uint32_t op,
                      AccessMode mode, BufferId b, std::uint64_t lo, std::uint64_t hi) {
  const RankSchedule& rs = schedule_.ranks[r];
  const Op& a = rs.ops[prior];
  const Op& o = rs.ops[op];
  const Buffer& buf = rs.buffers[b];
  const std::uint64_t key =
      pack({static_cast<unsigned>(FindingKind::kRace), static_cast<unsigned>(a.purpose),
            static_cast<unsigned>(o.purpose), stream_code(a), stream_code(o),
            static_cast<unsigned>(buf.role),
            static_cast<unsigned>(prior_mode) * 2 + static_cast<unsigned>(mode)});
  FindingGroup* g = slot(key, r, prior, op, true);
  if (!g) return;
  Finding& f = g->example;
  f.kind = FindingKind::kRace;
  f.first = label(r, prior);
  f.second = label(r, op);
  f.first_mode = prior_mode;
  f.second_mode = mode;
  f.buffer = buf.name;
  f.role = buf.role;
  f.offset = lo;
  f.bytes = hi - lo;
  f.detail = fmt::format(
      "{} {} {}, which {} {}; nothing orders the two (no event, stream wait, host sync or "
      "collective connects {} to {} in between), so the result depends on timing",
      describe_short(f.second), verb(mode), describe_bytes(f), describe_short(f.first),
      verb(prior_mode), f.first.stream, f.second.stream);
  if (o.stream == kHostStream) {
    f.fix =
        fmt::format("make the host synchronize {} (stream.synchronize()) after {} and before {}",
                    f.first.stream, describe_short(f.first), describe_short(f.second));
  } else {
    f.fix = fmt::format("record an event on {} after {} and make {} wait on it before {}",
                        f.first.stream, describe_short(f.first), f.second.stream,
                        describe_short(f.second));
  }
}

void FindingLog::use_after_free(Rank r, const PendingUse& use, std::uint32_t op, AccessMode mode,
                                BufferId reuser) {
  const RankSchedule& rs = schedule_.ranks[r];
  const Op& u = rs.ops[use.stamp.op];
  const Op& o = rs.ops[op];
  const Buffer& x = rs.buffers[use.buffer];
  const Buffer& y = rs.buffers[reuser];
  const std::uint64_t key =
      pack({static_cast<unsigned>(FindingKind::kUseAfterFree), static_cast<unsigned>(u.purpose),
            static_cast<unsigned>(o.purpose), stream_code(u), stream_code(o),
            static_cast<unsigned>(x.role), static_cast<unsigned>(y.role)});
  FindingGroup* g = slot(key, r, use.stamp.op, op, true);
  if (!g) return;
  Finding& f = g->example;
  f.kind = FindingKind::kUseAfterFree;
  f.first = label(r, use.stamp.op);
  f.second = label(r, op);
  f.first_mode = use.mode;
  f.second_mode = mode;
  f.buffer = x.name;
  f.role = x.role;
  f.offset = 0;
  f.bytes = x.bytes;
  f.reused = y.name;
  f.reused_role = y.role;
  const std::string block = rs.streams[static_cast<std::size_t>(use.block_stream)].name;
  f.detail = fmt::format(
      "{} {} {}, whose memory the caching allocator gave back to {}'s pool when the host freed "
      "{} ({}) and then handed to {}; {} {} {} on {}, and nothing orders that before the new "
      "owner's access: the two {} the same bytes",
      describe_short(f.second), verb(mode), y.name, block, x.name, describe(label(r, use.free_op)),
      y.name, describe_short(f.first), verb(use.mode), x.name, f.first.stream,
      use.mode == AccessMode::kWrite && mode == AccessMode::kWrite ? "write" : "touch");
  if (f.first.stream != block) {
    // The old tensor was used off its allocation stream: what record_stream is for.
    f.fix = fmt::format(
        "call {}.record_stream({}) once {} has used it (the allocator then keeps the block "
        "until {}'s work is done), or make {} wait for {} before {} is freed",
        x.name, f.first.stream, f.first.stream, f.first.stream, block, f.first.stream, x.name);
  } else {
    // The new tensor is used off its allocation stream without waiting for it.
    f.fix = fmt::format(
        "make {} wait for {} (where {} was allocated) before it uses {}: a tensor used on a "
        "stream other than its allocation stream must wait for that stream first",
        f.second.stream, block, y.name, y.name);
  }
}

void FindingLog::uninitialized(Rank r, std::uint32_t alloc, std::uint32_t op, BufferId b,
                               std::uint64_t lo, std::uint64_t hi) {
  const RankSchedule& rs = schedule_.ranks[r];
  const Op& o = rs.ops[op];
  const Buffer& buf = rs.buffers[b];
  const unsigned alloc_purpose =
      alloc == kNoOp ? 255u : static_cast<unsigned>(rs.ops[alloc].purpose);
  const std::uint64_t key =
      pack({static_cast<unsigned>(FindingKind::kUninitializedRead), alloc_purpose,
            static_cast<unsigned>(o.purpose), stream_code(o), static_cast<unsigned>(buf.role)});
  FindingGroup* g = slot(key, r, alloc, op, true);
  if (!g) return;
  Finding& f = g->example;
  f.kind = FindingKind::kUninitializedRead;
  f.first = label(r, alloc);
  f.second = label(r, op);
  f.first_mode = AccessMode::kWrite;
  f.second_mode = AccessMode::kRead;
  f.buffer = buf.name;
  f.role = buf.role;
  f.offset = lo;
  f.bytes = hi - lo;
  const std::string since =
      alloc == kNoOp ? "since the start" : "since " + describe_short(f.first) + " allocated it";
  f.detail = fmt::format(
      "{} reads {}, which no op wrote {}: it sees whatever the allocator's block "
      "held (NaN when poisoned)",
      describe_short(f.second), describe_bytes(f), since);
  f.fix = unwritten_at_init(f)
              ? fmt::format(
                    "load a checkpoint over {} before training, or initialize it inside "
                    "deepspeed.zero.GatheredParameters(..., modifier_rank=0)",
                    buf.name)
              : fmt::format(
                    "write bytes [{}, {}) of {} before {} (check the bounds of the copy that "
                    "fills it)",
                    lo, hi, buf.name, describe_short(f.second));
}

void FindingLog::stale(Rank r, std::uint32_t primary_write, std::uint32_t copy, std::uint32_t op,
                       BufferId b) {
  const RankSchedule& rs = schedule_.ranks[r];
  const Op& o = rs.ops[op];
  const Buffer& buf = rs.buffers[b];
  const unsigned writer_purpose =
      primary_write == kNoOp ? 255u : static_cast<unsigned>(rs.ops[primary_write].purpose);
  const std::uint64_t key =
      pack({static_cast<unsigned>(FindingKind::kStaleRead), writer_purpose,
            static_cast<unsigned>(o.purpose), stream_code(o), static_cast<unsigned>(buf.role)});
  FindingGroup* g = slot(key, r, primary_write, op, true);
  if (!g) return;
  Finding& f = g->example;
  f.kind = FindingKind::kStaleRead;
  f.first = label(r, primary_write);
  f.second = label(r, op);
  f.first_mode = AccessMode::kWrite;
  f.second_mode = AccessMode::kRead;
  f.buffer = buf.name;
  f.role = buf.role;
  f.bytes = buf.bytes;
  const std::string taken =
      copy == kNoOp ? std::string("earlier") : "by " + describe_short(label(r, copy));
  const bool loaded = f.first.purpose == Purpose::kCheckpointLoad;
  f.detail = fmt::format(
      "{} reads the secondary shard {}, taken {}; {} has since written new weights {}, so the "
      "gather hands out the old weights",
      describe_short(f.second), buf.name, taken, describe_short(f.first),
      loaded ? "(a load)" : "into the primary shard");
  f.fix = fmt::format(
      "invalidate (free) the secondary shard of {} after {} so the next forward "
      "re-partitions it from the new weights",
      f.second.unit.empty() ? buf.name : f.second.unit, describe_short(f.first));
}

void FindingLog::mismatch(GroupId g, std::uint32_t position, Rank a, std::uint32_t op_a, Rank b,
                          std::uint32_t op_b, const std::string& what) {
  const Group& grp = schedule_.groups[g];
  const std::uint64_t key = pack(
      {static_cast<unsigned>(FindingKind::kCollectiveMismatch), static_cast<unsigned>(grp.kind)});
  FindingGroup* slot_g =
      op_b == kNoOp ? slot(key, a, kNoOp, op_a, false) : slot(key, b, kNoOp, op_b, false);
  if (!slot_g) return;
  Finding& f = slot_g->example;
  f.kind = FindingKind::kCollectiveMismatch;
  f.first = label(a, op_a);
  f.second = label(b, op_b);
  f.group = grp.name;
  f.position = position;
  f.detail = fmt::format(
      "collective #{} on group {}: {}; NCCL matches collectives by position, so "
      "the job hangs (or exchanges mismatched buffers)",
      position, grp.name, what);
  f.fix = fmt::format(
      "make every rank of {} issue the same collectives in the same order (for "
      "hpZ: all ranks must agree whether a secondary shard exists)",
      grp.name);
}

std::vector<FindingGroup> FindingLog::take() {
  auto rank_of = [](FindingKind k) {
    return std::find(std::begin(kAllKinds), std::end(kAllKinds), k) - std::begin(kAllKinds);
  };
  std::stable_sort(groups_.begin(), groups_.end(),
                   [&](const FindingGroup& x, const FindingGroup& y) {
                     if (x.example.kind != y.example.kind)
                       return rank_of(x.example.kind) < rank_of(y.example.kind);
                     return x.count > y.count;
                   });
  index_.clear();
  return std::move(groups_);
}

std::string describe(const OpLabel& op) {
  if (op.index == kNoOp) return fmt::format("rank {} (no op)", op.rank);
  std::string where = fmt::format("step {}", op.step);
  if (op.micro_step != 0) where += fmt::format(".{}", op.micro_step);
  if (!op.unit.empty()) where += ", " + op.unit;
  where += fmt::format(", {}", to_string(op.phase));
  if (!op.label.empty()) where += ", at " + op.label;
  return fmt::format("rank {} {} #{} {} {} ({})", op.rank, op.stream, op.index, to_string(op.kind),
                     to_string(op.purpose), where);
}

std::string describe_short(const OpLabel& op) {
  if (op.index == kNoOp) return "the start of the run";
  std::string of = op.unit.empty() ? "" : " of " + op.unit;
  const std::string at = op.label.empty() ? "" : ", at " + op.label;
  // A recorded op of no known purpose is named by what it is.
  const std::string_view what =
      op.purpose == Purpose::kOther ? to_string(op.kind) : to_string(op.purpose);
  return fmt::format("the {}{} (step {}, {}, {}{})", what, of, op.step, to_string(op.phase),
                     op.stream, at);
}

std::string describe_bytes(const Finding& f) {
  return fmt::format("bytes [{}, {}) of {} ({})", f.offset, f.offset + f.bytes, f.buffer,
                     to_string(f.role));
}

}  // namespace hpz::check
