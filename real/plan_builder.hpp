// The plan's builder, shared by plan.cpp (slots, kernels and the Llama's math), plan_ranges.cpp
// (every other op, followed by byte ranges as the data replay follows them) and
// plan_gradients.cpp (the gradient reductions and optimizer steps). Internal to hpzlab_real.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "real/pattern.hpp"
#include "real/plan.hpp"
#include "sim/error.hpp"
#include "sim/ir/shard.hpp"
#include "sim/replay/data_engine.hpp"
#include "sim/replay/llama_model.hpp"
#include "sim/replay/module_roles.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/replay/replay.hpp"
#include "sim/time/cost_model.hpp"

namespace hpz::real::detail {

/** Builds one rank's slots and every op's non-collective actions; collectives get theirs once
 *  every member is known (PlanBuilder::collectives). */
class PlanBuilder {
 public:
  PlanBuilder(const Scenario& sc, const Schedule& s, bool model)
      : sc_(sc), s_(s), cost_(timing_inputs_of(sc)), roles_(s) {
    for (const ParamUnit& u : s.units) layouts_.emplace_back(u.numel, s.world_size, s.hpz_size);
    // The model math stores fp32 whatever the schedule's element size, as the numeric replay
    // computes in fp32 (its elements are counted in the schedule's size: esize).
    plan_.element_bytes = model ? 4 : s.dtype_bytes;
    plan_.model = model;
    if (model) {
      plan_.llama = replay::llama_dims(replay_inputs_of(sc));
    }
    plan_.ranks.resize(s.ranks.size());
    access_slot_.resize(s.ranks.size());
    weights_seen_.resize(s.ranks.size());
  }

  Plan build() {
    packed_reductions();
    for (std::size_t r = 0; r < s_.ranks.size(); ++r) rank(static_cast<Rank>(r));
    for (RankPlan& rp : plan_.ranks) {
      rp.staging = static_cast<SlotId>(rp.slots.size());
      rp.slots.push_back({kNoBuffer, 1});
      rp.native_staging = static_cast<SlotId>(rp.slots.size());
      rp.slots.push_back({kNoBuffer, 1});
    }
    collectives();
    // After the collectives: packed gradient reductions make the reduced partitions the
    // optimizer steps read (plan_gradients.cpp).
    reduced_gradients();
    if (plan_.model) model_slots();
    mark_touched();
    return std::move(plan_);
  }

 private:
  BufferRole role(Rank r, BufferId b) const { return s_.ranks[r].buffers[b].role; }
  std::uint64_t elems(std::uint64_t bytes) const { return bytes / s_.dtype_bytes; }

  std::uint64_t slot_elements(Rank r, BufferId b) const {
    const Buffer& buf = s_.ranks[r].buffers[b];
    // A quantized buffer holds one element per byte (its int8 values).
    return std::max<std::uint64_t>(buf.bytes / esize(r, b), 1);
  }

  /** Where an access points: its slot and first element, and how many elements it covers.
   *  A quantized buffer is read from its start, whole (the replay's rule). */
  struct Span {
    Loc loc;
    std::uint64_t n = 0;
  };
  Span span(Rank r, const Op& o, std::uint32_t k) const {
    const Access& a = s_.ranks[r].accesses[o.access_begin + k];
    const SlotId slot = access_slot_[r][o.access_begin + k];
    const std::uint64_t es = esize(r, a.buffer);
    return {{r, slot, a.offset / es}, a.bytes / es};
  }
  /** One parameter's gradient in a gradient reduce-scatter: the unit's whole gradient from
   *  element `elem` of the op's read access `access` (reduce_scatter_coalesced's list, in
   *  order). */
  struct Piece {
    std::uint32_t access = 0;
    std::uint64_t elem = 0;
    UnitId unit = kNoUnit;
  };
  /** The k-th access of `mode` (nth = 0 first), or -1. */
  int find(Rank r, const Op& o, AccessMode mode, int nth = 0) const {
    for (std::uint32_t k = 0; k < o.access_count; ++k) {
      if (s_.ranks[r].accesses[o.access_begin + k].mode == mode && nth-- == 0) {
        return static_cast<int>(k);
      }
    }
    return -1;
  }
  int find_role(Rank r, const Op& o, AccessMode mode, BufferRole want) const {
    for (std::uint32_t k = 0; k < o.access_count; ++k) {
      const Access& a = s_.ranks[r].accesses[o.access_begin + k];
      if (a.mode == mode && role(r, a.buffer) == want) return static_cast<int>(k);
    }
    return -1;
  }

  void rank(Rank r) {
    const RankSchedule& rs = s_.ranks[r];
    RankPlan& rp = plan_.ranks[r];
    std::vector<SlotId> cur(rs.buffers.size());
    for (std::size_t b = 0; b < rs.buffers.size(); ++b) {
      cur[b] = static_cast<SlotId>(b);
      rp.slots.push_back({static_cast<BufferId>(b), slot_elements(r, static_cast<BufferId>(b))});
    }
    access_slot_[r].resize(rs.accesses.size());
    rp.ops.resize(rs.ops.size());
    for (std::size_t i = 0; i < rs.ops.size(); ++i) {
      const Op& o = rs.ops[i];
      PlanOp& po = rp.ops[i];
      if (o.kind == OpKind::kAlloc) {
        cur[o.buffer] = static_cast<SlotId>(rp.slots.size());
        rp.slots.push_back({o.buffer, slot_elements(r, o.buffer)});
        po.alloc_slot = cur[o.buffer];
      } else if (o.kind == OpKind::kFree) {
        po.alloc_slot = cur[o.buffer];
      }
      for (std::uint32_t k = 0; k < o.access_count; ++k) {
        access_slot_[r][o.access_begin + k] = cur[rs.accesses[o.access_begin + k].buffer];
      }
      effects(r, o, po);
    }
    // A unit's primary shard at the end is its last primary buffer: DeepSpeed's builder declares
    // zero.Init's and then the one in the optimizer's flat buffer that defragment() moves it
    // into (sim/deepspeed/partition.cpp), after which zero.Init's is never written again.
    std::vector<std::size_t> last_primary(s_.units.size(), rs.buffers.size());
    for (std::size_t b = 0; b < rs.buffers.size(); ++b) {
      const Buffer& buf = rs.buffers[b];
      if (buf.role == BufferRole::kPrimary && buf.unit != kNoUnit) last_primary[buf.unit] = b;
    }
    for (std::size_t b = 0; b < rs.buffers.size(); ++b) {
      const Buffer& buf = rs.buffers[b];
      if (buf.role != BufferRole::kPrimary || buf.unit == kNoUnit) continue;
      if (last_primary[buf.unit] != b) continue;
      const ShardLayout& lay = layouts_[buf.unit];
      const ElemRange p = lay.primary_slice(r);
      const ElemRange v = lay.valid(p);
      rp.weights.push_back({r, cur[b], v.begin - p.begin});
      rp.weight_n.push_back(v.size());
    }
  }

  void effects(Rank r, const Op& o, PlanOp& po) {
    if (plan_.model && o.kind == OpKind::kKernel) {
      if (llama_kernel(r, o, po)) return;
    }
    if (o.kind == OpKind::kKernel || o.kind == OpKind::kQuantize || o.kind == OpKind::kDequantize) {
      po.spin_s = cost_.op_s(s_, r, o);
      po.gemm = gemm_shape(sc_, o);
    }
    if (o.kind != OpKind::kKernel) return effects_by_ranges(r, o, po);
    kernel(r, o, po);
  }

  void kernel(Rank r, const Op& o, PlanOp& po) {
    using K = Action::Kind;
    if (o.purpose == Purpose::kParamInit) {
      for (std::uint32_t k = 0; k < o.access_count; ++k) {
        const Access& a = s_.ranks[r].accesses[o.access_begin + k];
        if (a.mode != AccessMode::kWrite) continue;
        const Span d = span(r, o, k);
        if (role(r, a.buffer) == BufferRole::kFull) {
          Action x{K::kPattern, d.loc, d.n, {}};
          x.salt = kInitSalt;
          x.unit = o.unit;
          x.pattern_base = d.loc.elem;
          if (plan_.model) {
            // One init kernel makes every parameter of a module (DeepSpeed builder): each its
            // own values (NumericDomain::init_kernel).
            x.unit = s_.unit_of(r, o, a);
            to_const(x, false);
          }
          po.actions.push_back(x);
        } else {
          po.actions.push_back({K::kZero, d.loc, d.n, {}});
        }
      }
      return;
    }
    const bool backward =
        o.purpose == Purpose::kBackwardCompute || o.purpose == Purpose::kLossGradient;
    if (backward && !plan_.model) {  // the model math's: llama_backward
      // grad = weights / 8, with the weights the first backward kernel that read them saw
      // (replay::ModuleRoles, as under the model math): the builder's kernel reads them and
      // writes the gradient, autograd's (a recording) reads them in one kernel and writes the
      // gradient in a later one.
      const replay::KernelRoles k = roles(r, o);
      see_weights(r, o, k, po);
      if (k.gradient == kNoUnit) return;
      const auto seen = weights_seen_[r].find(k.gradient);
      if (seen == weights_seen_[r].end()) return;
      const Range g = part(r, o, k.gradient_access);
      Action x{K::kScale, g.at, std::min(g.n, seen->second.n), {seen->second.at}};
      x.scale = 0.125F;
      po.actions.push_back(x);
      return;
    }
    if (o.purpose == Purpose::kOptimizerStep) optimizer_by_ranges(r, o, po);
  }

  // --- The Llama's real math: each kernel as NumericDomain::kernel computes it ---

  /** The access's own range (the replay's `part`). */
  Range part(Rank r, const Op& o, int k) const {
    const Span sp = span(r, o, static_cast<std::uint32_t>(k));
    return {sp.loc, sp.n};
  }
  /** The whole slot the access refers to (the replay's `whole`). */
  Range whole(Rank r, const Op& o, int k) const {
    const SlotId slot = access_slot_[r][o.access_begin + static_cast<std::uint32_t>(k)];
    return {{r, slot, 0}, plan_.ranks[r].slots[slot].elements};
  }

  /** Plan::consts index of a unit's initial weights (at init, or as the checkpoint holds them:
   *  NumericDomain's init_kernel and checkpoint). */
  std::uint32_t initial(UnitId u, bool checkpoint) {
    auto [it, fresh] = const_of_.try_emplace({u, checkpoint}, plan_.consts.size());
    if (fresh) {
      const std::uint64_t seed = sc_.run.seed + (checkpoint ? replay::kCheckpointSeedOffset : 0);
      plan_.consts.push_back(
          replay::llama_initial_weights(*plan_.llama, llama_param(u).part, seed, u));
    }
    return static_cast<std::uint32_t>(it->second);
  }
  /** Plan::tokens index of the op's batch. */
  std::int32_t tokens(Rank r, const Op& o) {
    auto [it, fresh] = tokens_of_.try_emplace({r, o.step, o.micro_step}, plan_.tokens.size());
    if (fresh) {
      plan_.tokens.push_back(replay::synthetic_tokens(*plan_.llama, sc_.run.seed,
                                                      static_cast<int>(r), o.step, o.micro_step));
    }
    return static_cast<std::int32_t>(it->second);
  }
  /** The gradient norm's kernel: the sum of squares of every gradient it reads. */
  bool grad_norm_kernel(Rank r, const Op& o, PlanOp& po) {
    ModelOp m;
    int out = -1;
    for (std::uint32_t k = 0; k < o.access_count; ++k) {
      if (s_.ranks[r].accesses[o.access_begin + k].mode == AccessMode::kWrite) {
        out = static_cast<int>(k);
      } else {
        m.parts.push_back(part(r, o, static_cast<int>(k)));
      }
    }
    if (out < 0) return false;
    m.kind = ModelOp::Kind::kGradNorm;
    m.out = whole(r, o, out);
    m.out.n = 1;
    po.models.push_back(std::move(m));
    return true;
  }

  replay::LlamaParam llama_param(UnitId u) const {
    return *replay::llama_param(s_.units[u].name);  // every unit checked by model_math_unfit
  }

  /** A Llama kernel of the op's pass: the parameter `u`'s module part, or none. */
  ModelOp llama_op(Rank r, const Op& o, ModelOp::Kind kind, UnitId u) {
    ModelOp m;
    m.kind = kind;
    m.tokens = tokens(r, o);
    m.step = o.step;
    m.micro = o.micro_step;
    if (u != kNoUnit) {
      const replay::LlamaParam p = llama_param(u);
      m.layer = p.layer;
      m.part = static_cast<std::uint8_t>(p.part);
    }
    return m;
  }

  /** The op as kernels of the Llama, as NumericDomain's module_forward and module_backward
   *  compute them, by the rule they share (replay::ModuleRoles); false when it is none (init and
   *  the gradient norm by grad_norm_kernel; the optimizer step once every rank's gradients are
   *  known: reduced_gradients). */
  bool llama_kernel(Rank r, const Op& o, PlanOp& po) {
    switch (o.purpose) {
      case Purpose::kForwardCompute:
      case Purpose::kRecomputeForward:
        return llama_forward(r, o, roles(r, o), po);
      case Purpose::kLossGradient:
      case Purpose::kBackwardCompute:
        return llama_backward(r, o, roles(r, o), po);
      case Purpose::kGradNorm:
        return grad_norm_kernel(r, o, po);
      default:
        return false;
    }
  }
  replay::KernelRoles roles(Rank r, const Op& o) {
    const replay::KernelRoles k = roles_.kernel(r, o);
    if (k.new_micro) weights_seen_[r].clear();
    return k;
  }
  /** The access's own range, from a pointer into the schedule's accesses. */
  Range part(Rank r, const Op& o, const Access* a) const {
    return part(r, o, static_cast<int>(s_.ranks[r].accesses.index_of(a) - o.access_begin));
  }

  /** Forward: the parameter's module part; other kernels (activations only: the attention's
   *  core, the MLP's activation) spin. */
  bool llama_forward(Rank r, const Op& o, const replay::KernelRoles& k, PlanOp& po) {
    if (k.forward == kNoUnit) return false;
    ModelOp m = llama_op(r, o, ModelOp::Kind::kLlamaForward, k.forward);
    m.recompute = o.purpose == Purpose::kRecomputeForward;
    m.w = part(r, o, k.forward_weights);
    po.models.push_back(std::move(m));
    return true;
  }

  /** Backward: the loss first where the micro-step's backward starts; the weights the first
   *  backward kernel that reads them sees, kept in a slot of the plan's (a stash, copied on the
   *  kernel's stream) unless the same kernel also writes their gradient (the builder's); the
   *  gradient computed with them at the kernel that writes it. */
  bool llama_backward(Rank r, const Op& o, const replay::KernelRoles& k, PlanOp& po) {
    bool any = false;
    if (k.loss) {
      ModelOp m = llama_op(r, o, ModelOp::Kind::kLlamaLoss, kNoUnit);
      RankPlan& rp = plan_.ranks[r];
      m.loss = {r, 0, rp.loss_steps.size()};  // the slot is added once every op is planned
      rp.loss_steps.push_back(o.step);
      po.models.push_back(std::move(m));
      any = true;
    }
    any = see_weights(r, o, k, po) || any;
    if (k.gradient == kNoUnit) return any;
    const UnitId u = k.gradient;
    if (!k.gradient_first) {
      throw InputError("", "ranks",
                       fmt::format("rank {}: the gradient of {} is written twice in one "
                                   "micro-step (the model math computes it once)",
                                   r, s_.units[u].name));
    }
    const replay::LlamaParam p = llama_param(u);
    if (!k.weights_seen && p.part != replay::LlamaPart::kEmbed) {
      throw InputError("", "ranks",
                       fmt::format("rank {}: the gradient of {} is written before any "
                                   "backward kernel read its weights",
                                   r, s_.units[u].name));
    }
    ModelOp m = llama_op(r, o, ModelOp::Kind::kLlamaBackward, u);
    if (const auto seen = weights_seen_[r].find(u); seen != weights_seen_[r].end()) {
      m.w = seen->second;
    }
    m.grad = part(r, o, k.gradient_access);
    m.grad_first = m.grad.at.elem;
    m.numel = s_.units[u].numel;
    if (m.grad_first + m.grad.n > m.numel) m.grad.n = m.numel - std::min(m.numel, m.grad_first);
    po.models.push_back(std::move(m));
    return true;
  }
  /** The weights the first backward kernel of the micro-step that reads them sees: in place
   *  when the same kernel writes their gradient (the builder's), else stashed; false when the
   *  op is no such first reader. */
  bool see_weights(Rank r, const Op& o, const replay::KernelRoles& k, PlanOp& po) {
    if (k.weights == kNoUnit) return false;
    Range at = part(r, o, k.weights_access);
    if (k.weights != k.gradient) at = stash(r, k.weights, at, po);
    weights_seen_[r].emplace(k.weights, at);
    return true;
  }
  /** The weights `at` copied, on the op's stream, into rank r's stash of unit u (a slot of the
   *  plan's, reused by every micro-step: its gradient kernel runs before the next one's stash on
   *  the same stream); returns the stash's range. */
  Range stash(Rank r, UnitId u, const Range& at, PlanOp& po) {
    const auto [it, fresh] = stash_of_.try_emplace({r, u}, 0);
    if (fresh) it->second = extra_slot(r, at.n);
    std::uint64_t& held = plan_.ranks[r].slots[it->second].elements;
    held = std::max(held, at.n);
    const Range into{{r, it->second, 0}, at.n};
    po.actions.push_back({Action::Kind::kCopy, into.at, at.n, {at.at}});
    return into;
  }

  /** Adam's moments of (rank r, unit u), shared by its steps (slots added by model_slots):
   *  for the op's model kernel `k`. */
  void adam_state(Rank r, UnitId u, PlanOp& po, std::size_t k) {
    ModelOp& m = po.models[k];
    auto [it, fresh] = adam_of_.try_emplace({r, u}, adam_ops_.size());
    if (fresh) adam_ops_.push_back({r, m.x.n, {}});
    AdamSlots& st = adam_ops_[it->second];
    st.n = std::max(st.n, m.x.n);
    st.ops.emplace_back(&po, k);
    m.fresh_state = fresh;
  }

  /** The slots only the model math has: each rank's loss values and Adam's moments. */
  void model_slots() {
    for (RankPlan& rp : plan_.ranks) {
      rp.losses = static_cast<SlotId>(rp.slots.size());
      rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(rp.loss_steps.size(), 1), true});
      for (PlanOp& po : rp.ops) {
        for (ModelOp& m : po.models) {
          if (m.kind == ModelOp::Kind::kLlamaLoss) m.loss.slot = rp.losses;
        }
      }
    }
    for (const AdamSlots& st : adam_ops_) {
      RankPlan& rp = plan_.ranks[st.rank];
      const auto m = static_cast<SlotId>(rp.slots.size());
      rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(st.n, 1), true});
      rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(st.n, 1), true});
      for (const auto& [po, k] : st.ops) {
        ModelOp& x = po->models[k];
        x.m = {{st.rank, m, 0}, x.x.n};
        x.v = {{st.rank, m + 1, 0}, x.x.n};
      }
    }
  }

  // Matches the k-th collective of every group across its members (NCCL's rule), then gives
  // each member the actions that fill its receive buffer from the members' send buffers.
  void collectives() {
    std::map<std::pair<GroupId, std::int64_t>, std::size_t> index;
    for (std::size_t r = 0; r < s_.ranks.size(); ++r) {
      std::map<GroupId, std::int64_t> count;
      for (std::uint32_t i = 0; i < s_.ranks[r].ops.size(); ++i) {
        const Op& o = s_.ranks[r].ops[i];
        if (!is_collective(o.kind)) continue;
        const auto key = std::make_pair(o.group, count[o.group]++);
        auto [it, fresh] = index.try_emplace(key, plan_.instances.size());
        if (fresh) plan_.instances.push_back({o.group, s_.groups[o.group].ranks, {}});
        Instance& inst = plan_.instances[it->second];
        PlanOp& po = plan_.ranks[r].ops[i];
        po.instance = static_cast<std::int32_t>(it->second);
        po.member = static_cast<std::int32_t>(inst.members.size());
        inst.members.emplace_back(static_cast<Rank>(r), i);
      }
    }
    for (const Instance& inst : plan_.instances) {
      if (inst.members.size() != s_.groups[inst.group].ranks.size()) continue;  // would hang
      for (std::size_t m = 0; m < inst.members.size(); ++m) receive(inst, m);
    }
  }

  std::vector<Span> sends(Rank r, const Op& o) const {
    std::vector<Span> out;
    for (int nth = 0;; ++nth) {
      const int k = find(r, o, AccessMode::kRead, nth);
      if (k < 0) break;
      out.push_back(span(r, o, static_cast<std::uint32_t>(k)));
    }
    return out;
  }

  void receive(const Instance& inst, std::size_t m) {
    const auto [r, i] = inst.members[m];
    const Op& o = s_.ranks[r].ops[i];
    PlanOp& po = plan_.ranks[r].ops[i];
    std::vector<std::vector<Span>> in;
    for (const auto& [mr, mi] : inst.members) in.push_back(sends(mr, s_.ranks[mr].ops[mi]));
    if (!in[m].empty()) {
      po.native.send = in[m][0].loc;
      po.native.send_n = in[m][0].n;
    }
    const int dst = find(r, o, AccessMode::kWrite);
    if (dst < 0) {
      if (in[m].empty()) meet_only(r, o, po);
      return;
    }
    const Span d = span(r, o, static_cast<std::uint32_t>(dst));
    receive_by_ranges(inst, m, d, in);
  }

  /** A collective that moves none of the plan's data (a gradient norm's or an overflow flag's
   *  all-reduce): with one process per rank it still meets its members, as one in-place NCCL
   *  all-reduce of its size in the native staging slot. */
  void meet_only(Rank r, const Op& o, PlanOp& po) {
    RankPlan& rp = plan_.ranks[r];
    NativeCollective& nat = po.native;
    nat.kind = NativeCollective::Kind::kAllReduce;
    nat.count = std::max<std::uint64_t>(elems(o.comm_bytes), 1);
    nat.send = nat.recv = {r, rp.native_staging, 0};
    nat.send_n = 0;  // nothing any member's actions read
    rp.slots[rp.native_staging].elements =
        std::max(rp.slots[rp.native_staging].elements, nat.count);
  }

  /** The checkpoint's values of unit `u` written into `d`: its whole parameter (a gathered
   *  buffer) or rank r's primary slice of it. */
  /** What a checkpoint load writes at d (the primary slice of rank r, or the `whole`
   *  parameter): the checkpoint pattern, or under the model math the checkpoint's weights. */
  Action checkpoint_pattern(Rank r, UnitId u, const Span& d, bool whole) {
    Action a{Action::Kind::kPattern, d.loc, d.n, {}};
    a.salt = kCheckpointSalt;
    a.unit = u;
    a.pattern_base = (whole ? 0 : layouts_[u].primary_slice(r).begin) + d.loc.elem;
    if (plan_.model) to_const(a, true);
    return a;
  }
  /** A pattern action of a unit's values as the model's weights (at init or from the
   *  checkpoint): elements past the parameter's (its padding) are not written, as the replay's
   *  slice of the weights leaves them. */
  void to_const(Action& a, bool checkpoint) {
    a.kind = Action::Kind::kConst;
    a.const_id = initial(a.unit, checkpoint);
    const std::uint64_t have = plan_.consts[a.const_id].size();
    a.n = a.pattern_base >= have ? 0 : std::min(a.n, have - a.pattern_base);
  }

  /** A gather whose result is compared with the reference's. */
  void mark_probe(PlanOp& po, const Span& d) {
    po.is_gather_probe = true;
    po.probe = d.loc;
    po.probe_n = d.n;
    ++plan_.probes;
  }

  /** A reduction's sum `x` as this member's actions: through the native staging slot for a
   *  one-process-per-rank run (+ `local`, what this rank adds after the NCCL call), and through
   *  the staging slot when it writes a buffer it also reads. */
  void finish_reduce(Rank r, StreamId stream, PlanOp& po, Action x, std::vector<Loc> local) {
    using K = Action::Kind;
    RankPlan& rp = plan_.ranks[r];
    NativeCollective& nat = po.native;
    if (nat.kind != NativeCollective::Kind::kNone) {
      nat.recv = {r, rp.native_staging, 0};
      rp.slots[rp.native_staging].elements =
          std::max(rp.slots[rp.native_staging].elements, nat.count);
      local.insert(local.begin(), nat.recv);
      nat.after.push_back({local.size() > 1 ? K::kSum : K::kCopy, x.dst, x.n, local});
    }
    const bool in_place = std::any_of(x.src.begin(), x.src.end(), [&](const Loc& l) {
      return l.rank == r && l.slot == x.dst.slot;
    });
    if (in_place) {  // sum into staging, copy into place after every member has read
      // The DeepSpeed builder's schedules reduce in place on several streams of a rank at once
      // (nccl.world, its clones): each stream gets a staging slot of its own.
      const SlotId st = staging_for(r, stream, x.n);
      rp.slots[st].elements = std::max(rp.slots[st].elements, x.n);
      po.post_actions.push_back({K::kCopy, x.dst, x.n, {{r, st, 0}}});
      x.dst = {r, st, 0};
    }
    po.actions.push_back(x);
  }

  // ---- By ranges: the DeepSpeed builder's schedules (plan_ranges.cpp) ----
  std::uint64_t esize(Rank r, BufferId b) const {
    return role(r, b) == BufferRole::kQuantized ? 1 : static_cast<std::uint64_t>(s_.dtype_bytes);
  }
  /** The gradient reduction moves data only where the plan follows it through its
   *  reduce-scatters (plan_gradients.cpp). */
  bool moves_no_data(const Op& o) const { return o.phase == Phase::kGradReduce && !pack_; }
  void effects_by_ranges(Rank r, const Op& o, PlanOp& po);
  void gather_into(Rank r, const Op& o, PlanOp& po);
  void take_gradient(Rank r, const Op& o, PlanOp& po);
  void optimizer_by_ranges(Rank r, const Op& o, PlanOp& po);
  void primary_write_back(Rank r, const Op& o, PlanOp& po);
  void reduced_gradients();
  // The gradient reduction through its reduce-scatters (plan_gradients.cpp).
  void packed_reductions();
  bool find_packing(Rank r, std::vector<std::vector<Piece>>& out) const;
  void reduce_scatter_packed(const Instance& inst, std::size_t m, const Span& d);
  SlotId packing_slot(Rank r, StreamId stream, std::uint64_t elements);
  Span reduced_gradient(Rank r, UnitId u, const Span& at) const;
  void receive_by_ranges(const Instance& inst, std::size_t m, const Span& d,
                         const std::vector<std::vector<Span>>& in);
  /** receive_by_ranges for an all-gather: each member's shard copied to its place in `d`. */
  void all_gather_by_ranges(Rank r, const Op& o, PlanOp& po, std::uint64_t members, const Span& d,
                            const std::vector<std::vector<Span>>& in, std::uint64_t es);
  /** receive_by_ranges for a reduce-scatter: member m's part of every sender's tensor, summed. */
  void reduce_scatter_by_ranges(Rank r, const Op& o, PlanOp& po, std::size_t m,
                                std::uint64_t members, const Span& d,
                                const std::vector<std::vector<Span>>& in, std::uint64_t es);
  /** receive_by_ranges for an all-reduce: the senders' tensors summed, or a broadcast's root's. */
  void all_reduce_by_ranges(Rank r, const Op& o, PlanOp& po, std::uint64_t members, const Span& d,
                            const std::vector<std::vector<Span>>& in);
  SlotId extra_slot(Rank r, std::uint64_t elements);
  SlotId staging_for(Rank r, StreamId stream, std::uint64_t elements);

  void touch(const Loc& l) { plan_.ranks[l.rank].slots[l.slot].touched = true; }
  void touch(const std::vector<Action>& actions) {
    for (const Action& a : actions) {
      if (a.n == 0) continue;
      touch(a.dst);
      for (const Loc& l : a.src) touch(l);
    }
  }
  void touch(const ModelOp& m) {
    if (m.kind == ModelOp::Kind::kNone) return;
    for (const Range* x : {&m.w, &m.x, &m.out, &m.dy, &m.grad, &m.norm, &m.m, &m.v}) {
      if (x->n > 0) touch(x->at);
    }
    for (const Range& x : m.parts) {
      if (x.n > 0) touch(x.at);
    }
  }
  void mark_touched() {
    for (RankPlan& rp : plan_.ranks) {
      for (const PlanOp& po : rp.ops) {
        touch(po.actions);
        touch(po.pre_actions);
        touch(po.post_actions);
        if (po.is_gather_probe && po.probe_n > 0) touch(po.probe);
        for (const ModelOp& m : po.models) touch(m);
      }
      for (std::size_t u = 0; u < rp.weights.size(); ++u) {
        if (rp.weight_n[u] > 0) touch(rp.weights[u]);
      }
    }
  }

  const Scenario& sc_;
  const Schedule& s_;
  time::CostModel cost_;
  std::vector<ShardLayout> layouts_;
  Plan plan_;
  std::vector<std::vector<SlotId>> access_slot_;  // [rank][access]
  // The model math's bookkeeping.
  struct AdamSlots {
    Rank rank = 0;
    std::uint64_t n = 0;
    std::vector<std::pair<PlanOp*, std::size_t>> ops;  ///< (op, its model kernel)
  };
  std::map<std::pair<UnitId, bool>, std::size_t> const_of_;
  std::map<std::tuple<Rank, int, int>, std::size_t> tokens_of_;
  std::map<std::pair<Rank, UnitId>, std::size_t> adam_of_;
  std::vector<AdamSlots> adam_ops_;
  replay::ModuleRoles roles_;
  std::vector<std::map<UnitId, Range>> weights_seen_;   // [rank]: the micro-step's, by unit
  std::map<std::pair<Rank, UnitId>, SlotId> stash_of_;  // (rank, unit) -> its weights' stash
  // By ranges.
  /** (rank, unit) -> the slot holding the rank's gradient of the unit, micro-steps summed, and
   *  the step it was last written in. */
  struct GradSlot {
    SlotId slot = 0;  ///< holds the unit's gradient from element 0 (its size: the slot's)
    std::int32_t step = -2;
  };
  std::map<std::pair<Rank, UnitId>, GradSlot> grad_slot_;
  /** Optimizer steps waiting for every rank's gradient slots (reduced_gradients). */
  struct PendingStep {
    Rank rank = 0;
    PlanOp* op = nullptr;
    UnitId unit = kNoUnit;
    Span primary;     ///< the primary shard it writes
    Span primary_in;  ///< ... and reads (the model math's Adam; else `primary`)
    std::int32_t step = 0;
  };
  /** (rank, stream) -> the slot an in-place reduction on that stream sums into. */
  std::map<std::pair<Rank, StreamId>, SlotId> staging_of_;
  std::vector<PendingStep> pending_steps_;
  /** The gradient reduction through its reduce-scatters (plan_gradients.cpp): set when every
   *  gradient reduce-scatter of every rank has a known layout (packed_). */
  bool pack_ = false;
  /** [rank][op] -> the parameters a gradient reduce-scatter reduces (empty: none). */
  std::vector<std::vector<std::vector<Piece>>> packed_;
  /** (rank, stream) -> the slot a reduce-scatter on that stream packs its bucket into. */
  std::map<std::pair<Rank, StreamId>, SlotId> packing_of_;
  /** (rank, unit) -> this rank's reduced partition of the unit's gradient, micro-steps summed:
   *  the whole gradient's elements from `base` (its primary slice), padded with zeros. */
  struct ReducedSlot {
    SlotId slot = 0;
    std::uint64_t base = 0;
    std::int32_t step = -2;
  };
  std::map<std::pair<Rank, UnitId>, ReducedSlot> reduced_;
};

}  // namespace hpz::real::detail
