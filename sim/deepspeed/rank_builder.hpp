// One rank's schedule as DeepSpeed's ZeRO-3 runtime issues it: RankBuilder runs DeepSpeed's host
// logic (zero.Init's partitioning, the partitioned-parameter coordinator, the module hooks, the
// gathers, the gradient reduction, the optimizer step) over the hook program (hooks.hpp) and
// emits the ops. Its methods live by responsibility: rank_builder.cpp (emission, kernels, hooks,
// the step loop), partition.cpp, load.cpp, gather.cpp, coordinator.cpp, reduce.cpp,
// optimizer.cpp.
//
// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sim/deepspeed/hooks.hpp"
#include "sim/deepspeed/model_tree.hpp"
#include "sim/deepspeed/offload.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/shard.hpp"
#include "sim/scenario.hpp"

namespace hpz::deepspeed {

/** Whether the step checks the gradients for overflow (and can skip on it): fp16, or every dtype
 *  up to 0.11.1 (rule overflow-check-every-dtype). */
inline bool checks_overflow(const Scenario& sc, const VersionRules& v) {
  return sc.training.dtype == "fp16" || v.overflow_check_every_dtype;
}

/** A parameter's ds_status (PP:ZeroParamStatus). */
enum class Status { kNotAvailable, kInflight, kAvailable };

/** An all-gather in flight: the work handle DeepSpeed keeps in __inflight_param_registry. */
struct Handle {
  bool coalesced = false;
  bool complete = false;
  EventId end = kNoEvent;              // the NCCL end event
  std::vector<int> params;             // sorted by ds_id
  BufferId flat = kNoBuffer;           // coalesced: the flat buffer
  StreamId flat_stream = kHostStream;  // the stream it was allocated on
  std::size_t registered = 0;          // params still in __inflight_param_registry
  std::uint64_t per_rank_elems = 0;    // coalesced: partition_sz
  std::vector<std::uint64_t> offsets;  // coalesced: each param's offset in a rank's partition
  std::vector<std::uint64_t> chunk;    // coalesced: each param's elements per rank
  int group_size = 0;
  // qwZ: the int8 gather's buffer, the scales' buffer and the scales' collective's end event.
  bool quantized = false;
  BufferId qbuf = kNoBuffer, sbuf = kNoBuffer;
  StreamId q_stream = kHostStream;  // the stream both were allocated on
  EventId scale_end = kNoEvent;
};

/** What DeepSpeed holds of one parameter on this rank, and where its buffers are. */
struct ParamState {
  Status status = Status::kNotAvailable;
  bool has_secondary = false;
  bool has_primary = false;            // ds_tensor is set
  std::set<int> active;                // ds_active_sub_modules
  EventId secondary_ready = kNoEvent;  // event-wait: recorded after the last secondary copy
  int handle = -1;                     // in __inflight_param_registry
  BufferId primary = kNoBuffer, secondary = kNoBuffer, full = kNoBuffer, grad = kNoBuffer;
};

/** One entry of the coordinator's parameter trace: a parameter and the step that fetches it. */
struct TraceEntry {
  int param;
  int step_id;
};

/** What every rank's builder reads alike, made once per schedule (a rank's builder made it
 *  again: a hash map of the labels, and a search of every group for the rank, which at 200,000
 *  ranks of tiny.toml on 100,000 hpZ groups was most of the build). */
struct WorldIndex {
  /** Each module's label: the first of the schedule's labels with its path. */
  std::vector<LabelId> module_label;
  /** The groups rank r is in, ascending: groups[group_at[r] .. group_at[r + 1]). */
  std::vector<std::size_t> group_at;
  std::vector<GroupId> groups;

  WorldIndex(const Schedule& s, const Model& md);
  std::span<const GroupId> groups_of(Rank r) const {
    const auto i = static_cast<std::size_t>(r);
    return {groups.data() + group_at[i], group_at[i + 1] - group_at[i]};
  }
};

/** One rank's schedule as DeepSpeed issues it. As an OpEmitter, the offload model's copies and
 *  stagings (sim/deepspeed/offload.hpp) emit through it. */
class RankBuilder final : private OpEmitter {
 public:
  RankBuilder(const Scenario& sc, const VersionRules& v, const Model& md, const Walk& walk,
              const WorldIndex& index, Schedule& s, Rank r);
  RankSchedule build();
  /** Builds this rank as one that issues `first`'s ops, each on its own groups (every rank of a
   *  DeepSpeed world does): each op is matched against first's as it is issued (OpMatcher), and
   *  the rank keeps ops of its own only from the first one that differs. Room for first's
   *  accesses and buffers is made up front. */
  RankBuilder& follow(const RankSchedule& first);

 private:
  // OpEmitter.
  Op& emit(OpKind kind, StreamId s, Purpose p, std::span<const Access> acc) override {
    return push(kind, s, p, acc);
  }
  BufferId new_buffer(std::string name, BufferRole role, UnitId unit,
                      std::uint64_t bytes) override {
    return buffer(std::move(name), role, unit, bytes);
  }
  const Buffer& buffer_of(BufferId b) const override { return out_.buffers[b]; }
  /** offload_param: buffer b lives in host memory (Buffer::on_host). */
  void place_on_host(BufferId b, bool host) { out_.buffers.mut()[b].on_host = host; }
  /** A new buffer for parameter p's secondary shard (ds_secondary_tensor), in host memory with
   *  offload_param (PP:1616-1621). */
  BufferId secondary_buffer(int p) {
    const BufferId b = buffer(md_.params[p].name + ".secondary", BufferRole::kSecondary,
                              static_cast<UnitId>(p), layouts_[p].secondary_numel() * dt_);
    place_on_host(b, offload_.secondary_on_host());
    return b;
  }

  // IR emission.
  Op& push(OpKind kind, StreamId s, Purpose p, std::initializer_list<Access> acc = {});
  Op& push(OpKind kind, StreamId s, Purpose p, std::span<const Access> acc);
  EventId record(StreamId s, Purpose p);
  void wait(StreamId s, EventId e, Purpose p);
  void wait_stream(StreamId waiter, StreamId other, Purpose p);
  StreamId nccl_stream(GroupId g);
  EventId collective(OpKind kind, GroupId g, std::uint64_t bytes, std::vector<Access> acc);
  BufferId buffer(std::string name, BufferRole role, UnitId unit, std::uint64_t bytes);
  void alloc(BufferId b, StreamId s, Purpose p) override;
  void free(BufferId b, StreamId s, Purpose p);
  Access part(int p, BufferId b, ElemRange slice, AccessMode mode, bool in_full) const;

  // The step loop, kernels and hooks (rank_builder.cpp).
  void micro_step(const std::vector<Hook>& hooks);
  void run_hook(const Hook& h);
  void forward_kernel(int module, bool recompute);
  void backward_kernel(int module);
  void kernel(int module, bool backward);

  // zero.Init and partitioning (partition.cpp).
  void init();
  void zero_init_module(int first, int end);
  void defragment();
  int module_group_end(int first) const;
  void barrier();
  void world_round_trip(const char* name, std::uint64_t bytes, bool read, Purpose p);
  void partition(int p, bool has_been_updated = false);
  void partition_secondary(int p, bool create, bool has_been_updated);
  [[noreturn]] void refuse_secondary_copy(int p, int pos) const;

  // Loads of weights (load.cpp).
  void load_pretrained();
  void load_checkpoint();

  // Gathers (gather.cpp).
  void gather_blocking(int p);
  void gather_blocking_list(const std::vector<int>& list);
  void all_gather_params(const std::vector<int>& params, bool forward);
  void all_gather_coalesced(std::vector<int> params, bool forward);
  void all_gather_one(Handle& h, GroupId g, bool use_secondary, int rank_in_group);
  void all_gather_flat(Handle& h, GroupId g, bool use_secondary, int rank_in_group);
  void all_gather_quantized(Handle& h, GroupId g, bool use_secondary, int rank_in_group);
  Access shard_read(int p, bool use_secondary, int rank_in_group) const;
  std::uint64_t lay_out_partition(Handle& h, bool use_secondary) const;
  void wait_handle(int h);
  void dequantize(Handle& h);
  void copy_out(Handle& h, std::size_t i);
  /// PR 8215's casts around qwZ's quantizer (rule qwz-bf16-cast): from 0.19.6, for parameters
  /// that are not fp16 (`param.to(dtype=torch.half)` is no copy for an fp16 one).
  bool half_cast() const { return v_.qwz_half_cast && sc_.training.dtype != "fp16"; }

  // The partitioned-parameter coordinator (coordinator.cpp).
  void fetch_sub_module(int module, bool forward);
  void wait_fetched(int p);
  void pop_trace(int module, const std::vector<int>& to_fetch);
  void prefetch_next(bool forward);
  void release_sub_module(int module);
  void release_backward_leftovers();
  void release_param_as(int p, LabelId label);
  void release_param(int p);
  std::set<int> params_to_release(int module, int step_id);
  void reset_step();

  // Gradient reduction (reduce.cpp).
  void grad_ready(int p);
  void reduce_ipg();
  void reduce_quantized();
  /** The group gradients are reduced and their norm summed over: the optimizer's clone of the
   *  world, or from PR 8060 the parameters' own (the world). */
  GroupId reduce_group() const { return v_.grads_on_param_group ? world_group_ : grad_group_; }

  // The optimizer (optimizer.cpp).
  /** The optimizer's param groups (training.param_groups), each in model.parameters() order. */
  std::vector<std::vector<int>> make_param_groups() const;
  /** The optimizer's sub-groups: each param group cut by _create_fp16_sub_groups. */
  std::vector<std::vector<int>> make_sub_groups(const std::vector<std::vector<int>>& groups) const;
  void optimizer_step();
  void offload_write_back(const std::vector<int>& group);
  void invalidate_secondaries();
  void overflow_check();
  void gather_persistent();

  const Scenario& sc_;
  const VersionRules& v_;
  const ParamOffload offload_;  ///< zero.offload_param (sim/deepspeed/offload.hpp)
  const Model& md_;
  const Walk& walk_;
  Schedule& s_;
  Rank rank_;
  int world_, hpz_, dt_;
  GroupId world_group_ = kNoGroup, hpz_group_ = kNoGroup, grad_group_ = kNoGroup;
  GroupId intra_group_ = kNoGroup, inter_group_ = kNoGroup;  // qgZ
  RankSchedule out_;
  // The op last issued, which its issuer may still change (push returns it); it joins out_.ops
  // (or is matched, see follow()) when the next one is issued.
  Op pending_;
  bool has_pending_ = false;
  std::optional<OpMatcher> matcher_;  ///< follow(): while the ops match first's
  void commit();
  /// S0 is the default stream; S_step the one run.step_stream = "side" issues forward and
  /// backward from (S0 otherwise): current_ during them.
  StreamId s0_ = 0, sag_ = -1, srs_ = -1, sstep_ = 0;
  std::map<GroupId, StreamId> nccl_;
  StreamId current_ = 0;
  EventId next_event_ = 0;
  Phase phase_ = Phase::kInit;
  Purpose purpose_ = Purpose::kParamInit;
  int step_ = -1;
  int micro_ = 0;
  UnitId unit_ = kNoUnit;
  LabelId label_ = kNoLabel;
  const std::vector<LabelId>& module_label_;  ///< WorldIndex::module_label
  std::vector<ShardLayout> layouts_;
  std::vector<ParamState> ps_;
  /** The optimizer's parameters, in model.parameters() order: all but the orphan (a tied
   *  model's own lm_head weight, which only zero.Init ever sees; DsParam::orphan). */
  std::vector<int> optimized_;
  std::vector<std::vector<int>> sub_groups_;  ///< make_sub_groups(), fixed at construction
  /** The optimized parameters in fp16_groups order: the sub-groups one after the other (the
   *  param groups in turn, each in model.parameters() order), which the flat buffer, the
   *  gradient hooks' registration and the secondaries' invalidation follow. */
  std::vector<int> fp16_order_;
  std::vector<Handle> handles_;
  /** __active_backward_submodules (COORD:160 at 0.19.8): modules whose backward fetch ran and
   *  whose post-backward hook has not, in the order recorded. */
  std::vector<int> active_backward_;

  // PartitionedParameterCoordinator (COORD:78-130).
  // COORD:94 at v0.13.4 starts in RECORD; from v0.15.4 (PR 6662) the trace starts INVALID (COORD:98
  // at v0.17.6) and the first reset_step turns it to RECORD.
  enum class Trace { kInvalid, kRecord, kComplete } trace_ = Trace::kRecord;
  std::vector<int> submodule_order_;
  std::vector<TraceEntry> param_order_;
  std::deque<TraceEntry> queue_;
  std::map<int, int> most_recent_;  // param -> step id (absent: -1e10)
  int step_id_ = 0;
  std::int64_t n_available_ = 0;
  std::deque<EventId> ongoing_fetch_events_;
  std::map<std::pair<int, int>, std::set<int>> release_cache_;  // the lru_cache (COORD:487)

  // Stage 3 gradients (S3:1213-1280).
  std::vector<int> ipg_params_;
  std::uint64_t ipg_elems_ = 0;
  std::map<int, Access> ipg_grad_;  // where each bucketed gradient is read from
  BufferId ipg_buffer_ = kNoBuffer;
  std::deque<EventId> param_reduce_events_;
  BufferId grad_shard_ = kNoBuffer;
};

}  // namespace hpz::deepspeed
