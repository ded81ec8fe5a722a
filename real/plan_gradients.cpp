// The gradient reduction of DeepSpeed's own schedules in the plan.
//
// Stage 3 reduces each micro-step's gradients bucket by bucket: __reduce_and_partition_ipg_grads
// (stage3.py:1249 at v0.13.4) hands the bucket's gradients as a list to reduce_scatter_coalesced
// (runtime/comm/coalesced_collectives.py:82-142), which cuts each tensor into world chunks of
// ceil(numel / world) elements (96), lays member k's chunk of every tensor one after another in
// the k-th part of one flat buffer, each padded to its chunk (110-121), and reduce-scatters that
// buffer (129): member k receives the sum of its chunks, tensor after tensor. partition_grads
// (stage3.py:1418-1445) copies each chunk into the parameter's gradient partition at the first
// micro-step and adds it at the others.
//
// The plan does the same. Before the collective each member packs its bucket into a packing slot
// (PlanOp::pre_actions); the reduce-scatter (emulated, or NCCL's with one process per rank) sums
// the members' parts; after it, each parameter's chunk goes into the rank's reduced partition of
// that parameter. Each optimizer step reads its parameter's reduced partition. No rank reads
// another's memory outside a collective, so one process per rank runs it.
//
// Where the plan cannot name the parameter of every gradient in every gradient reduce-scatter
// (qgZ's quantized all-to-alls, which move no data here; a recording, whose buckets hold tensors
// of no parameter), each bucket copy keeps the rank's own gradient in a slot of the plan's, and
// each optimizer step sums every rank's slot itself, as the numeric replay's reduced_gradient
// does: one process must hold every rank (Plan::cross_rank_gradients).
//
// Where it differs from DeepSpeed, in rounding only: DeepSpeed divides the packed buffer by the
// world before the reduce-scatter (coalesced_collectives.py:125), and its padding is
// uninitialized (torch.empty, 121). The plan sums first and scales in the optimizer step, the
// numeric replay's order (so a serialized run equals the replay bit for bit), and pads with zeros.
#include <algorithm>

#include "real/plan_builder.hpp"

namespace hpz::real::detail {

// Decides the plan's mode: packed_ for every rank, or cross-rank gradients (also where no
// gradient reduce-scatter is found at all: the bucket copies then keep the gradients).
void PlanBuilder::packed_reductions() {
  packed_.assign(s_.ranks.size(), {});
  bool named = true, any = false;
  for (std::size_t r = 0; r < s_.ranks.size() && named; ++r) {
    named = find_packing(static_cast<Rank>(r), packed_[r]);
    for (const std::vector<Piece>& p : packed_[r]) any = any || !p.empty();
  }
  pack_ = named && any;
  plan_.cross_rank_gradients = !pack_;
  if (!pack_) packed_.clear();
}

// Follows rank r's bucket copies (a parameter's gradient into the flat bucket) to each gradient
// reduce-scatter, and names the parameters it reduces, in the bucket's order. False when some
// gradient reduction cannot be named so.
bool PlanBuilder::find_packing(Rank r, std::vector<std::vector<Piece>>& out) const {
  const RankSchedule& rs = s_.ranks[r];
  out.assign(rs.ops.size(), {});
  const auto access = [&](const Op& o, int k) {
    return rs.accesses[o.access_begin + static_cast<std::uint32_t>(k)];
  };
  const auto param_grad = [&](const Access& a) {
    const Buffer& b = rs.buffers[a.buffer];
    return b.role == BufferRole::kGradFull && b.unit != kNoUnit && a.offset == 0 &&
           a.bytes == s_.units[b.unit].numel * esize(r, a.buffer);
  };
  struct InBucket {
    std::uint64_t elem = 0;
    UnitId unit = kNoUnit;
    std::uint64_t numel = 0;
  };
  std::map<BufferId, std::vector<InBucket>> bucket;
  for (std::size_t i = 0; i < rs.ops.size(); ++i) {
    const Op& o = rs.ops[i];
    if (o.phase != Phase::kGradReduce) continue;
    if (o.kind == OpKind::kCopy) {
      const int src = find(r, o, AccessMode::kRead);
      const int dst = find(r, o, AccessMode::kWrite);
      if (src < 0 || dst < 0 || !param_grad(access(o, src))) continue;
      const Access w = access(o, dst);
      const UnitId u = rs.buffers[access(o, src).buffer].unit;
      bucket[w.buffer].push_back({w.offset / esize(r, w.buffer), u, s_.units[u].numel});
      continue;
    }
    if (o.kind == OpKind::kAllToAll) return false;  // qgZ
    if (o.kind != OpKind::kReduceScatter) continue;
    if (s_.groups[o.group].ranks.size() != static_cast<std::size_t>(s_.world_size)) return false;
    std::vector<Piece>& pieces = out[i];
    std::uint64_t shard = 0;
    for (std::uint32_t k = 0; k < o.access_count; ++k) {
      const Access a = access(o, static_cast<int>(k));
      if (a.mode != AccessMode::kRead) continue;
      const std::uint64_t es = esize(r, a.buffer);
      if (param_grad(a)) {  // a gradient reduced from where it is (larger than the bucket)
        const UnitId u = rs.buffers[a.buffer].unit;
        pieces.push_back({k, 0, u});
        shard += layouts_[u].shard_numel();
        continue;
      }
      // The bucket's gradients the read covers, one after another, from its first element.
      std::vector<InBucket>& in = bucket[a.buffer];
      std::sort(in.begin(), in.end(),
                [](const InBucket& x, const InBucket& y) { return x.elem < y.elem; });
      std::uint64_t at = a.offset / es;
      const std::uint64_t end = at + a.bytes / es;
      for (const InBucket& g : in) {
        if (g.elem < at || g.elem >= end) continue;
        if (g.elem != at) return false;  // a gap the plan cannot name
        pieces.push_back({k, g.elem - a.offset / es, g.unit});
        shard += layouts_[g.unit].shard_numel();
        at += g.numel;
      }
      if (at != end) return false;
      in.clear();  // the bucket is refilled from its start after its reduction
    }
    const int w = find(r, o, AccessMode::kWrite);
    if (pieces.empty() || w < 0) return false;
    const std::uint64_t es = esize(r, access(o, w).buffer);
    if (shard != o.comm_bytes / es || shard != access(o, w).bytes / es) return false;
  }
  return true;
}

SlotId PlanBuilder::packing_slot(Rank r, StreamId stream, std::uint64_t elements) {
  const auto [it, fresh] = packing_of_.try_emplace({r, stream}, 0);
  if (fresh) it->second = extra_slot(r, elements);
  std::uint64_t& held = plan_.ranks[r].slots[it->second].elements;
  held = std::max(held, elements);
  return it->second;
}

// Member m's part of a gradient reduce-scatter: its bucket packed before it joins, the members'
// parts summed into its output, and each parameter's chunk of the output into the rank's reduced
// partition of that parameter.
void PlanBuilder::reduce_scatter_packed(const Instance& inst, std::size_t m, const Span& d) {
  using K = Action::Kind;
  const auto [r, i] = inst.members[m];
  const Op& o = s_.ranks[r].ops[i];
  PlanOp& po = plan_.ranks[r].ops[i];
  const std::vector<Piece>& pieces = packed_[r][i];
  const std::uint64_t world = inst.members.size();
  const std::uint64_t shard = d.n;
  const SlotId mine = packing_slot(r, o.stream, world * shard);
  // Member k's chunk of a gradient is its primary slice (ceil(numel / world) elements), of
  // which `valid` hold elements and the rest is padding.
  const auto chunk_of = [&](const Piece& p, std::uint64_t k) {
    const ShardLayout& lay = layouts_[p.unit];
    const ElemRange c = lay.primary_slice(static_cast<int>(k));
    return std::pair{c, lay.valid(c).size()};
  };
  // reduce_scatter_coalesced's interleaving: member k's chunk of each tensor, padded.
  std::uint64_t at = 0;
  for (std::uint64_t k = 0; k < world; ++k) {
    for (const Piece& p : pieces) {
      const auto [c, valid] = chunk_of(p, k);
      Loc src = span(r, o, p.access).loc;
      src.elem += p.elem + c.begin;
      if (valid > 0) po.pre_actions.push_back({K::kCopy, {r, mine, at}, valid, {src}});
      if (valid < c.size())
        po.pre_actions.push_back({K::kZero, {r, mine, at + valid}, c.size() - valid, {}});
      at += c.size();
    }
  }
  po.native = {};
  po.native.kind = NativeCollective::Kind::kReduceScatter;
  po.native.send = {r, mine, 0};
  po.native.send_n = world * shard;
  po.native.count = shard;
  Action x{K::kSum, d.loc, shard, {}};
  for (std::size_t k = 0; k < world; ++k) {
    const auto [mr, mi] = inst.members[k];
    const Op& theirs = s_.ranks[mr].ops[mi];
    x.src.push_back({mr, packing_slot(mr, theirs.stream, world * shard), m * shard});
  }
  finish_reduce(r, o.stream, po, std::move(x), {});
  // partition_grads: each parameter's chunk into its reduced partition, copied at the step's
  // first micro-step and added at the others. Emulated and host runs do it after every member
  // has read (post_actions), NCCL's after the call (native.after).
  std::uint64_t off = 0;
  for (const Piece& p : pieces) {
    const auto [c, valid] = chunk_of(p, m);
    const std::uint64_t chunk = c.size();
    const auto [it, fresh] = reduced_.try_emplace({r, p.unit});
    ReducedSlot& red = it->second;
    if (fresh) red = {extra_slot(r, chunk), c.begin, -2};
    const Loc into{r, red.slot, 0};
    Loc from = d.loc;
    from.elem += off;
    std::vector<Action> add;
    if (red.step != o.step) {
      if (valid > 0) add.push_back({K::kCopy, into, valid, {from}});
      if (valid < chunk) add.push_back({K::kZero, {r, red.slot, valid}, chunk - valid, {}});
    } else if (valid > 0) {
      add.push_back({K::kSum, into, valid, {into, from}});
    }
    red.step = o.step;
    for (const Action& a : add) {
      po.post_actions.push_back(a);
      po.native.after.push_back(a);
    }
    off += chunk;
  }
}

// A bucket copy, where gradients cross ranks at the optimizer: the rank's gradient of the unit
// into its gradient slot (summed over the micro-steps of a step).
void PlanBuilder::take_gradient(Rank r, const Op& o, PlanOp& po) {
  using K = Action::Kind;
  if (pack_) return;  // the reduce-scatter moves it
  const int src = find(r, o, AccessMode::kRead);
  const BufferId b = s_.ranks[r].accesses[o.access_begin + static_cast<std::uint32_t>(src)].buffer;
  const UnitId u = s_.ranks[r].buffers[b].unit;
  if (u == kNoUnit) return;
  const Span s = span(r, o, static_cast<std::uint32_t>(src));
  if (s.n == 0) return;
  const auto [it, fresh] = grad_slot_.try_emplace({r, u});
  GradSlot& g = it->second;
  if (fresh) g.slot = extra_slot(r, s.loc.elem + s.n);
  std::uint64_t& held = plan_.ranks[r].slots[g.slot].elements;
  held = std::max(held, s.loc.elem + s.n);
  const Loc into{r, g.slot, s.loc.elem};
  if (g.step != o.step) {
    po.actions.push_back({K::kCopy, into, s.n, {s.loc}});
  } else {
    po.actions.push_back({K::kSum, into, s.n, {into, s.loc}});
  }
  g.step = o.step;
}

// The reduced gradient of unit u the optimizer step reads for the primary shard's span `at`
// (elements of the rank's partition): a span of the rank's reduced partition, n = 0 when the
// unit was never reduced.
PlanBuilder::Span PlanBuilder::reduced_gradient(Rank r, UnitId u, const Span& at) const {
  const auto it = reduced_.find({r, u});
  if (it == reduced_.end()) return {};
  const ReducedSlot& red = it->second;
  const std::uint64_t first = layouts_[u].primary_slice(r).begin + at.loc.elem;
  const std::uint64_t held = plan_.ranks[r].slots[red.slot].elements;
  if (first < red.base || first - red.base >= held) return {};
  return {{r, red.slot, first - red.base}, std::min(at.n, held - (first - red.base))};
}

// Every optimizer step's gradient: the rank's reduced partition (packed reductions), or the sum
// of every rank's gradient slot over the primary slice, in rank order. Spin mode subtracts 1/16
// of it from the primary shard; under the model math, Adam steps the primary shard with it
// (NumericDomain::adam on the replay's reduced_gradient: no clipping, DeepSpeed's default
// gradient_clipping 0), zeros past what the gradient holds. A sum, or a partition shorter than
// Adam reads, goes through the rank's scratch slot.
void PlanBuilder::reduced_gradients() {
  using K = Action::Kind;
  std::map<Rank, SlotId> scratch;
  // Where each op's next gradient goes in its rank's scratch: a recording's write-back copy
  // steps every shard it writes, after all of its actions (PlanOp::models).
  std::map<const PlanOp*, std::uint64_t> used;
  for (const PendingStep& st : pending_steps_) {
    const Span& at = plan_.model ? st.primary_in : st.primary;
    std::uint64_t n = at.n;
    std::vector<Loc> src;
    if (pack_) {
      const Span g = reduced_gradient(st.rank, st.unit, at);
      n = g.n;
      if (n > 0) src.push_back(g.loc);
    } else {
      const std::uint64_t first = layouts_[st.unit].primary_slice(st.rank).begin + at.loc.elem;
      for (std::size_t k = 0; k < s_.ranks.size(); ++k) {
        const auto it = grad_slot_.find({static_cast<Rank>(k), st.unit});
        if (it == grad_slot_.end()) continue;
        const std::uint64_t held = plan_.ranks[k].slots[it->second.slot].elements;
        if (first >= held) continue;
        n = std::min(n, held - first);
        src.push_back({static_cast<Rank>(k), it->second.slot, first});
      }
      if (src.empty()) n = 0;
    }
    if (n == 0 && !plan_.model) continue;
    Loc grad;
    if (pack_ && n > 0 && (n == at.n || !plan_.model)) {
      grad = src.front();  // read in place
    } else {
      const std::uint64_t width = plan_.model ? at.n : n;
      auto [sit, fresh] = scratch.try_emplace(st.rank, 0);
      if (fresh) sit->second = extra_slot(st.rank, width);
      std::uint64_t& from = used[st.op];
      RankPlan& rp = plan_.ranks[st.rank];
      rp.slots[sit->second].elements = std::max(rp.slots[sit->second].elements, from + width);
      grad = {st.rank, sit->second, from};
      if (n > 0) st.op->actions.push_back({K::kSum, grad, n, src});
      if (plan_.model && n < at.n) {
        st.op->actions.push_back({K::kZero, {st.rank, sit->second, from + n}, at.n - n, {}});
      }
      from += width;
    }
    if (!plan_.model) {
      Action x{K::kAxpy, st.primary.loc, n, {grad}};
      x.scale = -0.0625F;
      st.op->actions.push_back(x);
      continue;
    }
    st.op->spin_s = 0;  // the math is the kernel
    ModelOp& m = st.op->models.emplace_back();
    m.kind = ModelOp::Kind::kAdam;
    m.x = {at.loc, at.n};
    m.out = {st.primary.loc, at.n};
    m.grad = {grad, at.n};
    m.scale = 1.0F / static_cast<float>(s_.world_size * sc_.training.grad_accum);
    m.max_grad_norm = 0.0F;
    m.step = st.step;
    adam_state(st.rank, st.unit, *st.op, st.op->models.size() - 1);
  }
}

}  // namespace hpz::real::detail
