#include "sim/deepspeed/offload.hpp"

#include "sim/error.hpp"

namespace hpz {

ParamOffload param_offload(const Scenario& sc) {
  ParamOffload o;
  o.enabled = sc.zero.offload_param;
  if (o.enabled && sc.zero.zero_quantized_weights) {
    // all_gather_coalesced quantizes a lone parameter's shard where it lives
    // (`self.quantizer_module.quantize(param_ds_tensor)`, PP:1229 at v0.13.4, PP:1421 at
    // v0.19.8): with offload_param that is host memory, which no recording or reading here
    // shows DeepSpeed's CUDA quantizer taking.
    throw InputError(sc.path, "zero.offload_param",
                     "true with zero.zero_quantized_weights (qwZ) is not modelled: qwZ quantizes "
                     "a lone parameter's shard in place, and offload_param puts that shard in "
                     "host memory (allowed: false, or zero.zero_quantized_weights false)");
  }
  return o;
}

void blocking_copy(OpEmitter& out, StreamId stream, Purpose purpose, const Access& src,
                   const Access& dst, double mem_bytes) {
  const bool src_host = out.buffer_of(src.buffer).on_host;
  const bool dst_host = out.buffer_of(dst.buffer).on_host;
  const Access both[] = {src, dst};
  if (src_host && dst_host) {
    // A memcpy by the host thread itself (Copy.cu's CPU path): no stream runs it.
    out.emit(OpKind::kCopy, kHostStream, purpose, both).mem_bytes = mem_bytes;
    return;
  }
  out.emit(OpKind::kCopy, stream, purpose, both).mem_bytes = mem_bytes;
  if (src_host || dst_host) {
    // copy_kernel_cuda without non_blocking: memcpy_and_sync, a cudaMemcpyAsync on the current
    // stream and a cudaStreamSynchronize of it (the same for pinned and pageable memory).
    out.emit(OpKind::kHostStreamSync, stream, Purpose::kOffloadCopy, {});
  }
}

BufferId stage_to_device(OpEmitter& out, StreamId stream, Purpose purpose, Access& read,
                         const std::string& name, UnitId unit) {
  const Buffer& shard = out.buffer_of(read.buffer);
  if (!shard.on_host) return kNoBuffer;
  // `.to(device)` makes a tensor of the whole shard on the current stream's device: the
  // caching allocator on `stream`, the copy on `stream`, the host waiting for it.
  const BufferId staged = out.new_buffer(name, BufferRole::kScratch, unit, shard.bytes);
  out.alloc(staged, stream, purpose);
  Access to = read;
  to.buffer = staged;
  to.mode = AccessMode::kWrite;
  blocking_copy(out, stream, Purpose::kOffloadCopy, read, to,
                2.0 * static_cast<double>(read.total_bytes()));
  read.buffer = staged;
  return staged;
}

}  // namespace hpz
