// The plan of a DeepSpeed builder's schedule: every access followed by its byte range, as the
// data replay follows it (sim/replay/data_engine.hpp, "By ranges"), so that the executor moves
// the data the replay moves and a race the replay shows corrupts the same elements on a GPU.
//  - a copy moves its i-th read into its i-th write (a widening cast's each value on 2 or 4
//    elements), or its reads one after another into its
//    one write (torch.cat); a copy with no read writes the checkpoint pattern; qwZ's quantize
//    and dequantize are one-for-one pass-throughs of int8 elements (a kQuantized buffer holds
//    one element per byte);
//  - an all-gather places member k's send at k x comm_bytes of its write; a reduce-scatter
//    sums the members' k-th chunk into member k; an all-reduce sums what its members send (a
//    broadcast: only the root sends);
//  - the gradient reduction (its bucket copies, reduce-scatters and the optimizer's reads of
//    the reduced gradient): plan_gradients.cpp.
#include <fmt/format.h>

#include "real/plan_builder.hpp"

namespace hpz::real::detail {

SlotId PlanBuilder::extra_slot(Rank r, std::uint64_t elements) {
  RankPlan& rp = plan_.ranks[r];
  rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(elements, 1)});
  return static_cast<SlotId>(rp.slots.size() - 1);
}

SlotId PlanBuilder::staging_for(Rank r, StreamId stream, std::uint64_t elements) {
  const auto [it, fresh] = staging_of_.try_emplace({r, stream}, 0);
  if (fresh) it->second = extra_slot(r, elements);
  return it->second;
}

void PlanBuilder::effects_by_ranges(Rank r, const Op& o, PlanOp& po) {
  switch (o.kind) {
    case OpKind::kCopy: {
      const int src = find(r, o, AccessMode::kRead);
      const bool gradient =
          o.phase == Phase::kGradReduce && src >= 0 &&
          role(r, s_.ranks[r].accesses[o.access_begin + static_cast<std::uint32_t>(src)].buffer) ==
              BufferRole::kGradFull;
      if (gradient) take_gradient(r, o, po);
      if (s_.is_primary_write_back(r, o)) return primary_write_back(r, o, po);
      if (!moves_no_data(o)) gather_into(r, o, po);
      return;
    }
    case OpKind::kQuantize:
      if (!moves_no_data(o)) gather_into(r, o, po);
      return;
    case OpKind::kDequantize: {
      const int src = find(r, o, AccessMode::kRead);
      const int dst = find(r, o, AccessMode::kWrite);
      if (moves_no_data(o) || src < 0 || dst < 0) return;
      const Span s = span(r, o, static_cast<std::uint32_t>(src));
      const Span d = span(r, o, static_cast<std::uint32_t>(dst));
      po.actions.push_back({Action::Kind::kCopy, d.loc, std::min(s.n, d.n), {s.loc}});
      return;
    }
    default:
      return;
  }
}

// The data replay's gather_into, action for action.
void PlanBuilder::gather_into(Rank r, const Op& o, PlanOp& po) {
  using K = Action::Kind;
  std::vector<std::uint32_t> reads, writes;
  for (std::uint32_t k = 0; k < o.access_count; ++k) {
    const Access& a = s_.ranks[r].accesses[o.access_begin + k];
    (a.mode == AccessMode::kRead ? reads : writes).push_back(k);
  }
  if (writes.empty()) return;
  const auto buffer = [&](std::uint32_t k) {
    return s_.ranks[r].accesses[o.access_begin + k].buffer;
  };
  if (reads.empty()) {  // from storage: the checkpoint's values of the unit
    if (o.unit == kNoUnit) return;
    const BufferId b = buffer(writes.front());
    po.actions.push_back(
        checkpoint_pattern(r, o.unit, span(r, o, writes.front()), role(r, b) == BufferRole::kFull));
    return;
  }
  if (reads.size() == writes.size() && o.kind == OpKind::kCopy) {
    for (std::size_t i = 0; i < reads.size(); ++i) {
      if (esize(r, buffer(reads[i])) != esize(r, buffer(writes[i]))) continue;
      const Span s = span(r, o, reads[i]);
      const Span d = span(r, o, writes[i]);
      // A widening cast writes k = 2 or 4 times the bytes it reads: each value on k elements.
      const std::uint64_t k = s.n > 0 && (d.n == 2 * s.n || d.n == 4 * s.n) ? d.n / s.n : 1;
      Action x{k > 1 ? K::kWiden : K::kCopy, d.loc, std::min(k * s.n, d.n), {s.loc}};
      x.repeat = static_cast<std::uint32_t>(k);
      po.actions.push_back(x);
    }
    return;
  }
  const Span w = span(r, o, writes.front());
  const std::uint64_t wes = esize(r, buffer(writes.front()));
  const std::uint64_t capacity = w.n;
  std::uint64_t read_elems = 0, buffer_elems = 0;
  for (std::uint32_t k : reads) {
    const std::uint64_t es = esize(r, buffer(k));
    read_elems += span(r, o, k).n;
    buffer_elems += s_.ranks[r].buffers[buffer(k)].bytes / es;
  }
  // Reads covering less than the write keep their buffer's place in the concatenation.
  const bool by_buffer = read_elems != capacity && buffer_elems == capacity;
  std::uint64_t at = 0;
  for (std::uint32_t k : reads) {
    const std::uint64_t es = esize(r, buffer(k));
    const Span s = span(r, o, k);
    const std::uint64_t pos = by_buffer ? at + s.loc.elem : at;
    at += by_buffer ? s_.ranks[r].buffers[buffer(k)].bytes / es : s.n;
    if (pos >= capacity || (o.kind == OpKind::kCopy && es != wes)) continue;
    Loc dst = w.loc;
    dst.elem += pos;
    po.actions.push_back({K::kCopy, dst, std::min(s.n, capacity - pos), {s.loc}});
  }
}

void PlanBuilder::optimizer_by_ranges(Rank r, const Op& o, PlanOp& po) {
  const int p = find_role(r, o, AccessMode::kWrite, BufferRole::kPrimary);
  if (p < 0 || o.unit == kNoUnit) return;
  const Span out = span(r, o, static_cast<std::uint32_t>(p));
  Span in = out;
  if (plan_.model) {  // NumericDomain::adam reads the primary shard it reads, writes it back
    const int pi = find_role(r, o, AccessMode::kRead, BufferRole::kPrimary);
    if (pi < 0) return;
    in = span(r, o, static_cast<std::uint32_t>(pi));
  }
  pending_steps_.push_back({r, &po, o.unit, out, in, o.step});
}

// A recording's optimizer step, as the data replay takes it (Schedule::is_primary_write_back):
// each primary shard the write-back copy writes takes its step there, with the unit's reduced
// gradient (reduced_gradients), in place of the copy's own bytes.
void PlanBuilder::primary_write_back(Rank r, const Op& o, PlanOp& po) {
  for (std::uint32_t k = 0; k < o.access_count; ++k) {
    const Access& a = s_.ranks[r].accesses[o.access_begin + k];
    const UnitId u = s_.ranks[r].buffers[a.buffer].unit;
    if (a.mode != AccessMode::kWrite || role(r, a.buffer) != BufferRole::kPrimary || u == kNoUnit)
      continue;
    const Span at = span(r, o, k);
    pending_steps_.push_back({r, &po, u, at, at, o.step});
  }
}

// The data replay's receive_by_ranges, action for action.
void PlanBuilder::receive_by_ranges(const Instance& inst, std::size_t m, const Span& d,
                                    const std::vector<std::vector<Span>>& in) {
  const auto [r, i] = inst.members[m];
  const Op& o = s_.ranks[r].ops[i];
  PlanOp& po = plan_.ranks[r].ops[i];
  if (pack_ && !packed_[r][i].empty()) return reduce_scatter_packed(inst, m, d);
  if (moves_no_data(o)) return;
  const int dst = find(r, o, AccessMode::kWrite);
  const BufferId db = s_.ranks[r].accesses[o.access_begin + static_cast<std::uint32_t>(dst)].buffer;
  const std::uint64_t es = esize(r, db);
  const int own = find(r, o, AccessMode::kRead);
  // A broadcast is an all-reduce that only its root sends to (a load's).
  if (own < 0 && o.kind != OpKind::kAllReduce) return;
  if (own >= 0 &&
      esize(r, s_.ranks[r].accesses[o.access_begin + static_cast<std::uint32_t>(own)].buffer) !=
          es) {
    return;  // qwZ's scales
  }
  if (own < 0 && o.purpose == Purpose::kCheckpointLoad && o.unit != kNoUnit) {
    po.actions.push_back(checkpoint_pattern(r, o.unit, d, role(r, db) == BufferRole::kFull));
    return;
  }
  const std::uint64_t members = inst.members.size();
  switch (o.kind) {
    case OpKind::kAllGather:
      return all_gather_by_ranges(r, o, po, members, d, in, es);
    case OpKind::kReduceScatter:
      return reduce_scatter_by_ranges(r, o, po, m, members, d, in, es);
    case OpKind::kAllReduce:
      return all_reduce_by_ranges(r, o, po, members, d, in);
    default:  // all-to-all: only qgZ's, in the gradient reduction
      return;
  }
}

void PlanBuilder::all_gather_by_ranges(Rank r, const Op& o, PlanOp& po, std::uint64_t members,
                                       const Span& d, const std::vector<std::vector<Span>>& in,
                                       std::uint64_t es) {
  using K = Action::Kind;
  const std::uint64_t begin = d.loc.elem, end = begin + d.n;
  const std::uint64_t count = o.comm_bytes / es;
  bool fits = count > 0 && begin + members * count <= plan_.ranks[r].slots[d.loc.slot].elements;
  for (std::size_t k = 0; k < members; ++k) {
    fits = fits && !in[k].empty() && in[k][0].n >= count;
    if (in[k].empty()) continue;
    const std::uint64_t pos = begin + k * count;
    if (pos >= end) continue;
    po.actions.push_back(
        {K::kCopy, {r, d.loc.slot, pos}, std::min(in[k][0].n, end - pos), {in[k][0].loc}});
  }
  if (fits) {
    po.native.kind = NativeCollective::Kind::kAllGather;
    po.native.recv = {r, d.loc.slot, begin};
    po.native.count = count;
  }
  mark_probe(po, d);  // every gather's result is compared with the reference's
}

void PlanBuilder::reduce_scatter_by_ranges(Rank r, const Op& o, PlanOp& po, std::size_t m,
                                           std::uint64_t members, const Span& d,
                                           const std::vector<std::vector<Span>>& in,
                                           std::uint64_t es) {
  const std::uint64_t n = o.comm_bytes / es, from = m * n;
  Action x{Action::Kind::kSum, d.loc, std::min(n, d.n), {}};
  for (const std::vector<Span>& snd : in) {
    if (snd.empty() || snd[0].n <= from) return;
    Loc l = snd[0].loc;
    l.elem += from;
    x.src.push_back(l);
    x.n = std::min(x.n, snd[0].n - from);
  }
  if (in[m][0].n >= members * n) {
    po.native.kind = NativeCollective::Kind::kReduceScatter;
    po.native.count = n;
  }
  finish_reduce(r, o.stream, po, std::move(x), {});
}

void PlanBuilder::all_reduce_by_ranges(Rank r, const Op& o, PlanOp& po, std::uint64_t members,
                                       const Span& d, const std::vector<std::vector<Span>>& in) {
  using K = Action::Kind;
  // zero.Init's broadcast from rank 0 (_zero_init_param, PP:1011 at v0.13.4), logged as an
  // all-reduce that every rank reads (as the recorder logs it): the first sender's tensor,
  // not the sum (the data replay's rule).
  const bool broadcast = o.purpose == Purpose::kParamInit;
  Action x{K::kSum, d.loc, d.n, {}};
  int root = -1;
  for (std::size_t k = 0; k < in.size(); ++k) {
    if (in[k].empty()) continue;  // a broadcast's receiver
    x.src.push_back(in[k][0].loc);
    x.n = std::min(x.n, in[k][0].n);
    if (broadcast) {
      root = static_cast<int>(k);
      break;
    }
  }
  if (x.src.empty()) return;
  if (broadcast) {
    x.kind = K::kCopy;
    po.native.kind = NativeCollective::Kind::kBroadcast;
    po.native.root = root;
    po.native.count = x.n;
    return finish_reduce(r, o.stream, po, std::move(x), {});
  }
  if (x.src.size() == members) {
    po.native.kind = NativeCollective::Kind::kAllReduce;
    po.native.count = x.n;
  }
  finish_reduce(r, o.stream, po, std::move(x), {});
}

}  // namespace hpz::real::detail
