// Loading weights: from_pretrained under zero.Init (run.load = "pretrained") and a ZeRO
// checkpoint after deepspeed.initialize (run.load = "checkpoint").
#include <vector>

#include "sim/deepspeed/rank_builder.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

// run.load = "pretrained": transformers' from_pretrained under zero.Init loads the checkpoint
// module by module, before deepspeed.initialize (_load_state_dict_into_zero3_model,
// modeling_utils.py at 4.51.3): a module's own parameters in one GatheredParameters(params,
// modifier_rank=0) (PP:2333-2348 at v0.18.2): gathered whole, written by rank 0's
// _load_from_state_dict (a copy from the host), broadcast from rank 0 on the parameter's group
// (the world, async, each handle waited), then partition(has_been_updated=True). Whether that
// partition re-copies an existing secondary is issue 7606 (VersionRules::secondary_sees_update).
void RankBuilder::load_pretrained() {
  phase_ = Phase::kCheckpointLoad;
  purpose_ = Purpose::kCheckpointLoad;
  const int n = static_cast<int>(md_.params.size());
  for (int first = 0; first < n;) {
    const int end = module_group_end(first);
    std::vector<int> list;
    for (int p = first; p < end; ++p) {
      if (!md_.params[p].orphan) list.push_back(p);  // tied away: not in the state dict's keys
    }
    first = end;
    if (list.empty()) continue;
    gather_blocking_list(list);
    if (rank_ == 0) {
      for (const int p : list) {
        unit_ = static_cast<UnitId>(p);
        const std::uint64_t numel = md_.params[p].numel;
        push(OpKind::kCopy, current_, Purpose::kCheckpointLoad,
             {part(p, ps_[p].full, {0, numel}, AccessMode::kWrite, true)})
            .mem_bytes = static_cast<double>(numel * dt_);
        // A copy from pageable host memory waits for its stream (memcpy_and_sync, PyTorch's
        // aten/src/ATen/native/cuda/Copy.cu), as the recorder logs it.
        push(OpKind::kHostStreamSync, current_, Purpose::kCheckpointLoad);
      }
    }
    std::vector<EventId> sent;
    for (const int p : list) {
      unit_ = static_cast<UnitId>(p);
      const std::uint64_t numel = md_.params[p].numel;
      // A broadcast (logged as an all-reduce, as the recorder logs it): rank 0 sends its
      // tensor, every other rank's is overwritten unread.
      std::vector<Access> acc;
      if (rank_ == 0) acc.push_back(part(p, ps_[p].full, {0, numel}, AccessMode::kRead, true));
      acc.push_back(part(p, ps_[p].full, {0, numel}, AccessMode::kWrite, true));
      sent.push_back(collective(OpKind::kAllReduce, world_group_, numel * dt_, std::move(acc)));
    }
    for (const EventId e : sent) wait(current_, e, Purpose::kCheckpointLoad);
    for (const int p : list) partition(p, true);
  }
  unit_ = kNoUnit;
  phase_ = Phase::kInit;
  purpose_ = Purpose::kParamInit;
}

// run.load = "checkpoint": engine.load_checkpoint of a ZeRO checkpoint after
// deepspeed.initialize (engine.py _load_checkpoint, S3:2791-2834, 2993-3000 at v0.18.2):
// checkpoint_event_prologue partitions every parameter; _rigid_load_state_dict copies the
// saved fp32 partitions in from the host and the fp16 flat buffers (the primary shards) from
// them; checkpoint_event_epilogue invalidates the secondaries from v0.18.3 (PR 7707) and
// gathers the persistent parameters. Nothing re-copies a secondary before it.
void RankBuilder::load_checkpoint() {
  phase_ = Phase::kCheckpointLoad;
  purpose_ = Purpose::kCheckpointLoad;
  for (int p = 0; p < static_cast<int>(md_.params.size()); ++p) {
    if (ps_[p].status == Status::kAvailable) partition(p);
  }
  for (const int p : optimized_) {
    unit_ = static_cast<UnitId>(p);
    const ElemRange pri = layouts_[p].primary_slice(rank_);
    // offload_param: the saved partition into a host shard is the host's own memcpy.
    push(OpKind::kCopy, out_.buffers[ps_[p].primary].on_host ? kHostStream : s0_,
         Purpose::kCheckpointLoad, {part(p, ps_[p].primary, pri, AccessMode::kWrite, false)})
        .mem_bytes = static_cast<double>(layouts_[p].shard_numel() * (4 + dt_));
  }
  unit_ = kNoUnit;
  // The saved partitions are host tensors (torch.load to the CPU): pageable copies that the
  // host waits for.
  push(OpKind::kHostStreamSync, s0_, Purpose::kCheckpointLoad);
  if (v_.invalidate_after_checkpoint_load) invalidate_secondaries();
  gather_persistent();
}

}  // namespace hpz::deepspeed
