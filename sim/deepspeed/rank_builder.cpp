// RankBuilder's construction, its IR emission (ops, events, streams, collectives, buffers), the
// kernels and hooks of the hook program, and the step loop.
#include "sim/deepspeed/rank_builder.hpp"

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

WorldIndex::WorldIndex(const Schedule& s, const Model& md) {
  std::unordered_map<std::string_view, LabelId> label_of;
  for (std::size_t i = 0; i < s.labels.size(); ++i) {
    label_of.emplace(s.labels[i], static_cast<LabelId>(i));  // keeps the first
  }
  for (const DsModule& m : md.modules) {
    const auto it = label_of.find(m.path);
    module_label.push_back(it != label_of.end() ? it->second
                                                : static_cast<LabelId>(s.labels.size()));
  }
  // Counted, then placed: each rank's groups in group order, so ascending.
  const auto world = static_cast<std::size_t>(s.world_size);
  group_at.assign(world + 1, 0);
  for (const Group& g : s.groups) {
    for (const Rank r : g.ranks) ++group_at[static_cast<std::size_t>(r) + 1];
  }
  for (std::size_t r = 0; r < world; ++r) group_at[r + 1] += group_at[r];
  groups.resize(group_at[world]);
  std::vector<std::size_t> next(group_at.begin(), group_at.end() - 1);
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    for (const Rank r : s.groups[g].ranks) {
      groups[next[static_cast<std::size_t>(r)]++] = static_cast<GroupId>(g);
    }
  }
}

RankBuilder::RankBuilder(const Scenario& sc, const VersionRules& v, const Model& md,
                         const Walk& walk, const WorldIndex& index, Schedule& s, Rank r)
    : sc_(sc),
      v_(v),
      offload_(param_offload(sc)),
      md_(md),
      walk_(walk),
      s_(s),
      rank_(r),
      world_(s.world_size),
      hpz_(s.hpz_size),
      dt_(s.dtype_bytes),
      module_label_(index.module_label) {
  for (const GroupId g : index.groups_of(r)) {
    const Group& grp = s_.groups[static_cast<std::size_t>(g)];
    if (grp.name == "world") world_group_ = g;
    if (grp.name == "world1") grad_group_ = g;
    if (grp.kind == GroupKind::kHpz) hpz_group_ = g;
    if (grp.kind == GroupKind::kIntraNode) intra_group_ = g;
    if (grp.kind == GroupKind::kInterNode) inter_group_ = g;
  }
  if (v.reset_at_forward_start) trace_ = Trace::kInvalid;
  for (const DsParam& p : md_.params) layouts_.emplace_back(p.numel, world_, hpz_);
  ps_.resize(md_.params.size());
  for (int p = 0; p < static_cast<int>(md_.params.size()); ++p) {
    if (!md_.params[p].orphan) optimized_.push_back(p);
  }
  sub_groups_ = make_sub_groups(make_param_groups());
  for (const auto& g : sub_groups_) fp16_order_.insert(fp16_order_.end(), g.begin(), g.end());
  out_.rank = r;
  out_.streams.push_back({"S0"});
}

Op& RankBuilder::push(OpKind kind, StreamId s, Purpose p, std::initializer_list<Access> acc) {
  return push(kind, s, p, std::span<const Access>(acc.begin(), acc.size()));
}

Op& RankBuilder::push(OpKind kind, StreamId s, Purpose p, std::span<const Access> acc) {
  Op op;
  op.kind = kind;
  op.stream = s;
  op.phase = phase_;
  op.purpose = p;
  op.step = step_;
  op.micro_step = micro_;
  op.unit = unit_;
  op.label = label_;
  op.access_begin = static_cast<std::uint32_t>(out_.accesses.size());
  for (const Access& a : acc) {
    if (a.bytes > 0) out_.accesses.push_back(a);
  }
  op.access_count = static_cast<std::uint32_t>(out_.accesses.size() - op.access_begin);
  commit();
  pending_ = op;
  has_pending_ = true;
  return pending_;
}

void RankBuilder::commit() {
  if (!has_pending_) return;
  has_pending_ = false;
  if (matcher_) {
    if (matcher_->add(pending_)) return;
    // The first op unlike first's: from here on the rank keeps its own.
    std::vector<Op>& ops = out_.ops.mut();
    ops = matcher_->prefix();
    ops.reserve(std::max(matcher_->like_size(), ops.size() + 1));
    matcher_.reset();
  }
  out_.ops.mut().push_back(pending_);
}

EventId RankBuilder::record(StreamId s, Purpose p) {
  Op& op = push(OpKind::kEventRecord, s, p);
  op.event = next_event_++;
  return op.event;
}

void RankBuilder::wait(StreamId s, EventId e, Purpose p) {
  push(OpKind::kStreamWaitEvent, s, p).event = e;
}

// torch.cuda.Stream.wait_stream: an event recorded on `other`, waited for on `waiter`.
// On the same stream it orders nothing; the recorder logs nothing for it either.
void RankBuilder::wait_stream(StreamId waiter, StreamId other, Purpose p) {
  if (waiter == other) return;
  wait(waiter, record(other, p), p);
}

// PG: one NCCL stream per process group, made at the group's first collective.
StreamId RankBuilder::nccl_stream(GroupId g) {
  auto it = nccl_.find(g);
  if (it != nccl_.end()) return it->second;
  const Group& grp = s_.groups[g];
  std::string name = grp.kind == GroupKind::kHpz         ? "nccl.hpz"
                     : grp.kind == GroupKind::kIntraNode ? "nccl.intra_node"
                     : grp.kind == GroupKind::kInterNode ? "nccl.inter_node"
                                                         : "nccl.world";
  if (grp.name == "world1") name = "nccl.world.clone_world_group";
  out_.streams.push_back({name});
  const auto id = static_cast<StreamId>(out_.streams.size() - 1);
  nccl_.emplace(g, id);
  return id;
}

// PG's collective(): the NCCL stream waits for an event on the caller's stream, runs the
// collective, and records its end event, which the work handle's wait() waits for.
EventId RankBuilder::collective(OpKind kind, GroupId g, std::uint64_t bytes,
                                std::vector<Access> acc) {
  const StreamId ns = nccl_stream(g);
  const Purpose hp = (purpose_ == Purpose::kParamFetch || purpose_ == Purpose::kPrefetch)
                         ? Purpose::kNcclHandshake
                         : purpose_;
  wait(ns, record(current_, hp), hp);
  Op& op = push(kind, ns, purpose_);
  op.group = g;
  op.comm_bytes = bytes;
  op.access_begin = static_cast<std::uint32_t>(out_.accesses.size());
  for (const Access& a : acc) {
    if (a.bytes > 0) out_.accesses.push_back(a);
  }
  op.access_count = static_cast<std::uint32_t>(out_.accesses.size() - op.access_begin);
  return record(ns, hp);
}

BufferId RankBuilder::buffer(std::string name, BufferRole role, UnitId unit, std::uint64_t bytes) {
  out_.buffers.push_back({std::move(name), role, unit, bytes, false});
  return static_cast<BufferId>(out_.buffers.size() - 1);
}

void RankBuilder::alloc(BufferId b, StreamId s, Purpose p) {
  // offload_param: torch.empty(device="cpu") (and pin_memory()) is the host's; no stream.
  if (out_.buffers[b].on_host) s = kHostStream;
  Op& op = push(OpKind::kAlloc, s, p);
  op.buffer = b;
  op.fill = static_cast<std::uint8_t>(sc_.run.fill);
}

void RankBuilder::free(BufferId b, StreamId s, Purpose p) {
  if (out_.buffers[b].on_host) s = kHostStream;  // offload_param: host memory, see alloc()
  push(OpKind::kFree, s, p).buffer = b;
}

// The meaningful bytes of `slice` of parameter p, in a buffer that holds the slice (in_full:
// the whole parameter, offsets from its start).
Access RankBuilder::part(int p, BufferId b, ElemRange slice, AccessMode mode, bool in_full) const {
  const ElemRange v = layouts_[p].valid(slice);
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const std::uint64_t off = in_full ? v.begin : v.begin - slice.begin;
  return {b, mode, off * dt, v.size() * dt};
}

void RankBuilder::kernel(int module, bool backward) {
  const DsModule& m = md_.modules[module];
  const double tokens =
      static_cast<double>(sc_.training.micro_batch) * sc_.training.seq_len * m.token_share;
  const double h = sc_.model.hidden;
  Op* op = nullptr;
  const Purpose p = backward ? Purpose::kBackwardCompute : Purpose::kForwardCompute;
  if (!m.params.empty()) {
    // One kernel for the module: it reads its parameters (weight and bias) and, backward,
    // writes their gradients.
    std::vector<Access> acc;
    double n = 0, matrix = 0;
    for (const int q : m.params) {
      const ElemRange all{0, md_.params[q].numel};
      acc.push_back(part(q, ps_[q].full, all, AccessMode::kRead, true));
      if (backward) {
        ParamState& st = ps_[q];
        if (st.grad == kNoBuffer) {
          st.grad = buffer(md_.params[q].name + ".grad", BufferRole::kGradFull, q,
                           md_.params[q].numel * dt_);
        }
        acc.push_back(part(q, st.grad, all, AccessMode::kWrite, true));
      }
      n += static_cast<double>(md_.params[q].numel);
      if (md_.params[q].rows > 0) matrix += static_cast<double>(md_.params[q].numel);
    }
    op = &push(OpKind::kKernel, current_, p, std::span<const Access>(acc));
    if (m.kind == ModKind::kLinear || m.kind == ModKind::kHead) {
      op->flops = 2 * tokens * matrix * (backward ? 2 : 1);
    }
    op->mem_bytes = n * dt_ + 2 * tokens * h * dt_;
  } else {
    op = &push(OpKind::kKernel, current_, p);
    op->mem_bytes = 2 * tokens * h * dt_;
  }
  if (m.attn_core) {
    // Attention scores (over the query/key heads' width) and their product with V (over the
    // value heads'); DeepSeek-V2's heads have nope + rope query/key and v_head_dim value width.
    const ModelConfig& c = sc_.model;
    const double qk = c.kv_lora_rank > 0
                          ? static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim) * c.heads
                      : c.head_dim > 0 ? static_cast<double>(c.head_dim) * c.heads
                                       : h;
    const double v = c.kv_lora_rank > 0 ? static_cast<double>(c.v_head_dim) * c.heads : qk;
    op->flops += 2 * tokens * sc_.training.seq_len * (qk + v) * (backward ? 2 : 1);
  }
}

void RankBuilder::run_hook(const Hook& h) {
  const bool bwd_phase = phase_ == Phase::kBackward;
  switch (h.ev) {
    case Ev::kPreFwd:
      // fetch_sub_module(forward=True) (PO:452); v0.13.1 passes torch.is_grad_enabled().
      // v0.10.0-v0.10.1 pass forward=True (PO:494 at v0.10.0).
      fetch_sub_module(h.module, v_.secondary_only_backward && v_.forward_passes_grad_enabled
                                     ? h.grad_enabled
                                     : true);
      break;
    case Ev::kPostFwd:
      purpose_ = Purpose::kParamRelease;
      release_sub_module(h.module);
      break;
    case Ev::kPreBwd:
      // COORD:340-341 at 0.19.8: a backward fetch records the module, once, in
      // __active_backward_submodules (insertion order).
      if (std::find(active_backward_.begin(), active_backward_.end(), h.module) ==
          active_backward_.end()) {
        active_backward_.push_back(h.module);
      }
      fetch_sub_module(h.module, false);
      break;
    case Ev::kPostBwd:
      std::erase(active_backward_, h.module);  // COORD:524
      purpose_ = Purpose::kParamRelease;
      release_sub_module(h.module);
      break;
    case Ev::kFwdKernel:
      forward_kernel(h.module, bwd_phase);
      break;
    case Ev::kBwdKernel:
      backward_kernel(h.module);
      break;
    case Ev::kLeafGradHook:
      // reduce_leaf_module_grads (S3:1261-1274 at v0.18.2): every parameter below the leaf in
      // fp16_groups order; a parameter without a gradient would get zeros_like first, which
      // transformers 4.51.3's blocks never need (every expert runs).
      for (const int p : fp16_order_) {
        if (md_.params[p].leaf == h.module) grad_ready(p);
      }
      break;
    case Ev::kHostSync:
      push(OpKind::kHostStreamSync, current_,
           bwd_phase ? Purpose::kRecomputeForward : Purpose::kForwardCompute);
      break;
    case Ev::kLoss:
      push(OpKind::kKernel, current_, Purpose::kLossGradient).mem_bytes =
          static_cast<double>(sc_.training.micro_batch) * sc_.training.seq_len * sc_.model.vocab *
          4.0;
      phase_ = Phase::kBackward;
      // v0.10.0 logs it only off the accumulation boundary (ENG:1881-1884 at v0.10.0).
      if (v_.loss_item_in_backward &&
          !(v_.loss_item_off_boundary_only && micro_ == sc_.training.grad_accum - 1)) {
        push(OpKind::kHostStreamSync, current_, Purpose::kStepSync);
      }
      break;
  }
}

// A module's forward kernel; in the backward phase, a recompute's.
void RankBuilder::forward_kernel(int module, bool recompute) {
  const LabelId saved = label_;
  label_ = kNoLabel;
  const std::vector<int>& own = md_.modules[module].params;
  unit_ = own.empty() ? kNoUnit : own.front();
  kernel(module, false);
  if (recompute) pending_.purpose = Purpose::kRecomputeForward;  // the kernel's op, last issued
  unit_ = kNoUnit;
  label_ = saved;
}

// A module's backward kernel, then its parameters' gradient hooks.
void RankBuilder::backward_kernel(int module) {
  const std::vector<int>& own = md_.modules[module].params;
  unit_ = own.empty() ? kNoUnit : own.front();
  kernel(module, true);
  unit_ = kNoUnit;
  // A tied weight's AccumulateGrad runs once, after its last use in the backward (the
  // embedding): autograd sums both gradients before it (torch/csrc/autograd/input_buffer).
  // Weight and bias in the order their AccumulateGrad nodes run (DsModule::bias_grad_first).
  // Below a z3 leaf no parameter has a gradient hook of its own (S3:1252-1255 at v0.18.2).
  if (!(md_.tied && module == md_.head) && !md_.modules[module].under_leaf) {
    if (md_.modules[module].bias_grad_first && own.size() == 2) {
      grad_ready(own[1]);
      grad_ready(own[0]);
    } else {
      for (const int p : own) grad_ready(p);
    }
  }
}

RankBuilder& RankBuilder::follow(const RankSchedule& first) {
  matcher_.emplace(first.ops);
  out_.accesses.reserve(first.accesses.size());
  out_.buffers.mut().reserve(first.buffers.size());
  return *this;
}

RankSchedule RankBuilder::build() {
  // Streams as DeepSpeed makes them: S_ag in DeepSpeedZeRoOffload (PO:138-139, the default
  // stream without overlap_comm), S_rs in the stage-3 optimizer (S3:227-228).
  sag_ = s0_;
  if (sc_.zero.overlap_comm) {
    out_.streams.push_back({"S_ag"});
    sag_ = static_cast<StreamId>(out_.streams.size() - 1);
  }
  init();
  srs_ = s0_;  // S3:227-228: the default stream without overlap_comm
  if (sc_.zero.overlap_comm) {
    out_.streams.push_back({"S_rs"});
    srs_ = static_cast<StreamId>(out_.streams.size() - 1);
  }
  if (sc_.run.step_stream == "side") {
    out_.streams.push_back({"S_step"});
    sstep_ = static_cast<StreamId>(out_.streams.size() - 1);
  }
  if (sc_.run.load == "checkpoint") load_checkpoint();
  std::uint64_t total = 0;
  for (const DsParam& p : md_.params) total += p.numel;
  std::uint64_t shards = 0;  // every gradient's padded chunk (reduce_ipg)
  for (const ShardLayout& l : layouts_) shards += l.shard_numel();
  // DeepSpeed's bucket holds reduce_bucket_size elements (S3:540); no more than the model's are
  // ever written, but where 0.17.2's count runs on from step to step (bucket_count_never_reset).
  const auto bucket = static_cast<std::uint64_t>(sc_.zero.reduce_bucket_size);
  ipg_buffer_ = buffer("ipg_bucket", BufferRole::kScratch, kNoUnit,
                       (v_.bucket_count_never_reset ? bucket : std::min(total, bucket)) * dt_);
  grad_shard_ = buffer("grad_partitions", BufferRole::kGradShard, kNoUnit, shards * dt_);
  const std::vector<Hook> hooks = micro_step_hooks(md_, walk_);
  for (step_ = 0; step_ < sc_.run.steps; ++step_) {
    // Every micro-batch: forward, backward (its gradients reduced into the partitions every
    // micro-step, engine.allreduce_gradients: "ZeRO stage >= 2 communicates during non gradient
    // accumulation boundaries as well"), engine.step(), which steps the optimizer only at the
    // accumulation boundary (engine.py is_gradient_accumulation_boundary).
    for (micro_ = 0; micro_ < sc_.training.grad_accum; ++micro_) {
      micro_step(hooks);
    }
    micro_ = 0;
    phase_ = Phase::kOptimizer;
    push(OpKind::kHostStreamSync, s0_, Purpose::kStepSync);  // the script's loss.item()
  }
  commit();
  if (matcher_ && matcher_->complete()) {
    out_.ops = matcher_->shared();
  } else if (matcher_) {
    out_.ops.mut() = matcher_->prefix();  // first's ops run on past ours
  }
  matcher_.reset();
  out_.accesses.shrink_to_fit();  // a large world keeps every rank's: no growth slack
  return std::move(out_);
}

namespace {
/** ThroughputTimer's start_step (deepspeed/utils/timer.py:203 at v0.13.4). */
constexpr int kThroughputTimerStartStep = 2;
}  // namespace

// One micro-batch: forward, backward, the last bucket reduced, and at the accumulation boundary
// the optimizer's step.
void RankBuilder::micro_step(const std::vector<Hook>& hooks) {
  phase_ = Phase::kForward;
  // The training script's batch.to(device) before the forward: a pageable host-to-device
  // copy that synchronizes the current stream (the HF Trainer's and accelerate's default;
  // the recorder's --batch-copy blocking).
  push(OpKind::kHostStreamSync, s0_, Purpose::kForwardCompute);
  // run.step_stream = "side": `side.wait_stream(current_stream())`, then forward and
  // engine.backward under `torch.cuda.stream(side)`.
  if (sstep_ != s0_) wait_stream(sstep_, s0_, Purpose::kForwardCompute);
  // engine.forward starts the throughput timer when it has no dataloader of its own (the HF
  // Trainer's, accelerate's and a plain loop's case: engine.py:1846-1847 at v0.13.4); from
  // global step 2 (start_step=2) its start() synchronizes the device (utils/timer.py:236-241;
  // `if self.config.synchronized`, default true, from v0.14). Seen in recordings of 3 steps.
  if (step_ >= kThroughputTimerStartStep) {
    push(OpKind::kHostDeviceSync, kHostStream, Purpose::kForwardCompute);
  }
  current_ = sstep_;
  if (v_.reset_at_forward_start) {
    purpose_ = Purpose::kForwardCompute;
    reset_step();
  }
  for (const Hook& h : hooks) run_hook(h);
  // The optimizer's backward() ends with reset_step (S3:2215); then the engine's gradient
  // epilogue reduces the last bucket and drains S_rs (S3:1082-1088).
  current_ = sstep_;
  if (!v_.reset_at_forward_start) reset_step();
  reduce_ipg();
  phase_ = Phase::kBackward;
  push(OpKind::kHostStreamSync, srs_, Purpose::kBackwardCompute);
  if (v_.release_backward_leftovers) release_backward_leftovers();
  active_backward_.clear();
  // The script's `current_stream().wait_stream(side)` before engine.step(), on S0.
  if (sstep_ != s0_) wait_stream(s0_, sstep_, Purpose::kBackwardCompute);
  current_ = s0_;
  if (micro_ == sc_.training.grad_accum - 1) optimizer_step();
  // engine.step() stops the throughput timer after the optimizer's step (engine.py:2173 at
  // v0.13.4), every micro-step; once a start() has timed (start_time > 0, from global step 2)
  // stop() synchronizes the device too (utils/timer.py:252).
  if (step_ >= kThroughputTimerStartStep) {
    push(OpKind::kHostDeviceSync, kHostStream, Purpose::kOptimizerStep);
  }
}

}  // namespace hpz::deepspeed
