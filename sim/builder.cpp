#include "sim/builder.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "sim/deepspeed_builder.hpp"
#include "sim/error.hpp"
#include "sim/model_shape.hpp"
#include "sim/ir/shard.hpp"

namespace hpz {
namespace {

// Stream indices of every rank.
constexpr StreamId kS0 = 0;     // compute stream
constexpr StreamId kSag = 1;    // DeepSpeed's all-gather stream
constexpr StreamId kSnccl = 2;  // NCCL's internal stream for the gathers
constexpr StreamId kSrs = 3;    // reduce-and-partition stream

/** One module invocation in the recorded trace of a micro-step. */
struct TraceEntry {
  enum class Kind { kForward, kRecompute, kBackward };
  UnitId unit;
  Kind kind;
};

/** Bytes of a block-quantized tensor: `bits` per element plus one fp32 scale per 4,096. */
std::uint64_t quantized_bytes(std::uint64_t numel, int bits) {
  return numel * bits / 8 + (numel + 4095) / 4096 * 4;
}

/** What is the same for every rank: units, shard layouts, groups and the trace. */
struct BuildContext {
  const Scenario& sc;
  int world;
  int hpz;
  int dt;  // bytes per element
  std::vector<ParamUnit> units;
  std::vector<ShardLayout> layouts;
  std::vector<UnitId> order;     // partitioned units in forward module order
  std::vector<UnitId> input_of;  // by unit: the unit whose activation it reads (kNoUnit: none)
  std::vector<TraceEntry> trace;
  std::vector<Group> groups;
  GroupId world_group = 0;
  std::vector<GroupId> hpz_group_of;    // by rank
  std::vector<GroupId> intra_group_of;  // by rank
  std::vector<GroupId> inter_group_of;  // by rank
  double act_bytes = 0;                 // one activation checkpoint, bytes

  explicit BuildContext(const Scenario& s);
  void add_units();
  void add_unit(const std::string& name, int layer, std::uint64_t numel, double fwd_flops);
  void add_groups();
  void add_trace();
};

BuildContext::BuildContext(const Scenario& s)
    : sc(s),
      world(s.cluster.world_size()),
      hpz(s.zero.zero_hpz_partition_size),
      dt(s.training.dtype_bytes()) {
  act_bytes =
      static_cast<double>(s.training.seq_len) * s.training.micro_batch * s.model.hidden * dt;
  add_units();
  input_of.assign(units.size(), kNoUnit);
  for (std::size_t i = 1; i < order.size(); ++i) input_of[order[i]] = order[i - 1];
  add_groups();
  add_trace();
}

void BuildContext::add_unit(const std::string& name, int layer, std::uint64_t numel,
                            double fwd_flops) {
  const ShardLayout layout(numel, world, hpz);
  ParamUnit u;
  u.name = name;
  u.layer = layer;
  u.numel = numel;
  u.padded_numel = layout.padded_numel();
  u.shard_numel = layout.shard_numel();
  u.secondary_numel = hpz > 1 ? layout.secondary_numel() : 0;
  u.forward_flops = fwd_flops;
  u.persistent = static_cast<std::int64_t>(numel) <= sc.zero.stage3_param_persistence_threshold;
  if (!u.persistent) order.push_back(static_cast<UnitId>(units.size()));
  units.push_back(std::move(u));
  layouts.push_back(layout);
}

void BuildContext::add_units() {
  const auto& m = sc.model;
  const double tokens = static_cast<double>(sc.training.seq_len) * sc.training.micro_batch;
  const auto count = [](double n) { return static_cast<std::uint64_t>(n); };
  // Attention scores and values: 2 matmuls of seq x seq x (heads x head dim) per sequence.
  const double attn_core = 4.0 * sc.training.seq_len * tokens * attention_width(m);
  const double norm_flops = 4.0 * tokens * m.hidden;
  add_unit("embed", -1, count(embedding_params(m)), 0.0);
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "layers." + std::to_string(l);
    const LayerShape shape = layer_shape(m, l);
    add_unit(p + ".input_norm", l, count(shape.input_norm), norm_flops);
    add_unit(p + ".attn", l, count(shape.attn), 2.0 * tokens * shape.attn + attn_core);
    if (shape.post_norm > 0) {
      add_unit(p + ".post_norm", l, count(shape.post_norm), norm_flops);
    }
    add_unit(p + ".mlp", l, count(shape.mlp), 2.0 * tokens * shape.mlp);
    // Each routed expert is a module of its own, fetched at its own hook (each runs on the
    // tokens routed to it: experts_per_token / experts of them, on average).
    const double routed = shape.experts > 0 ? tokens * m.experts_per_token / shape.experts : 0;
    for (int e = 0; e < shape.experts; ++e) {
      add_unit(p + ".mlp.experts." + std::to_string(e), l, count(shape.expert),
               2.0 * routed * shape.expert);
    }
  }
  add_unit("final_norm", -1, count(final_norm_params(m)), norm_flops);
  // A tied output layer is the embedding's weight, gathered again at lm_head's hook as DeepSpeed
  // gathers it; the builder gives it a unit of its own (parameter_count counts it once).
  const double head = static_cast<double>(m.vocab) * m.hidden;
  add_unit("lm_head", -1, count(head), 2.0 * tokens * head);
}

void BuildContext::add_groups() {
  auto add = [this](std::string name, GroupKind kind, std::vector<Rank> ranks) {
    groups.push_back({std::move(name), kind, std::move(ranks)});
    return static_cast<GroupId>(groups.size() - 1);
  };
  std::vector<Rank> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  world_group = add("world", GroupKind::kWorld, all);
  hpz_group_of.assign(world, kNoGroup);
  intra_group_of.assign(world, kNoGroup);
  inter_group_of.assign(world, kNoGroup);
  if (hpz > 1) {
    for (int first = 0; first < world; first += hpz) {
      std::vector<Rank> members(all.begin() + first, all.begin() + first + hpz);
      const GroupId g = add("hpz" + std::to_string(first / hpz), GroupKind::kHpz, members);
      for (Rank r : members) hpz_group_of[r] = g;
    }
  }
  if (sc.zero.zero_quantized_gradients) {
    const int gpn = sc.cluster.gpus_per_node;
    for (int n = 0; n < sc.cluster.nodes; ++n) {
      std::vector<Rank> members(all.begin() + n * gpn, all.begin() + (n + 1) * gpn);
      const GroupId g = add("node" + std::to_string(n), GroupKind::kIntraNode, members);
      for (Rank r : members) intra_group_of[r] = g;
    }
    for (int local = 0; local < gpn; ++local) {
      std::vector<Rank> members;
      for (int n = 0; n < sc.cluster.nodes; ++n) members.push_back(n * gpn + local);
      const GroupId g = add("local" + std::to_string(local), GroupKind::kInterNode, members);
      for (Rank r : members) inter_group_of[r] = g;
    }
  }
}

void BuildContext::add_trace() {
  using K = TraceEntry::Kind;
  for (UnitId u : order) trace.push_back({u, K::kForward});
  // Backward visits layers in reverse; gradient checkpointing recomputes a decoder layer's
  // forward (all its modules) right before that layer's backward.
  for (std::size_t i = order.size(); i-- > 0;) {
    const UnitId u = order[i];
    const int layer = units[u].layer;
    const bool last_of_layer = i + 1 == order.size() || units[order[i + 1]].layer != layer;
    if (sc.training.grad_checkpointing && layer >= 0 && last_of_layer) {
      std::size_t j = i;
      while (j > 0 && units[order[j - 1]].layer == layer) --j;
      for (std::size_t k = j; k <= i; ++k) trace.push_back({order[k], K::kRecompute});
    }
    trace.push_back({u, K::kBackward});
  }
}

/** Emits the operations of one rank. */
class RankEmitter {
 public:
  RankEmitter(const BuildContext& ctx, Rank rank) : c_(ctx), rank_(rank) {
    ag_ = c_.sc.zero.overlap_comm ? kSag : kS0;
    rs_ = c_.sc.zero.overlap_comm ? kSrs : kS0;
    out_.rank = rank;
    out_.streams = {{"S0"}, {"S_ag"}, {"S_nccl"}, {"S_rs"}};
  }

  RankSchedule emit();

 private:
  /** The buffers of one unit on this rank. */
  struct UnitBuffers {
    BufferId primary, secondary, full, stage, q_shard, q_full, grad, grad_shard, q_grad, q_grad2;
  };
  /** Where one unit stands on this rank. */
  struct UnitState {
    bool available = false;              // full parameter gathered or in flight
    bool inflight = false;               // gather launched, not yet waited for
    bool secondary = false;              // secondary shard exists
    EventId secondary_ready = kNoEvent;  // fix B's event after the copy
    EventId gathered = kNoEvent;         // NCCL stream event after the gather
    int fetched_for = -1;                // latest trace position the prefetcher popped for it
  };

  BufferId buffer(std::string name, BufferRole role, UnitId unit, std::uint64_t bytes,
                  bool on_host = false);
  /** Labels every op pushed while it lives with a unit; restores the previous one on exit. */
  class UnitScope {
   public:
    UnitScope(RankEmitter& e, UnitId u) : e_(e), saved_(e.unit_) { e_.unit_ = u; }
    ~UnitScope() { e_.unit_ = saved_; }
    UnitScope(const UnitScope&) = delete;
    UnitScope& operator=(const UnitScope&) = delete;

   private:
    RankEmitter& e_;
    UnitId saved_;
  };

  Op& push(OpKind kind, StreamId stream, Purpose purpose, std::span<const Access> acc = {});
  Op& push(OpKind kind, StreamId stream, Purpose purpose, std::initializer_list<Access> acc) {
    return push(kind, stream, purpose, std::span<const Access>(acc.begin(), acc.size()));
  }
  Access whole(BufferId b, AccessMode mode) const;
  Access valid_part(UnitId u, BufferId b, ElemRange slice, AccessMode mode) const;
  Access full_part(UnitId u, BufferId b, ElemRange slice, AccessMode mode) const;
  EventId record(StreamId s, Purpose p);
  void wait(StreamId s, EventId e, Purpose p);
  Op& alloc(BufferId b, StreamId s, Purpose p);
  Op& free_buffer(BufferId b, StreamId s, Purpose p);

  void init();
  void checkpoint_load();
  void micro_step(bool trace_complete);
  void run_entry(std::size_t pos, bool trace_complete);
  void loss_gradient();
  void fetch(UnitId u, Purpose p);
  void launch_gather(UnitId u, Purpose p);
  void wait_gather(UnitId u);
  void prefetch(std::size_t pos);
  void compute(UnitId u, TraceEntry::Kind kind);
  void release(UnitId u, std::size_t pos, bool trace_complete);
  void secondary_partition(UnitId u);
  void reduce_gradient(UnitId u);
  void optimizer();

  bool uses_secondary(UnitId u) const {
    return st_[u].secondary && rank_ != c_.sc.bugs.secondary_mismatch_rank;
  }
  ElemRange primary_slice(UnitId u) const { return c_.layouts[u].primary_slice(rank_); }
  ElemRange secondary_slice(UnitId u) const {
    return c_.layouts[u].secondary_slice(rank_ % c_.hpz);
  }

  const BuildContext& c_;
  Rank rank_;
  StreamId ag_;
  StreamId rs_;
  RankSchedule out_;
  std::vector<UnitBuffers> ub_;
  std::vector<UnitState> st_;
  std::vector<BufferId> act_;  // activation checkpoint after each unit (by unit id)
  BufferId dact_ = 0, grad_norm_ = 0, recompute_ = 0;
  EventId next_event_ = 0;
  int step_ = -1;
  int micro_ = 0;
  Phase phase_ = Phase::kInit;
  UnitId unit_ = kNoUnit;         // label of the ops being pushed (see UnitScope)
  std::int64_t n_available_ = 0;  // elements gathered or in flight (stage3_max_live_parameters)
  std::size_t queue_pos_ = 0;     // prefetch queue position in the trace
};

BufferId RankEmitter::buffer(std::string name, BufferRole role, UnitId unit, std::uint64_t bytes,
                             bool on_host) {
  out_.buffers.push_back({std::move(name), role, unit, bytes, on_host});
  return static_cast<BufferId>(out_.buffers.size() - 1);
}

Op& RankEmitter::push(OpKind kind, StreamId stream, Purpose purpose, std::span<const Access> acc) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.purpose = purpose;
  op.phase = phase_;
  op.step = step_;
  op.micro_step = micro_;
  op.unit = unit_;
  op.access_begin = static_cast<std::uint32_t>(out_.accesses.size());
  for (const Access& a : acc) {
    if (a.bytes > 0) out_.accesses.push_back(a);
  }
  op.access_count = static_cast<std::uint32_t>(out_.accesses.size() - op.access_begin);
  std::vector<Op>& ops = out_.ops.mut();
  ops.push_back(op);
  return ops.back();
}

Access RankEmitter::whole(BufferId b, AccessMode mode) const {
  return {b, mode, 0, out_.buffers[b].bytes};
}

// The meaningful bytes of `slice` (element range of the full parameter), as an access to a
// buffer that holds exactly that slice (offset relative to the slice's start).
Access RankEmitter::valid_part(UnitId u, BufferId b, ElemRange slice, AccessMode mode) const {
  const ElemRange v = c_.layouts[u].valid(slice);
  const std::uint64_t dt = c_.dt;
  return {b, mode, (v.begin - slice.begin) * dt, v.size() * dt};
}

// The meaningful bytes of `slice` inside a buffer that holds the whole (padded) parameter.
Access RankEmitter::full_part(UnitId u, BufferId b, ElemRange slice, AccessMode mode) const {
  const ElemRange v = c_.layouts[u].valid(slice);
  const std::uint64_t dt = c_.dt;
  return {b, mode, v.begin * dt, v.size() * dt};
}

EventId RankEmitter::record(StreamId s, Purpose p) {
  Op& op = push(OpKind::kEventRecord, s, p);
  op.event = next_event_++;
  return op.event;
}

void RankEmitter::wait(StreamId s, EventId e, Purpose p) {
  push(OpKind::kStreamWaitEvent, s, p).event = e;
}

Op& RankEmitter::alloc(BufferId b, StreamId s, Purpose p) {
  Op& op = push(OpKind::kAlloc, s, p);
  op.buffer = b;
  op.fill = static_cast<std::uint8_t>(c_.sc.run.fill);
  return op;
}

Op& RankEmitter::free_buffer(BufferId b, StreamId s, Purpose p) {
  Op& op = push(OpKind::kFree, s, p);
  op.buffer = b;
  return op;
}

RankSchedule RankEmitter::emit() {
  st_.assign(c_.units.size(), {});
  init();
  for (step_ = 0; step_ < c_.sc.run.steps; ++step_) {
    if (step_ == c_.sc.bugs.checkpoint_load_at_step) checkpoint_load();
    for (micro_ = 0; micro_ < c_.sc.training.grad_accum; ++micro_) {
      // DeepSpeed records the module trace during the first forward+backward and only
      // prefetches (and applies the reuse distance) once the trace is complete.
      micro_step(step_ > 0 || micro_ > 0);
    }
    micro_ = 0;
    optimizer();
  }
  out_.accesses.shrink_to_fit();  // a large world keeps every rank's: no growth slack
  return std::move(out_);
}

// Model construction under zero.Init: each parameter is created whole, cut into this rank's
// primary shard and, with hpZ, its secondary shard, and the whole tensor is freed.
void RankEmitter::init() {
  phase_ = Phase::kInit;
  const bool offload = c_.sc.zero.offload_param;
  const auto act_bytes = static_cast<std::uint64_t>(c_.act_bytes);
  ub_.resize(c_.units.size());
  act_.assign(c_.units.size(), 0);
  for (UnitId u : c_.order) {
    const ParamUnit& pu = c_.units[u];
    const std::uint64_t dt = c_.dt;
    UnitBuffers& b = ub_[u];
    b.primary = buffer(pu.name + ".primary", BufferRole::kPrimary, u, pu.shard_numel * dt, offload);
    b.secondary =
        buffer(pu.name + ".secondary", BufferRole::kSecondary, u, pu.secondary_numel * dt, offload);
    b.full = buffer(pu.name + ".full", BufferRole::kFull, u, pu.padded_numel * dt);
    b.stage = buffer(pu.name + ".stage", BufferRole::kScratch, u,
                     std::max(pu.shard_numel, pu.secondary_numel) * dt);
    b.q_shard = buffer(pu.name + ".shard.q", BufferRole::kQuantized, u,
                       quantized_bytes(std::max(pu.shard_numel, pu.secondary_numel), 8));
    b.q_full =
        buffer(pu.name + ".full.q", BufferRole::kQuantized, u, quantized_bytes(pu.padded_numel, 8));
    b.grad = buffer(pu.name + ".grad", BufferRole::kGradFull, u, pu.padded_numel * dt);
    b.grad_shard = buffer(pu.name + ".grad_shard", BufferRole::kGradShard, u, pu.shard_numel * dt);
    b.q_grad =
        buffer(pu.name + ".grad.q", BufferRole::kQuantized, u, quantized_bytes(pu.padded_numel, 4));
    b.q_grad2 = buffer(pu.name + ".grad.q2", BufferRole::kQuantized, u,
                       quantized_bytes(pu.padded_numel, 4));
    act_[u] = buffer(pu.name + ".act", BufferRole::kActivation, u, act_bytes);
  }
  dact_ = buffer("act.grad", BufferRole::kActivation, kNoUnit, act_bytes);
  recompute_ = buffer("act.recompute", BufferRole::kActivation, kNoUnit, act_bytes);
  grad_norm_ = buffer("grad_norm", BufferRole::kScratch, kNoUnit, 4);
  alloc(grad_norm_, kS0, Purpose::kParamInit);

  for (UnitId u : c_.order) {
    const UnitScope scope(*this, u);
    const UnitBuffers& b = ub_[u];
    alloc(b.full, kS0, Purpose::kParamInit);
    push(OpKind::kKernel, kS0, Purpose::kParamInit,
         {full_part(u, b.full, {0, c_.units[u].padded_numel}, AccessMode::kWrite)});
    alloc(b.primary, kS0, Purpose::kParamInit);
    push(OpKind::kCopy, kS0, Purpose::kParamInit,
         {full_part(u, b.full, primary_slice(u), AccessMode::kRead),
          valid_part(u, b.primary, primary_slice(u), AccessMode::kWrite)});
    alloc(b.grad_shard, kS0, Purpose::kParamInit);
    push(OpKind::kKernel, kS0, Purpose::kParamInit,
         {valid_part(u, b.grad_shard, primary_slice(u), AccessMode::kWrite)});
    if (c_.hpz > 1) secondary_partition(u);
    free_buffer(b.full, kS0, Purpose::kParamInit);
  }
  push(OpKind::kHostDeviceSync, kHostStream, Purpose::kParamInit);
}

// A checkpoint load (DeepSpeed issue 7606) writes every primary shard and nothing else.
void RankEmitter::checkpoint_load() {
  phase_ = Phase::kCheckpointLoad;
  for (UnitId u : c_.order) {
    const UnitScope scope(*this, u);
    push(OpKind::kCopy, kS0, Purpose::kCheckpointLoad,
         {valid_part(u, ub_[u].primary, primary_slice(u), AccessMode::kWrite)});
  }
  push(OpKind::kHostDeviceSync, kHostStream, Purpose::kCheckpointLoad);
}

void RankEmitter::micro_step(bool trace_complete) {
  phase_ = Phase::kForward;
  queue_pos_ = 0;
  for (UnitId u : c_.order) alloc(act_[u], kS0, Purpose::kForwardCompute);
  alloc(dact_, kS0, Purpose::kForwardCompute);
  alloc(recompute_, kS0, Purpose::kForwardCompute);
  for (std::size_t pos = 0; pos < c_.trace.size(); ++pos) {
    if (pos == c_.order.size()) loss_gradient();
    run_entry(pos, trace_complete);
  }
  for (UnitId u : c_.order) free_buffer(act_[u], kS0, Purpose::kBackwardCompute);
  free_buffer(dact_, kS0, Purpose::kBackwardCompute);
  free_buffer(recompute_, kS0, Purpose::kBackwardCompute);
  for (auto& s : st_) s.fetched_for = -1;
}

// The loss on the last activation and its gradient, which the first backward kernel reads.
void RankEmitter::loss_gradient() {
  phase_ = Phase::kBackward;
  Op& op =
      push(OpKind::kKernel, kS0, Purpose::kLossGradient,
           {whole(act_[c_.order.back()], AccessMode::kRead), whole(dact_, AccessMode::kWrite)});
  op.mem_bytes = 2 * c_.act_bytes;
}

// One module invocation: fetch (and prefetch), compute, release; gradients after backward.
void RankEmitter::run_entry(std::size_t pos, bool trace_complete) {
  using K = TraceEntry::Kind;
  const TraceEntry& e = c_.trace[pos];
  phase_ = e.kind == K::kForward ? Phase::kForward : Phase::kBackward;
  if (!st_[e.unit].available) launch_gather(e.unit, Purpose::kParamFetch);
  if (st_[e.unit].inflight) wait_gather(e.unit);
  if (trace_complete) prefetch(pos);
  compute(e.unit, e.kind);
  release(e.unit, pos, trace_complete);
  if (e.kind == K::kBackward) reduce_gradient(e.unit);
}

// Issues the gather of a unit on the all-gather stream: from the secondary over the hpZ group
// when one exists, else from the primary over the world; qwZ quantizes the source first.
void RankEmitter::launch_gather(UnitId u, Purpose p) {
  const UnitScope scope(*this, u);
  const UnitBuffers& b = ub_[u];
  UnitState& s = st_[u];
  const bool hpz = uses_secondary(u);
  const bool qwz = c_.sc.zero.zero_quantized_weights;
  const ElemRange slice = hpz ? secondary_slice(u) : primary_slice(u);
  BufferId src = hpz ? b.secondary : b.primary;
  n_available_ += static_cast<std::int64_t>(c_.units[u].numel);
  s.available = s.inflight = true;

  if (hpz && s.secondary_ready != kNoEvent) wait(ag_, s.secondary_ready, Purpose::kFixEventWait);
  alloc(b.full, ag_, p);
  if (out_.buffers[src].on_host) {
    // offload_param: the shard comes to the GPU first; a pageable copy blocks the host.
    alloc(b.stage, ag_, Purpose::kOffloadCopy);
    push(OpKind::kCopy, ag_, Purpose::kOffloadCopy,
         {valid_part(u, src, slice, AccessMode::kRead),
          valid_part(u, b.stage, slice, AccessMode::kWrite)});
    push(OpKind::kHostStreamSync, ag_, Purpose::kOffloadCopy);
    src = b.stage;
  }
  if (qwz) {
    alloc(b.q_shard, ag_, Purpose::kWeightQuantize);
    Op& q =
        push(OpKind::kQuantize, ag_, Purpose::kWeightQuantize,
             {valid_part(u, src, slice, AccessMode::kRead), whole(b.q_shard, AccessMode::kWrite)});
    q.mem_bytes = static_cast<double>(slice.size() * c_.dt + out_.buffers[b.q_shard].bytes);
    alloc(b.q_full, ag_, Purpose::kWeightQuantize);
  }
  const EventId launch = record(ag_, Purpose::kNcclHandshake);
  wait(kSnccl, launch, Purpose::kNcclHandshake);
  Op& g = qwz ? push(OpKind::kAllGather, kSnccl, p,
                     {whole(b.q_shard, AccessMode::kRead), whole(b.q_full, AccessMode::kWrite)})
              : push(OpKind::kAllGather, kSnccl, p,
                     {valid_part(u, src, slice, AccessMode::kRead),
                      full_part(u, b.full, {0, c_.units[u].padded_numel}, AccessMode::kWrite)});
  g.group = hpz ? c_.hpz_group_of[rank_] : c_.world_group;
  g.comm_bytes = qwz ? quantized_bytes(slice.size(), 8) : slice.size() * c_.dt;
  s.gathered = record(kSnccl, Purpose::kNcclHandshake);
  if (out_.buffers[src].role == BufferRole::kScratch)
    free_buffer(b.stage, kSnccl, Purpose::kOffloadCopy);
}

// The handle's wait(): the all-gather stream waits for NCCL, dequantizes, and the compute
// stream waits for the all-gather stream.
void RankEmitter::wait_gather(UnitId u) {
  const UnitScope scope(*this, u);
  const UnitBuffers& b = ub_[u];
  UnitState& s = st_[u];
  wait(ag_, s.gathered, Purpose::kNcclHandshake);
  if (c_.sc.zero.zero_quantized_weights) {
    Op& d = push(OpKind::kDequantize, ag_, Purpose::kWeightDequantize,
                 {whole(b.q_full, AccessMode::kRead),
                  full_part(u, b.full, {0, c_.units[u].padded_numel}, AccessMode::kWrite)});
    d.mem_bytes = static_cast<double>(out_.buffers[b.q_full].bytes + c_.units[u].numel * c_.dt);
    free_buffer(b.q_shard, ag_, Purpose::kWeightDequantize);
    free_buffer(b.q_full, ag_, Purpose::kWeightDequantize);
  }
  if (ag_ != kS0) wait(kS0, record(ag_, Purpose::kFetchWait), Purpose::kFetchWait);
  s.inflight = false;
}

// The prefetcher walks the recorded trace ahead of the current module and gathers what is not
// available yet, up to stage3_prefetch_bucket_size elements and within
// stage3_max_live_parameters. Popped entries mark their unit as needed there, which keeps it
// from being released before that use.
void RankEmitter::prefetch(std::size_t pos) {
  queue_pos_ = std::max(queue_pos_, pos + 1);
  const auto& z = c_.sc.zero;
  const std::int64_t budget =
      std::min(z.stage3_max_live_parameters - n_available_, z.stage3_prefetch_bucket_size);
  std::int64_t prefetching = 0;
  while (queue_pos_ < c_.trace.size() && prefetching < budget) {
    const std::size_t at = queue_pos_++;
    const UnitId v = c_.trace[at].unit;
    st_[v].fetched_for = std::max(st_[v].fetched_for, static_cast<int>(at));
    if (st_[v].available) continue;
    launch_gather(v, Purpose::kPrefetch);
    // Saturating at the budget (near 2^63 the sum overflowed).
    prefetching += std::min(static_cast<std::int64_t>(c_.units[v].numel), budget - prefetching);
  }
}

void RankEmitter::compute(UnitId u, TraceEntry::Kind kind) {
  const UnitScope scope(*this, u);
  using K = TraceEntry::Kind;
  const UnitBuffers& b = ub_[u];
  const ParamUnit& pu = c_.units[u];
  const UnitId prev = c_.input_of[u];
  const Access param = full_part(u, b.full, {0, pu.padded_numel}, AccessMode::kRead);
  const Access in = prev != kNoUnit ? whole(act_[prev], AccessMode::kRead) : Access{};
  const double param_bytes = static_cast<double>(pu.numel * c_.dt);
  Op* op = nullptr;
  if (kind == K::kForward) {
    op = &push(OpKind::kKernel, kS0, Purpose::kForwardCompute,
               {param, in, whole(act_[u], AccessMode::kWrite)});
    op->flops = pu.forward_flops;
  } else if (kind == K::kRecompute) {
    op = &push(OpKind::kKernel, kS0, Purpose::kRecomputeForward,
               {param, in, whole(recompute_, AccessMode::kWrite)});
    op->flops = pu.forward_flops;
  } else {
    alloc(b.grad, kS0, Purpose::kGradAlloc);
    op = &push(OpKind::kKernel, kS0, Purpose::kBackwardCompute,
               {param, in, whole(dact_, AccessMode::kRead), whole(dact_, AccessMode::kWrite),
                full_part(u, b.grad, {0, pu.padded_numel}, AccessMode::kWrite)});
    op->flops = 2 * pu.forward_flops;
  }
  op->mem_bytes = param_bytes + 2 * c_.act_bytes;
}

// release_sub_module(): frees the full parameter unless the prefetcher already needs it again
// or it is reused within stage3_max_reuse_distance. param.partition() then creates the secondary
// shard if none exists (_partition calls _partition_param_sec on every release, forward or
// backward): normally after forward; after backward for a unit that stayed gathered from its
// forward to its backward (the last modules).
void RankEmitter::release(UnitId u, std::size_t pos, bool trace_complete) {
  const UnitScope scope(*this, u);
  if (trace_complete) {
    if (st_[u].fetched_for > static_cast<int>(pos)) return;
    std::int64_t traversed = 0;
    for (std::size_t at = pos + 1; at < c_.trace.size(); ++at) {
      const std::int64_t distance = c_.sc.zero.stage3_max_reuse_distance;
      if (traversed >= distance) break;
      if (c_.trace[at].unit == u) return;
      // Saturating at the distance: a distance near 2^63 overflowed the sum.
      traversed += std::min(static_cast<std::int64_t>(c_.units[c_.trace[at].unit].numel),
                            distance - traversed);
    }
  }
  if (c_.hpz > 1 && !st_[u].secondary) secondary_partition(u);
  free_buffer(ub_[u].full, kS0, Purpose::kParamRelease);
  st_[u].available = false;
  n_available_ -= static_cast<std::int64_t>(c_.units[u].numel);
}

// _partition_param_sec(): empty() + an asynchronous copy of this rank's slice on the compute
// stream; then fix A's host sync or fix B's event. Zero-length slices copy nothing (PR 5652);
// with legacy_copy_bounds the copy follows the primary shard's bounds (before PR 5216). With
// run.spin_before_copy_us a spin kernel holds S0 ahead of each copy of a training step, as a
// reproduction on a real GPU does.
void RankEmitter::secondary_partition(UnitId u) {
  const UnitScope scope(*this, u);
  const UnitBuffers& b = ub_[u];
  const ElemRange slice = secondary_slice(u);
  const bool copies = !c_.sc.bugs.legacy_copy_bounds || c_.layouts[u].legacy_copy_happens(rank_);
  alloc(b.secondary, kS0, Purpose::kSecondaryAlloc);
  if (copies && !c_.layouts[u].valid(slice).empty()) {
    if (phase_ != Phase::kInit && c_.sc.run.spin_before_copy_us > 0) {
      push(OpKind::kKernel, kS0, Purpose::kReproSpin).spin_us =
          static_cast<float>(c_.sc.run.spin_before_copy_us);
    }
    Op& copy = push(OpKind::kCopy, kS0, Purpose::kSecondaryPartitionCopy,
                    {full_part(u, b.full, slice, AccessMode::kRead),
                     valid_part(u, b.secondary, slice, AccessMode::kWrite)});
    copy.mem_bytes = 2.0 * static_cast<double>(c_.layouts[u].valid(slice).size() * c_.dt);
  }
  st_[u].secondary = true;
  if (out_.buffers[b.secondary].on_host) {
    push(OpKind::kHostStreamSync, kS0, Purpose::kOffloadCopy).unit = u;
  } else if (phase_ != Phase::kInit && c_.sc.run.variant == Variant::kHostSync) {
    push(OpKind::kHostStreamSync, kS0, Purpose::kFixHostSync).unit = u;
  } else if (phase_ != Phase::kInit && c_.sc.run.variant == Variant::kEventWait) {
    st_[u].secondary_ready = record(kS0, Purpose::kFixEventRecord);
    out_.ops.mut().back().unit = u;
  }
}

// Gradient reduction on the reduce stream: ReduceScatter over the world, or qgZ's hierarchical
// path (quantize, all-to-all in the node, dequantize-reduce-requantize, all-to-all across nodes,
// dequantize-reduce into the shard).
void RankEmitter::reduce_gradient(UnitId u) {
  const UnitScope scope(*this, u);
  phase_ = Phase::kGradReduce;
  const UnitBuffers& b = ub_[u];
  const ParamUnit& pu = c_.units[u];
  if (rs_ != kS0) wait(rs_, record(kS0, Purpose::kGradReduce), Purpose::kGradReduce);
  const Access shard_w = valid_part(u, b.grad_shard, primary_slice(u), AccessMode::kWrite);
  const Access shard_r =
      micro_ > 0 ? valid_part(u, b.grad_shard, primary_slice(u), AccessMode::kRead) : Access{};
  const Access grad_r = full_part(u, b.grad, {0, pu.padded_numel}, AccessMode::kRead);
  if (!c_.sc.zero.zero_quantized_gradients) {
    Op& rs = push(OpKind::kReduceScatter, rs_, Purpose::kGradReduce, {grad_r, shard_r, shard_w});
    rs.group = c_.world_group;
    rs.comm_bytes = pu.shard_numel * c_.dt;
  } else {
    const std::uint64_t q_all = quantized_bytes(pu.padded_numel, 4);
    const std::uint64_t q_node = quantized_bytes(pu.padded_numel / c_.sc.cluster.gpus_per_node, 4);
    alloc(b.q_grad, rs_, Purpose::kGradReduce);
    alloc(b.q_grad2, rs_, Purpose::kGradReduce);
    Op& q = push(OpKind::kQuantize, rs_, Purpose::kGradReduce,
                 {grad_r, whole(b.q_grad, AccessMode::kWrite)});
    q.mem_bytes = static_cast<double>(pu.padded_numel * c_.dt + q_all);
    Op& a1 = push(OpKind::kAllToAll, rs_, Purpose::kGradReduce,
                  {whole(b.q_grad, AccessMode::kRead), whole(b.q_grad2, AccessMode::kWrite)});
    a1.group = c_.intra_group_of[rank_];
    a1.comm_bytes = q_all;
    Op& r1 = push(OpKind::kDequantize, rs_, Purpose::kGradReduce,
                  {whole(b.q_grad2, AccessMode::kRead), whole(b.q_grad, AccessMode::kWrite)});
    r1.mem_bytes = static_cast<double>(2 * q_all);
    Op& a2 = push(OpKind::kAllToAll, rs_, Purpose::kGradReduce,
                  {whole(b.q_grad, AccessMode::kRead), whole(b.q_grad2, AccessMode::kWrite)});
    a2.group = c_.inter_group_of[rank_];
    a2.comm_bytes = q_node;
    Op& r2 = push(OpKind::kDequantize, rs_, Purpose::kGradReduce,
                  {whole(b.q_grad2, AccessMode::kRead), shard_r, shard_w});
    r2.mem_bytes = static_cast<double>(q_node + pu.shard_numel * c_.dt);
    free_buffer(b.q_grad, rs_, Purpose::kGradReduce);
    free_buffer(b.q_grad2, rs_, Purpose::kGradReduce);
  }
  free_buffer(b.grad, rs_, Purpose::kGradReduce);
  phase_ = Phase::kBackward;
}

// The optimizer step: wait for the reductions, the global gradient norm, one update per unit
// writing the primary shard, then the secondaries are invalidated (unless issue 4851's bug is
// on) and the training loop's loss.item() syncs the host with the compute stream.
void RankEmitter::optimizer() {
  phase_ = Phase::kOptimizer;
  if (rs_ != kS0) wait(kS0, record(rs_, Purpose::kOptimizerStep), Purpose::kOptimizerStep);
  std::vector<Access> norm_inputs;
  for (UnitId u : c_.order) {
    norm_inputs.push_back(valid_part(u, ub_[u].grad_shard, primary_slice(u), AccessMode::kRead));
  }
  norm_inputs.push_back(whole(grad_norm_, AccessMode::kWrite));
  push(OpKind::kKernel, kS0, Purpose::kGradNorm, norm_inputs);
  Op& ar = push(OpKind::kAllReduce, kS0, Purpose::kGradNorm,
                {whole(grad_norm_, AccessMode::kRead), whole(grad_norm_, AccessMode::kWrite)});
  ar.group = c_.world_group;
  ar.comm_bytes = 4;
  for (UnitId u : c_.order) {
    const UnitScope scope(*this, u);
    const ElemRange p = primary_slice(u);
    Op& op = push(
        OpKind::kKernel, kS0, Purpose::kOptimizerStep,
        {valid_part(u, ub_[u].grad_shard, p, AccessMode::kRead),
         whole(grad_norm_, AccessMode::kRead), valid_part(u, ub_[u].primary, p, AccessMode::kRead),
         valid_part(u, ub_[u].primary, p, AccessMode::kWrite)});
    // Adam on fp32 master weights and two moments: read and write 12 bytes per element, plus
    // the gradient and the low-precision copy.
    op.mem_bytes = static_cast<double>(c_.layouts[u].valid(p).size() * (24 + 2 * c_.dt));
    op.flops = 10.0 * static_cast<double>(c_.layouts[u].valid(p).size());
  }
  if (!c_.sc.bugs.skip_secondary_invalidation) {
    for (UnitId u : c_.order) {
      if (!st_[u].secondary) continue;
      const UnitScope scope(*this, u);
      free_buffer(ub_[u].secondary, kS0, Purpose::kSecondaryInvalidate);
      st_[u].secondary = false;
      st_[u].secondary_ready = kNoEvent;
    }
  }
  push(OpKind::kHostStreamSync, kS0, Purpose::kStepSync);
}

}  // namespace

namespace {

/** Refuses, in milliseconds, a schedule this machine cannot hold (cluster.nodes = 100000 or
 *  run.steps = 1000000 ran until memory was gone): an estimate of its ops and bytes from the
 *  scenario's sizes, measured on llama2-7b.toml at 16 x 8 GPUs in a release build (coarse
 *  builder: 21 ops per rank, unit and step, init counted as a step, at about 50 bytes each;
 *  DeepSpeed builder: 141 ops at about 100 bytes), rounded up, against half the machine's
 *  physical memory: the engines that read a schedule take more than the schedule itself, and the
 *  sanitizer build about 1.5 times a release build's (tiny.toml at 10,000 nodes: 4.2 GB;
 *  at 100,000 nodes the estimate was 21 GiB against 24 and the build was killed by the kernel,
 *  issue 34 item 6). */
void check_schedule_size(const Scenario& sc) {
  const bool deepspeed = sc.run.builder == "deepspeed";
  const double units = (4.0 + std::max(sc.model.experts, 0)) * sc.model.layers + 3;
  const double ops_per = deepspeed ? 150 : 32;
  const double ops = static_cast<double>(sc.cluster.world_size()) * units * (sc.run.steps + 1.0) *
                     sc.training.grad_accum * ops_per;
  const double bytes = ops * (deepspeed ? 128 : 96);
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGE_SIZE)) / 2;
  if (memory <= 0 || bytes <= memory) return;
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  throw InputError(
      sc.path, "",
      fmt::format("the schedule would need about {:.3g} GiB ({:.3g} ops: {} ranks x {} units x {} "
                  "steps (and init) x {} micro-steps x ~{} ops), more than half of this machine's "
                  "{:.3g} GiB of memory (allowed: fewer ranks, layers, steps or micro-steps)",
                  bytes / kGiB, ops, sc.cluster.world_size(), units, sc.run.steps,
                  sc.training.grad_accum, ops_per, 2 * memory / kGiB));
}

}  // namespace

Schedule build_schedule(const Scenario& sc) {
  check_schedule_size(sc);
  if (sc.run.builder == "deepspeed") return build_deepspeed_schedule(sc, sc.zero.deepspeed_version);
  validate(sc);
  if (sc.run.load != "none") {
    throw InputError(sc.path, "run.load",
                     fmt::format("\"{}\" is DeepSpeed's builder's (allowed with run.builder = "
                                 "\"coarse\": \"none\"; its load is [bugs] "
                                 "checkpoint_load_at_step)",
                                 sc.run.load));
  }
  if (sc.run.step_stream != "default") {
    throw InputError(sc.path, "run.step_stream",
                     fmt::format("\"{}\" is DeepSpeed's builder's (allowed with run.builder = "
                                 "\"coarse\": \"default\")",
                                 sc.run.step_stream));
  }
  if (!sc.run.skipped_steps.empty()) {
    throw InputError(sc.path, "run.skipped_steps",
                     "skipped steps are DeepSpeed's builder's (allowed with run.builder = "
                     "\"coarse\": \"\", every step taken)");
  }
  const BuildContext ctx(sc);
  Schedule s;
  s.scenario = sc.path;
  s.variant = to_string(sc.run.variant);
  s.world_size = ctx.world;
  s.hpz_size = ctx.hpz;
  s.dtype_bytes = ctx.dt;
  s.units = ctx.units;
  s.groups = ctx.groups;
  s.ranks.reserve(ctx.world);
  for (Rank r = 0; r < ctx.world; ++r) {
    s.ranks.push_back(RankEmitter(ctx, r).emit());
    if (r > 0) share_alike(s.ranks.back(), s.ranks.front());  // one copy of what ranks issue alike
  }
  return s;
}

}  // namespace hpz
