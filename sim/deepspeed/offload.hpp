// ZeRO-3 parameter offload (`zero_optimization.offload_param.device = "cpu"`) as DeepSpeed
// issues it, for the DeepSpeed builder (sim/deepspeed/): which shards live in host
// memory, and the ops a copy between host and device memory becomes. Read from DeepSpeed's code
// release by release; docs/research-offload.md has every finding with its file:line.
//
// Citations: PP = runtime/zero/partition_parameters.py, S3 = runtime/zero/stage3.py, at v0.13.4
// unless a release is named; "Copy.cu" is PyTorch's aten/src/ATen/native/cuda/Copy.cu.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/scenario.hpp"

namespace hpz {

/** Where offload_param puts a parameter's shards (the same in every release from 0.10.0 to
 *  0.19.8; docs/research-offload.md). */
struct ParamOffload {
  bool enabled = false;  ///< offload_param.device = "cpu"

  /** ds_tensor (the primary shard) in host memory. zero.Init makes it with
   *  torch.empty(device=remote_device), the CPU, except for a persistent parameter, which stays
   *  on the device (PP:1533-1540); the stage-3 optimizer's constructor then moves every
   *  optimized parameter's shard, persistent ones included, into its pinned host flat buffer
   *  (S3:652-655, 700-733, _move_to_flat_buffer S3:604-632: `src.data = dest.data`). */
  bool primary_on_host(bool persistent, bool after_optimizer_init) const {
    return enabled && (!persistent || after_optimizer_init);
  }
  /** ds_secondary_tensor (the hpZ shard) in host memory: torch.empty(device=remote_device)
   *  for every parameter, persistent or not (PP:1616-1621). */
  bool secondary_on_host() const { return enabled; }
};

/** The scenario's offload_param. Throws InputError for what the builder does not model with
 *  it, naming the key and the allowed values (qwZ: the quantizer would run on a host shard). */
ParamOffload param_offload(const Scenario& scenario);

/** What the offload model needs of a builder: its op emission, stamped with the builder's
 *  current phase, step, unit and label. */
class OpEmitter {
 public:
  virtual ~OpEmitter() = default;
  /** Appends an op with these accesses (zero-byte ones dropped) and returns it. */
  virtual Op& emit(OpKind kind, StreamId stream, Purpose purpose,
                   std::span<const Access> accesses) = 0;
  /** A new buffer of the rank's table, in device memory. */
  virtual BufferId new_buffer(std::string name, BufferRole role, UnitId unit,
                              std::uint64_t bytes) = 0;
  /** Buffer b of the rank's table. */
  virtual const Buffer& buffer_of(BufferId b) const = 0;
  /** torch.empty of buffer b with `stream` current (the host thread for a host buffer). */
  virtual void alloc(BufferId b, StreamId stream, Purpose purpose) = 0;
};

/** torch's copy_ (or .to()) from `src` to `dst` without non_blocking, `mem_bytes` timed. Both on
 *  the device: a copy on `stream`. Both on the host: a host memcpy, on the host thread. Across:
 *  cudaMemcpyAsync on `stream`, then the host waits for `stream` (Copy.cu copy_kernel_cuda:
 *  memcpy_and_sync unless non_blocking), which is kOffloadCopy's host sync. */
void blocking_copy(OpEmitter& out, StreamId stream, Purpose purpose, const Access& src,
                   const Access& dst, double mem_bytes);

/** `shard.to(device)` of a gather's host shard (PP:1139, 1218 and 1738 at v0.13.4; PP:1354,
 *  1396 and 2146 at v0.19.8): a device buffer allocated on `stream`, the shard's bytes copied
 *  into it at the same offsets, the host waiting for `stream`. Returns the buffer, which the
 *  caller frees where DeepSpeed drops it; `read` is rewritten to read it instead. For a shard
 *  on the device, does nothing and returns kNoBuffer (`.to()` of a device tensor is the tensor
 *  itself). */
BufferId stage_to_device(OpEmitter& out, StreamId stream, Purpose purpose, Access& read,
                         const std::string& name, UnitId unit);

}  // namespace hpz
