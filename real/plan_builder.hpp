// The plan's builder, shared by plan.cpp (slots, the coarse builder's units and the tiny
// model's math) and plan_ranges.cpp (the DeepSpeed builder's schedules, followed by byte
// ranges as the data replay follows them). Internal to hpzlab_real.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "real/pattern.hpp"
#include "real/plan.hpp"
#include "sim/error.hpp"
#include "sim/replay/data_engine.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/replay/replay.hpp"
#include "sim/replay/tiny_model.hpp"
#include "sim/ir/shard.hpp"
#include "sim/time/cost_model.hpp"

namespace hpz::real::detail {

/** Builds one rank's slots and every op's non-collective actions; collectives get theirs once
 *  every member is known (PlanBuilder::collectives). */
class PlanBuilder {
 public:
  PlanBuilder(const Scenario& sc, const Schedule& s, bool model)
      : sc_(sc), s_(s), cost_(sc), by_ranges_(replay::replays_by_ranges(s)) {
    for (const ParamUnit& u : s.units) layouts_.emplace_back(u.numel, s.world_size, s.hpz_size);
    plan_.element_bytes = s.dtype_bytes;
    plan_.model = model;
    if (model) {
      plan_.dims = {sc.training.seq_len * sc.training.micro_batch, sc.model.hidden, sc.model.ffn,
                    sc.model.vocab};
      if (by_ranges_) plan_.llama = replay::llama_dims(sc);
    }
    plan_.ranks.resize(s.ranks.size());
    access_slot_.resize(s.ranks.size());
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
    if (by_ranges_) reduced_gradients();
    if (plan_.model) model_slots();
    mark_touched();
    return std::move(plan_);
  }

 private:
  BufferRole role(Rank r, BufferId b) const { return s_.ranks[r].buffers[b].role; }
  std::uint64_t elems(std::uint64_t bytes) const { return bytes / s_.dtype_bytes; }

  std::uint64_t slot_elements(Rank r, BufferId b) const {
    const Buffer& buf = s_.ranks[r].buffers[b];
    // By ranges, a quantized buffer holds one element per byte (its int8 values).
    if (by_ranges_) return std::max<std::uint64_t>(buf.bytes / esize(r, b), 1);
    // A quantized buffer holds the pass-through values of the whole parameter.
    if (buf.role == BufferRole::kQuantized && buf.unit != kNoUnit) {
      return s_.units[buf.unit].padded_numel;
    }
    return std::max<std::uint64_t>(elems(buf.bytes), 1);
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
    if (by_ranges_) {
      const std::uint64_t es = esize(r, a.buffer);
      return {{r, slot, a.offset / es}, a.bytes / es};
    }
    if (role(r, a.buffer) == BufferRole::kQuantized && a.mode == AccessMode::kRead) {
      return {{r, slot, 0}, plan_.ranks[r].slots[slot].elements};
    }
    if (role(r, a.buffer) == BufferRole::kQuantized) return {{r, slot, 0}, elems(a.bytes)};
    return {{r, slot, elems(a.offset)}, elems(a.bytes)};
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
    for (std::size_t b = 0; b < rs.buffers.size(); ++b) {
      const Buffer& buf = rs.buffers[b];
      if (buf.role != BufferRole::kPrimary || buf.unit == kNoUnit) continue;
      const ShardLayout& lay = layouts_[buf.unit];
      const ElemRange p = lay.primary_slice(r);
      const ElemRange v = lay.valid(p);
      rp.weights.push_back({r, cur[b], v.begin - p.begin});
      rp.weight_n.push_back(v.size());
    }
  }

  void effects(Rank r, const Op& o, PlanOp& po) {
    using K = Action::Kind;
    if (plan_.model && o.kind == OpKind::kKernel) {
      if (plan_.llama ? llama_kernel(r, o, po) : model_kernel(r, o, po)) return;
    }
    if (o.kind == OpKind::kKernel || o.kind == OpKind::kQuantize || o.kind == OpKind::kDequantize) {
      po.spin_s = cost_.op_s(s_, r, o);
      po.gemm = gemm_shape(sc_, o);
    }
    if (by_ranges_ && o.kind != OpKind::kKernel) return effects_by_ranges(r, o, po);
    switch (o.kind) {
      case OpKind::kKernel:
        return kernel(r, o, po);
      case OpKind::kCopy: {
        const int dst = find(r, o, AccessMode::kWrite);
        if (dst < 0) return;
        const Span d = span(r, o, static_cast<std::uint32_t>(dst));
        const int src = find(r, o, AccessMode::kRead);
        if (src < 0) {  // a checkpoint load writes the primary shard from storage
          po.actions.push_back(checkpoint_pattern(r, o.unit, d, false));
          return;
        }
        const Span s = span(r, o, static_cast<std::uint32_t>(src));
        po.actions.push_back({K::kCopy, d.loc, std::min(d.n, s.n), {s.loc}});
        return;
      }
      case OpKind::kQuantize: {
        const int src = find(r, o, AccessMode::kRead);
        const int dst = find(r, o, AccessMode::kWrite);
        if (src < 0 || dst < 0) return;
        const Span s = span(r, o, static_cast<std::uint32_t>(src));
        Span d = span(r, o, static_cast<std::uint32_t>(dst));
        const std::uint64_t cap = plan_.ranks[r].slots[d.loc.slot].elements;
        po.actions.push_back({K::kCopy, {r, d.loc.slot, 0}, std::min(s.n, cap), {s.loc}});
        return;
      }
      case OpKind::kDequantize:
        return dequantize(r, o, po);
      default:
        return;
    }
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
            const UnitId own = s_.ranks[r].buffers[a.buffer].unit;
            x.unit = own != kNoUnit ? own : o.unit;
            to_const(x, false);
          }
          po.actions.push_back(x);
        } else {
          po.actions.push_back({K::kZero, d.loc, d.n, {}});
        }
      }
      return;
    }
    if (o.purpose == Purpose::kBackwardCompute) {
      const int g = find_role(r, o, AccessMode::kWrite, BufferRole::kGradFull);
      const int p = find_role(r, o, AccessMode::kRead, BufferRole::kFull);
      if (g < 0 || p < 0) return;
      const Span gs = span(r, o, static_cast<std::uint32_t>(g));
      const Span ps = span(r, o, static_cast<std::uint32_t>(p));
      Action x{K::kScale, gs.loc, std::min(gs.n, ps.n), {ps.loc}};
      x.scale = 0.125F;
      po.actions.push_back(x);
      return;
    }
    if (o.purpose == Purpose::kOptimizerStep && by_ranges_) return optimizer_by_ranges(r, o, po);
    if (o.purpose == Purpose::kOptimizerStep) {
      const int g = find_role(r, o, AccessMode::kRead, BufferRole::kGradShard);
      const int p = find_role(r, o, AccessMode::kWrite, BufferRole::kPrimary);
      if (g < 0 || p < 0) return;
      const Span gs = span(r, o, static_cast<std::uint32_t>(g));
      const Span ps = span(r, o, static_cast<std::uint32_t>(p));
      Action x{K::kAxpy, ps.loc, std::min(gs.n, ps.n), {gs.loc}};
      x.scale = -0.0625F;
      po.actions.push_back(x);
    }
  }

  // --- The tiny model's real math: each kernel as NumericDomain::kernel computes it ---

  /** The op's first access of `mode` on a buffer of role `want` (unit_sel: 0 any, 1 a unit's
   *  buffer, -1 a buffer of no unit), as NumericDomain::access chooses it; -1 when none. */
  int find_model(Rank r, const Op& o, AccessMode mode, BufferRole want, int unit_sel) const {
    for (std::uint32_t k = 0; k < o.access_count; ++k) {
      const Access& a = s_.ranks[r].accesses[o.access_begin + k];
      const Buffer& b = s_.ranks[r].buffers[a.buffer];
      if (a.mode != mode || b.role != want) continue;
      if ((unit_sel == 1 && b.unit == kNoUnit) || (unit_sel == -1 && b.unit != kNoUnit)) continue;
      return static_cast<int>(k);
    }
    return -1;
  }
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
      const ParamUnit& pu = s_.units[u];
      const std::uint64_t seed = sc_.run.seed + (checkpoint ? replay::kCheckpointSeedOffset : 0);
      if (plan_.llama) {
        plan_.consts.push_back(
            replay::llama_initial_weights(*plan_.llama, llama_param(u).part, seed, u));
      } else {
        plan_.consts.push_back(replay::initial_weights(replay::unit_fn(pu.name), dims(), pu.numel,
                                                       seed, static_cast<int>(u)));
      }
    }
    return static_cast<std::uint32_t>(it->second);
  }
  /** Plan::tokens index of the op's batch. */
  std::int32_t tokens(Rank r, const Op& o) {
    auto [it, fresh] = tokens_of_.try_emplace({r, o.step, o.micro_step}, plan_.tokens.size());
    if (fresh) {
      plan_.tokens.push_back(replay::synthetic_tokens(dims(), sc_.run.seed, static_cast<int>(r),
                                                      o.step, o.micro_step));
    }
    return static_cast<std::int32_t>(it->second);
  }
  replay::TinyDims dims() const {
    return {plan_.dims.seq, plan_.dims.hidden, plan_.dims.ffn, plan_.dims.vocab};
  }

  /** Grows the slot of a whole-slot range to at least `n` elements. The IR sizes some
   *  activations smaller than the math writes (lm_head's output holds [seq x hidden], its
   *  logits are [seq x vocab]); the numeric replay's buffers grow as written, these grow here.
   *  The range takes the slot's final size once every kernel is planned (model_slots). */
  void grow(const Range& x, std::uint64_t n) {
    std::uint64_t& e = plan_.ranks[x.at.rank].slots[x.at.slot].elements;
    e = std::max(e, x.at.elem + n);
  }

  /** The op as a kernel of the tiny model's math; false when it is none (it then spins). */
  bool model_kernel(Rank r, const Op& o, PlanOp& po) {
    using MK = ModelOp::Kind;
    using AM = AccessMode;
    using BR = BufferRole;
    ModelOp& m = po.model;
    const std::uint64_t sh = static_cast<std::uint64_t>(plan_.dims.seq) * plan_.dims.hidden;
    const std::uint64_t sv = static_cast<std::uint64_t>(plan_.dims.seq) * plan_.dims.vocab;
    const auto fn = [&] { return replay::unit_fn(s_.units[o.unit].name); };
    const auto out_n = [&] { return fn() == replay::UnitFn::kHead ? sv : sh; };
    switch (o.purpose) {
      case Purpose::kForwardCompute:
      case Purpose::kRecomputeForward: {
        const int w = find_model(r, o, AM::kRead, BR::kFull, 0);
        const int out = find_model(r, o, AM::kWrite, BR::kActivation, 0);
        if (w < 0 || out < 0) return false;
        m.kind = MK::kForward;
        m.fn = static_cast<std::uint8_t>(fn());
        m.w = part(r, o, w);
        m.out = whole(r, o, out);
        if (const int x = find_model(r, o, AM::kRead, BR::kActivation, 1); x >= 0) {
          m.x = whole(r, o, x);
        }
        if (fn() != replay::UnitFn::kEmbed) grow(m.x, sh);
        grow(m.out, out_n());
        m.tokens = tokens(r, o);
        return true;
      }
      case Purpose::kLossGradient: {
        const int in = find_model(r, o, AM::kRead, BR::kActivation, 0);
        const int out = find_model(r, o, AM::kWrite, BR::kActivation, 0);
        if (in < 0 || out < 0) return false;
        m.kind = MK::kLoss;
        m.x = whole(r, o, in);
        m.out = whole(r, o, out);
        grow(m.x, sv);
        grow(m.out, sv);
        m.tokens = tokens(r, o);
        RankPlan& rp = plan_.ranks[r];
        m.loss = {r, 0, rp.loss_steps.size()};  // the slot is added once every op is planned
        rp.loss_steps.push_back(o.step);
        return true;
      }
      case Purpose::kBackwardCompute: {
        const int w = find_model(r, o, AM::kRead, BR::kFull, 0);
        const int dy = find_model(r, o, AM::kRead, BR::kActivation, -1);
        const int dx = find_model(r, o, AM::kWrite, BR::kActivation, -1);
        const int g = find_model(r, o, AM::kWrite, BR::kGradFull, 0);
        if (w < 0 || dy < 0 || dx < 0 || g < 0) return false;
        m.kind = MK::kBackward;
        m.fn = static_cast<std::uint8_t>(fn());
        m.w = part(r, o, w);
        m.dy = whole(r, o, dy);
        m.out = whole(r, o, dx);
        m.grad = part(r, o, g);
        m.grad_first = m.grad.at.elem;
        m.numel = s_.units[o.unit].numel;
        if (const int x = find_model(r, o, AM::kRead, BR::kActivation, 1); x >= 0) {
          m.x = whole(r, o, x);
        }
        if (fn() != replay::UnitFn::kEmbed) grow(m.x, sh);
        grow(m.dy, out_n());
        grow(m.out, sh);
        if (m.grad_first + m.grad.n > m.numel) m.grad.n = m.numel - std::min(m.numel, m.grad_first);
        m.tokens = tokens(r, o);
        return true;
      }
      case Purpose::kGradNorm: {
        int out = -1;
        for (std::uint32_t k = 0; k < o.access_count; ++k) {
          if (s_.ranks[r].accesses[o.access_begin + k].mode == AM::kWrite) {
            out = static_cast<int>(k);
          } else {
            m.parts.push_back(part(r, o, static_cast<int>(k)));
          }
        }
        if (out < 0) return false;
        m.kind = MK::kGradNorm;
        m.out = whole(r, o, out);
        m.out.n = 1;
        return true;
      }
      case Purpose::kOptimizerStep: {
        const int g = find_model(r, o, AM::kRead, BR::kGradShard, 0);
        const int norm = find_model(r, o, AM::kRead, BR::kScratch, 0);
        const int p_in = find_model(r, o, AM::kRead, BR::kPrimary, 0);
        const int p_out = find_model(r, o, AM::kWrite, BR::kPrimary, 0);
        if (g < 0 || p_in < 0 || p_out < 0) return false;
        m.kind = MK::kAdam;
        m.grad = part(r, o, g);
        m.x = part(r, o, p_in);
        m.out = {part(r, o, p_out).at, m.x.n};
        if (norm >= 0) m.norm = {whole(r, o, norm).at, 1};
        m.scale = 1.0F / static_cast<float>(s_.world_size * sc_.training.grad_accum);
        m.step = o.step;
        // Adam's moments per (rank, unit), as the replay keeps them: slots added at the end.
        adam_state(r, o.unit, po);
        return true;
      }
      default:
        return false;
    }
  }

  replay::LlamaParam llama_param(UnitId u) const {
    return *replay::llama_param(s_.units[u].name);  // every unit checked by model_math_unfit
  }

  /** The op as a kernel of the Llama on DeepSpeed's own schedules, as NumericDomain's
   *  llama_forward, loss and llama_backward compute it; false when it is none (init and the
   *  gradient norm are planned as on the coarse schedules; the optimizer step once every
   *  rank's gradients are known: reduced_gradients). */
  bool llama_kernel(Rank r, const Op& o, PlanOp& po) {
    using MK = ModelOp::Kind;
    using AM = AccessMode;
    using BR = BufferRole;
    ModelOp& m = po.model;
    const auto pass_of = [&] {
      m.tokens = tokens(r, o);
      m.step = o.step;
      m.micro = o.micro_step;
    };
    const auto param = [&](int w) {
      const replay::LlamaParam p = llama_param(o.unit);
      m.layer = p.layer;
      m.part = static_cast<std::uint8_t>(p.part);
      m.w = part(r, o, w);
    };
    switch (o.purpose) {
      case Purpose::kForwardCompute:
      case Purpose::kRecomputeForward: {
        // A kernel with no parameter (the attention's core, the MLP's activation) is done by
        // the parameter kernel that needs it: it spins here.
        const int w = o.unit == kNoUnit ? -1 : find_model(r, o, AM::kRead, BR::kFull, 0);
        if (w < 0) return false;
        m.kind = MK::kLlamaForward;
        m.recompute = o.purpose == Purpose::kRecomputeForward;
        param(w);
        pass_of();
        return true;
      }
      case Purpose::kLossGradient: {
        m.kind = MK::kLlamaLoss;
        pass_of();
        RankPlan& rp = plan_.ranks[r];
        m.loss = {r, 0, rp.loss_steps.size()};  // the slot is added once every op is planned
        rp.loss_steps.push_back(o.step);
        return true;
      }
      case Purpose::kBackwardCompute: {
        const int w = o.unit == kNoUnit ? -1 : find_model(r, o, AM::kRead, BR::kFull, 0);
        const int g = find_model(r, o, AM::kWrite, BR::kGradFull, 0);
        if (w < 0 || g < 0) return false;
        m.kind = MK::kLlamaBackward;
        param(w);
        m.grad = part(r, o, g);
        m.grad_first = m.grad.at.elem;
        m.numel = s_.units[o.unit].numel;
        if (m.grad_first + m.grad.n > m.numel) m.grad.n = m.numel - std::min(m.numel, m.grad_first);
        pass_of();
        return true;
      }
      case Purpose::kGradNorm:
        return model_kernel(r, o, po);
      default:
        return false;
    }
  }

  /** Adam's moments of (rank r, unit u), shared by its steps (slots added by model_slots). */
  void adam_state(Rank r, UnitId u, PlanOp& po) {
    ModelOp& m = po.model;
    auto [it, fresh] = adam_of_.try_emplace({r, u}, adam_ops_.size());
    if (fresh) adam_ops_.push_back({r, m.x.n, {}});
    AdamSlots& st = adam_ops_[it->second];
    st.n = std::max(st.n, m.x.n);
    st.ops.push_back(&po);
    m.fresh_state = fresh;
  }

  /** The slots only the model math has: each rank's loss values and Adam's moments. */
  void model_slots() {
    for (RankPlan& rp : plan_.ranks) {
      rp.losses = static_cast<SlotId>(rp.slots.size());
      rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(rp.loss_steps.size(), 1), true});
      for (PlanOp& po : rp.ops) {
        ModelOp& m = po.model;
        if (m.kind == ModelOp::Kind::kLoss || m.kind == ModelOp::Kind::kLlamaLoss) {
          m.loss.slot = rp.losses;
        }
        // Whole-slot ranges: the slot's size once every kernel has grown it.
        if (m.kind == ModelOp::Kind::kForward || m.kind == ModelOp::Kind::kLoss ||
            m.kind == ModelOp::Kind::kBackward) {
          for (Range* x : {&m.x, &m.out, &m.dy}) {
            if (x->n > 0) x->n = rp.slots[x->at.slot].elements;
          }
        }
      }
    }
    for (const AdamSlots& st : adam_ops_) {
      RankPlan& rp = plan_.ranks[st.rank];
      const auto m = static_cast<SlotId>(rp.slots.size());
      rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(st.n, 1), true});
      rp.slots.push_back({kNoBuffer, std::max<std::uint64_t>(st.n, 1), true});
      for (PlanOp* po : st.ops) {
        po->model.m = {{st.rank, m, 0}, po->model.x.n};
        po->model.v = {{st.rank, m + 1, 0}, po->model.x.n};
      }
    }
  }

  void dequantize(Rank r, const Op& o, PlanOp& po) {
    using K = Action::Kind;
    const int src = find(r, o, AccessMode::kRead);
    const int dst = find(r, o, AccessMode::kWrite);
    if (src < 0 || dst < 0) return;
    const Span s = span(r, o, static_cast<std::uint32_t>(src));
    const Span d = span(r, o, static_cast<std::uint32_t>(dst));
    const Access& da = s_.ranks[r].accesses[o.access_begin + static_cast<std::uint32_t>(dst)];
    const BufferRole dr = role(r, da.buffer);
    const std::uint64_t src_cap = plan_.ranks[r].slots[s.loc.slot].elements;
    if (dr == BufferRole::kQuantized) {
      const std::uint64_t cap = plan_.ranks[r].slots[d.loc.slot].elements;
      po.actions.push_back({K::kCopy, {r, d.loc.slot, 0}, std::min(src_cap, cap), {s.loc}});
      return;
    }
    if (dr == BufferRole::kFull) {
      const std::uint64_t n = d.loc.elem < src_cap ? std::min(d.n, src_cap - d.loc.elem) : 0;
      po.actions.push_back({K::kCopy, d.loc, n, {{r, s.loc.slot, d.loc.elem}}});
      return;
    }
    // qgZ's last step: this rank's slice of the reduced gradient (+ what accumulated before).
    const std::uint64_t from = layouts_[o.unit].primary_slice(r).begin + d.loc.elem;
    const std::uint64_t n = from < src_cap ? std::min(d.n, src_cap - from) : 0;
    Action x{K::kCopy, d.loc, n, {{r, s.loc.slot, from}}};
    const int acc = find_role(r, o, AccessMode::kRead, BufferRole::kGradShard);
    if (acc >= 0) {
      x.kind = K::kSum;
      x.src.push_back(span(r, o, static_cast<std::uint32_t>(acc)).loc);
    }
    po.actions.push_back(x);
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
    if (by_ranges_) return receive_by_ranges(inst, m, d, in);
    if (o.kind == OpKind::kAllGather) return all_gather(inst, m, d, in);
    reduce(inst, m, d, in);
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

  void all_gather(const Instance& inst, std::size_t m, const Span& d,
                  const std::vector<std::vector<Span>>& in) {
    const auto [r, i] = inst.members[m];
    const Op& o = s_.ranks[r].ops[i];
    PlanOp& po = plan_.ranks[r].ops[i];
    const ShardLayout& lay = layouts_[o.unit];
    const bool hpz = s_.groups[o.group].kind == GroupKind::kHpz;
    auto slice = [&](std::size_t k) {
      return hpz ? lay.secondary_slice(static_cast<int>(k))
                 : lay.primary_slice(inst.members[k].first);
    };
    for (std::size_t k = 0; k < inst.members.size(); ++k) {
      const ElemRange v = lay.valid(slice(k));
      if (v.empty() || in[k].empty()) continue;
      po.actions.push_back({Action::Kind::kCopy,
                            {r, d.loc.slot, v.begin},
                            std::min(v.size(), in[k][0].n),
                            {in[k][0].loc}});
    }
    // NCCL's AllGather puts member k's `count` elements at recv + k * count: the slices must be
    // that layout, every member must send `count` and the receive slot must hold them all.
    const std::uint64_t count = slice(0).size();
    bool fits = count > 0 && d.loc.elem + inst.members.size() * count <=
                                 plan_.ranks[r].slots[d.loc.slot].elements;
    for (std::size_t k = 0; k < inst.members.size() && fits; ++k) {
      fits = slice(k).begin == slice(0).begin + k * count && !in[k].empty() && in[k][0].n >= count;
    }
    if (fits) {
      po.native.kind = NativeCollective::Kind::kAllGather;
      po.native.recv = {r, d.loc.slot, slice(0).begin};
      po.native.count = count;
    }
    const Access& da =
        s_.ranks[r]
            .accesses[o.access_begin + static_cast<std::uint32_t>(find(r, o, AccessMode::kWrite))];
    if (role(r, da.buffer) == BufferRole::kFull) mark_probe(po, d);
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

  void reduce(const Instance& inst, std::size_t m, const Span& d,
              const std::vector<std::vector<Span>>& in) {
    using K = Action::Kind;
    const auto [r, i] = inst.members[m];
    const Op& o = s_.ranks[r].ops[i];
    PlanOp& po = plan_.ranks[r].ops[i];
    RankPlan& rp = plan_.ranks[r];
    Action x{K::kSum, d.loc, d.n, {}};
    NativeCollective& nat = po.native;
    std::vector<Loc> local;  // what this rank adds after the native call
    if (o.kind == OpKind::kReduceScatter) {
      const ElemRange own = layouts_[o.unit].primary_slice(r);
      const std::uint64_t from = own.begin + d.loc.elem;
      for (const auto& snd : in) {
        if (snd.empty()) return;
        Loc l = snd[0].loc;
        l.elem += from;
        x.src.push_back(l);
        x.n = std::min(x.n, snd[0].n > from ? snd[0].n - from : 0);
      }
      if (in[m].size() > 1) {  // the shard from earlier micro-steps
        x.src.push_back(in[m][1].loc);
        local.push_back(in[m][1].loc);
      }
      // NCCL hands member k the k-th `count` elements of the summed send.
      const std::uint64_t count = own.size();
      if (d.loc.elem == 0 && own.begin == m * count && x.n <= count &&
          in[m][0].n >= inst.members.size() * count) {
        nat.kind = NativeCollective::Kind::kReduceScatter;
        nat.count = count;
      }
    } else {  // AllReduce, AllToAll (qgZ, modelled as a sum of the whole vectors)
      if (role(r, s_.ranks[r]
                      .accesses[o.access_begin +
                                static_cast<std::uint32_t>(find(r, o, AccessMode::kWrite))]
                      .buffer) == BufferRole::kQuantized) {
        x.dst.elem = 0;
      }
      for (const auto& snd : in) {
        if (snd.empty()) return;
        x.src.push_back(snd[0].loc);
        x.n = std::min(x.n, snd[0].n);
      }
      x.n = std::min(x.n, rp.slots[x.dst.slot].elements - x.dst.elem);
      nat.kind = NativeCollective::Kind::kAllReduce;
      nat.count = x.n;
    }
    finish_reduce(r, o.stream, po, std::move(x), std::move(local));
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
      const SlotId st = by_ranges_ ? staging_for(r, stream, x.n) : rp.staging;
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
  void reduced_gradients();
  // The gradient reduction through its reduce-scatters (plan_gradients.cpp).
  void packed_reductions();
  bool find_packing(Rank r, std::vector<std::vector<Piece>>& out) const;
  void reduce_scatter_packed(const Instance& inst, std::size_t m, const Span& d);
  SlotId packing_slot(Rank r, StreamId stream, std::uint64_t elements);
  Span reduced_gradient(Rank r, UnitId u, const Span& at) const;
  void receive_by_ranges(const Instance& inst, std::size_t m, const Span& d,
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
        touch(po.model);
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
    std::vector<PlanOp*> ops;
  };
  std::map<std::pair<UnitId, bool>, std::size_t> const_of_;
  std::map<std::tuple<Rank, int, int>, std::size_t> tokens_of_;
  std::map<std::pair<Rank, UnitId>, std::size_t> adam_of_;
  std::vector<AdamSlots> adam_ops_;
  // By ranges.
  const bool by_ranges_;
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
