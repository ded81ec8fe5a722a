// The all-gathers: blocking ones (param.all_gather), all_gather_coalesced with its flat layouts,
// qwZ's quantized gathers, and the handles' wait.
#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/deepspeed/rank_builder.hpp"
#include "sim/error.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

namespace {

// CUDAQuantizer.quantize's group count (PP:735-757): the smallest count from numel / 8000 up
// that divides numel into groups of a multiple of 8, doubled while that holds and groups stay
// above 8000 elements. DeepSpeed asserts a multiple of 8 elements and groups under 16000.
/** The group count for `numel`, or 0 where DeepSpeed's assertion fails. Every rank of a world
 *  asks for the same few sizes, so the answers are kept (the search is linear in the count). */
std::uint64_t quantizer_groups_or_zero(std::uint64_t numel) {
  thread_local std::unordered_map<std::uint64_t, std::uint64_t> known;
  if (const auto it = known.find(numel); it != known.end()) return it->second;
  constexpr std::uint64_t kTarget = 8000;
  std::uint64_t groups = (numel + kTarget - 1) / kTarget;
  while (groups < numel && numel % (8 * groups) != 0) ++groups;
  while (numel % (8 * groups * 2) == 0 && numel / groups > kTarget) groups *= 2;
  if (groups == 0 || numel % (8 * groups) != 0 || numel / groups >= 16000 || numel <= groups) {
    groups = 0;
  }
  known.emplace(numel, groups);
  return groups;
}

/** quantizer_groups_or_zero, throwing where DeepSpeed stops; `what` names the gather. */
template <class What>
std::uint64_t quantizer_groups(std::uint64_t numel, const What& what) {
  const std::uint64_t groups = quantizer_groups_or_zero(numel);
  if (groups == 0) {
    throw InputError("", "zero.zero_quantized_weights",
                     "DeepSpeed's qwZ quantizer (CUDAQuantizer.quantize, "
                     "runtime/zero/partition_parameters.py:751 at v0.13.4) asserts that a gathered "
                     "shard holds a multiple of 8 elements; " +
                         what() + " holds " + std::to_string(numel) +
                         ", so DeepSpeed itself stops here");
  }
  return groups;
}

}  // namespace

// param.all_gather() (PP:1114) on one parameter: _all_gather (PP:1432-1462) with async_op
// false calls _allgather_params (PP:1822-1870): a flat buffer of partition_size * world, this
// rank's shard copied into its slot, a blocking all_gather_into_tensor on the parameter's
// ds_process_group (the world), and the parameter's new data copied out of the flat buffer.
void RankBuilder::gather_blocking(int p) {
  const DsParam& dp = md_.params[p];
  ParamState& st = ps_[p];
  const ShardLayout& l = layouts_[p];
  const std::uint64_t shard = l.shard_numel() * dt_;
  if (v_.sequential_blocking_gather) {
    // _allgather_params_sequential (PP:1997-2050 at v0.18.5, PR 7661), which a blocking gather
    // of one parameter takes from v0.18.5 (PP:1618): all_gather_into_tensor from the shard
    // itself into a flat tensor that becomes the parameter's data (a narrowed view, no copy),
    // then a device synchronize.
    st.full = buffer(dp.name + ".full", BufferRole::kFull, static_cast<UnitId>(p),
                     l.padded_numel() * dt_);
    unit_ = kNoUnit;
    alloc(st.full, current_, Purpose::kParamInit);
    // offload_param: `param.ds_tensor.to(device)` (PP:2146 at v0.19.8) stages a host shard.
    Access sent = shard_read(p, false, rank_);
    const BufferId staged =
        stage_to_device(*this, current_, Purpose::kParamInit, sent, dp.name + ".to_device", p);
    const EventId done =
        collective(OpKind::kAllGather, world_group_, shard,
                   {sent, {st.full, AccessMode::kWrite, 0, l.padded_numel() * dt_}});
    if (staged != kNoBuffer) free(staged, current_, Purpose::kOffloadCopy);
    wait(current_, done, Purpose::kParamInit);
    push(OpKind::kHostDeviceSync, kHostStream, Purpose::kParamInit);
    st.status = Status::kAvailable;
    return;
  }
  const BufferId flat =
      buffer(dp.name + ".gather_flat", BufferRole::kScratch, kNoUnit, l.padded_numel() * dt_);
  unit_ = kNoUnit;
  alloc(flat, current_, Purpose::kParamInit);
  // This rank's own elements (the padding means nothing, as in the defragment above), in its
  // slot of the flat buffer.
  const Access own = part(p, st.primary, l.primary_slice(rank_), AccessMode::kRead, false);
  const std::uint64_t slot = static_cast<std::uint64_t>(rank_) * shard + own.offset;
  // offload_param: `partitions[i].narrow(...).copy_(param.ds_tensor.data)` from host memory
  // (PP:1842 at v0.13.4), which the host waits for.
  blocking_copy(*this, current_, Purpose::kParamInit, own,
                {flat, AccessMode::kWrite, slot, own.bytes}, static_cast<double>(2 * shard));
  const EventId done = collective(OpKind::kAllGather, world_group_, shard,
                                  {{flat, AccessMode::kRead, slot, own.bytes},
                                   {flat, AccessMode::kWrite, 0, l.padded_numel() * dt_}});
  wait(current_, done, Purpose::kParamInit);  // the work's wait() (PG), async_op false
  st.full = buffer(dp.name + ".full", BufferRole::kFull, static_cast<UnitId>(p), dp.numel * dt_);
  alloc(st.full, current_, Purpose::kParamInit);
  push(OpKind::kCopy, current_, Purpose::kParamInit,
       {{flat, AccessMode::kRead, 0, dp.numel * dt_},
        part(p, st.full, {0, dp.numel}, AccessMode::kWrite, true)})
      .mem_bytes = static_cast<double>(2 * dp.numel * dt_);
  st.status = Status::kAvailable;
}

// params[0].all_gather(param_list=params) with async_op false (_all_gather, PP:1593-1629 at
// v0.18.2): one parameter through _allgather_params (gather_blocking), several through
// _allgather_params_coalesced.
void RankBuilder::gather_blocking_list(const std::vector<int>& list) {
  if (list.empty()) return;
  if (list.size() == 1) {
    gather_blocking(list.front());
    return;
  }
  for (int p : list) {
    ps_[p].full = buffer(md_.params[p].name + ".full", BufferRole::kFull, static_cast<UnitId>(p),
                         layouts_[p].padded_numel() * dt_);
    unit_ = static_cast<UnitId>(p);
    alloc(ps_[p].full, current_, purpose_);
  }
  unit_ = kNoUnit;
  std::vector<EventId> launched;
  // offload_param: `local_tensors.append(param.ds_tensor.to(device))` for every parameter
  // first (PP:1738 at v0.13.4), each staged on the current stream; dropped on return.
  std::vector<Access> sent;
  std::vector<BufferId> staged;
  for (int p : list) {
    sent.push_back(shard_read(p, false, rank_));
    unit_ = static_cast<UnitId>(p);
    staged.push_back(stage_to_device(*this, current_, purpose_, sent.back(),
                                     md_.params[p].name + ".to_device", p));
  }
  unit_ = kNoUnit;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const int p = list[i];
    const std::uint64_t shard = layouts_[p].shard_numel() * dt_;
    // The shard's own elements only, as every gather reads it (shard_read).
    launched.push_back(collective(
        OpKind::kAllGather, world_group_, shard,
        {sent[i], {ps_[p].full, AccessMode::kWrite, 0, layouts_[p].padded_numel() * dt_}}));
  }
  if (v_.wait_every_blocking_handle) {
    for (const EventId e : launched) wait(current_, e, purpose_);  // PP:2111-2112 at 0.19.8
  } else {
    wait(current_, launched.back(), purpose_);  // launch_handles[-1].wait()
  }
  push(OpKind::kHostDeviceSync, kHostStream, purpose_);
  for (const BufferId b : staged) {
    if (b != kNoBuffer) free(b, current_, Purpose::kOffloadCopy);
  }
  for (int p : list) ps_[p].status = Status::kAvailable;
}

// COORD:423-455: parameters with a secondary and those without go in separate calls (from
// v0.13.2), each inside `with stream(S_ag)`.
void RankBuilder::all_gather_params(const std::vector<int>& params, bool forward) {
  std::vector<int> partitioned;
  for (int p : params) {
    if (ps_[p].status == Status::kNotAvailable) partitioned.push_back(p);
  }
  if (partitioned.empty()) return;
  for (int p : partitioned) n_available_ += static_cast<std::int64_t>(md_.params[p].numel);
  std::vector<std::vector<int>> calls;
  if (v_.split_by_secondary) {
    std::vector<int> with, without;
    for (int p : partitioned) (ps_[p].has_secondary ? with : without).push_back(p);
    if (!with.empty()) calls.push_back(with);
    if (!without.empty()) calls.push_back(without);
  } else {
    calls.push_back(partitioned);
  }
  for (auto& call : calls) {
    const StreamId saved = current_;
    current_ = sag_;
    all_gather_coalesced(call, forward);
    current_ = saved;
  }
}

// PP:1156-1260 (all_gather_coalesced) and 1120-1154 (_all_gather_dtype).
void RankBuilder::all_gather_coalesced(std::vector<int> params, bool forward) {
  std::sort(params.begin(), params.end());  // by ds_id
  const bool use_secondary =
      ps_[params[0]].has_secondary && hpz_ > 1 && !(v_.secondary_only_backward && forward);
  const bool hpz_group = hpz_ > 1 && (v_.secondary_only_backward ? !forward : use_secondary);
  const GroupId g = hpz_group ? hpz_group_ : world_group_;
  const int group_size = hpz_group ? hpz_ : world_;
  const int rank_in_group = hpz_group ? rank_ % hpz_ : rank_;
  // event-wait (fix B): the gathering stream waits for the copy that wrote each secondary read.
  for (int p : params) {
    if (use_secondary && ps_[p].secondary_ready != kNoEvent) {
      wait(current_, ps_[p].secondary_ready, Purpose::kFixEventWait);
      ps_[p].secondary_ready = kNoEvent;
    }
  }
  for (int p : params) ps_[p].status = Status::kInflight;
  Handle h;
  h.params = params;
  h.group_size = group_size;
  if (sc_.zero.zero_quantized_weights) {
    all_gather_quantized(h, g, use_secondary, rank_in_group);
  } else if (params.size() == 1) {
    all_gather_one(h, g, use_secondary, rank_in_group);
  } else {
    all_gather_flat(h, g, use_secondary, rank_in_group);
  }
  h.registered = params.size();
  handles_.push_back(std::move(h));
  for (int p : params) ps_[p].handle = static_cast<int>(handles_.size() - 1);
}

// One parameter: gathered straight into its full buffer (PP:1202-1222).
void RankBuilder::all_gather_one(Handle& h, GroupId g, bool use_secondary, int rank_in_group) {
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const int p = h.params[0];
  ParamState& st = ps_[p];
  const UnitId saved_unit = unit_;
  unit_ = p;
  alloc(st.full, current_, purpose_);
  const std::uint64_t in_elems =
      use_secondary ? layouts_[p].secondary_numel() : layouts_[p].shard_numel();
  // offload_param: `param_ds_tensor.to(device)` (PP:1218 at v0.13.4) on S_ag, a temporary
  // dropped when _dist_allgather_fn returns.
  Access sent = shard_read(p, use_secondary, rank_in_group);
  const BufferId staged =
      stage_to_device(*this, current_, purpose_, sent, md_.params[p].name + ".to_device", p);
  h.end = collective(
      OpKind::kAllGather, g, in_elems * dt,
      {sent, part(p, st.full, ElemRange{0, md_.params[p].numel}, AccessMode::kWrite, true)});
  if (staged != kNoBuffer) free(staged, current_, Purpose::kOffloadCopy);
  unit_ = saved_unit;
}

// Several: a flat buffer, torch.cat of the shards into this rank's partition, one
// collective; the per-parameter copies out of it happen at wait() (PP:664-703).
void RankBuilder::all_gather_flat(Handle& h, GroupId g, bool use_secondary, int rank_in_group) {
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const std::uint64_t partition_sz = lay_out_partition(h, use_secondary);
  h.coalesced = true;
  h.flat = buffer("allgather.flat", BufferRole::kScratch, kNoUnit,
                  partition_sz * static_cast<std::uint64_t>(h.group_size) * dt);
  alloc(h.flat, current_, purpose_);
  h.flat_stream = current_;
  const std::uint64_t base = partition_sz * static_cast<std::uint64_t>(rank_in_group) * dt;
  // offload_param: the list comprehension inside torch.cat, `p.ds_secondary_tensor.to(device)`
  // (or ds_tensor's) for each parameter on S_ag (PP:1137-1143 at v0.13.4), before the cat.
  std::vector<Access> reads;
  std::vector<BufferId> staged;
  for (const int p : h.params) {
    reads.push_back(shard_read(p, use_secondary, rank_in_group));
    const UnitId saved_unit = unit_;
    unit_ = p;
    staged.push_back(stage_to_device(*this, current_, purpose_, reads.back(),
                                     md_.params[p].name + ".to_device", p));
    unit_ = saved_unit;
  }
  Op& cat = push(OpKind::kCopy, current_, purpose_);
  cat.unit = h.params[0];
  // The collective sends this rank's whole partition, but only the parameters' own elements
  // in it mean anything: a shard's padding is never written (init above), and each
  // parameter's copy out of the flat buffer drops it (wait_handle). So the send reads what the
  // torch.cat wrote, adjacent slots as one range.
  std::vector<Access> sent;
  for (std::size_t i = 0; i < h.params.size(); ++i) {
    const int p = h.params[i];
    const ElemRange mine = use_secondary ? layouts_[p].secondary_slice(rank_in_group)
                                         : layouts_[p].primary_slice(rank_);
    const Access a = reads[i];
    if (a.bytes > 0) out_.accesses.push_back(a);
    const ElemRange v = layouts_[p].valid(mine);
    if (!v.empty()) {
      const Access w{h.flat, AccessMode::kWrite, base + (h.offsets[i] + v.begin - mine.begin) * dt,
                     v.size() * dt};
      out_.accesses.push_back(w);
      if (!sent.empty() && sent.back().end() == w.offset) {
        sent.back().bytes += w.bytes;
      } else {
        sent.push_back({h.flat, AccessMode::kRead, w.offset, w.bytes});
      }
    }
    cat.mem_bytes += 2.0 * static_cast<double>(v.size() * dt);
  }
  cat.access_count = static_cast<std::uint32_t>(out_.accesses.size() - cat.access_begin);
  for (const BufferId b : staged) {  // the list is dropped once the cat has run
    if (b != kNoBuffer) free(b, current_, Purpose::kOffloadCopy);
  }
  const UnitId saved_unit = unit_;
  unit_ = h.params[0];
  sent.push_back({h.flat, AccessMode::kWrite, 0,
                  partition_sz * static_cast<std::uint64_t>(h.group_size) * dt});
  h.end = collective(OpKind::kAllGather, g, partition_sz * dt, sent);
  unit_ = saved_unit;
}

// What a gather reads of parameter p on this rank: its slice of the secondary (hpZ group) or of
// the primary (world).
Access RankBuilder::shard_read(int p, bool use_secondary, int rank_in_group) const {
  const ElemRange mine =
      use_secondary ? layouts_[p].secondary_slice(rank_in_group) : layouts_[p].primary_slice(rank_);
  return part(p, use_secondary ? ps_[p].secondary : ps_[p].primary, mine, AccessMode::kRead, false);
}

// A coalesced gather's per-rank partition (PP:1262-1265): each parameter's shard (or secondary)
// back to back; its offsets and chunks go into the handle, its size is returned.
std::uint64_t RankBuilder::lay_out_partition(Handle& h, bool use_secondary) const {
  std::uint64_t partition_sz = 0;
  for (int p : h.params) {
    h.offsets.push_back(partition_sz);
    const std::uint64_t n =
        use_secondary ? layouts_[p].secondary_numel() : layouts_[p].shard_numel();
    h.chunk.push_back(n);
    partition_sz += n;
  }
  h.per_rank_elems = partition_sz;
  return partition_sz;
}

// qwZ (all_gather_coalesced with quantize, PP:1224-1247 for one parameter, 1260-1318 for
// several): the int8 gather buffer, the shard (or the torch.cat of the shards, on S_ag)
// quantized to int8 with one fp32 scale a group, then two all-gathers on the same group, the
// values' and the scales'. wait_handle dequantizes.
void RankBuilder::all_gather_quantized(Handle& h, GroupId g, bool use_secondary,
                                       int rank_in_group) {
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const auto group_size = static_cast<std::uint64_t>(h.group_size);
  h.quantized = true;
  const std::uint64_t partition_sz = lay_out_partition(h, use_secondary);
  h.coalesced = h.params.size() > 1;
  const UnitId saved_unit = unit_;
  unit_ = h.params[0];
  h.qbuf = buffer("allgather.int8", BufferRole::kQuantized, kNoUnit, partition_sz * group_size);
  h.q_stream = current_;
  alloc(h.qbuf, current_, purpose_);
  std::vector<Access> src;
  for (int p : h.params) src.push_back(shard_read(p, use_secondary, rank_in_group));
  const std::uint64_t groups = quantizer_groups(partition_sz, [&] {
    return "the gather of " + md_.params[h.params[0]].name +
           (h.params.size() > 1 ? " and " + std::to_string(h.params.size() - 1) + " more" : "");
  });
  const BufferId q =
      buffer("quantize.out", BufferRole::kQuantized, kNoUnit, partition_sz + groups * 4);
  BufferId cat = kNoBuffer;
  if (h.coalesced) {
    // torch.cat of the shards, then the quantize kernel on it.
    cat = buffer("allgather.cat", BufferRole::kScratch, kNoUnit, partition_sz * dt);
    alloc(cat, current_, purpose_);
    src.push_back({cat, AccessMode::kWrite, 0, partition_sz * dt});
    push(OpKind::kCopy, current_, purpose_, src).mem_bytes =
        2.0 * static_cast<double>(partition_sz * dt);
    src = {{cat, AccessMode::kRead, 0, partition_sz * dt}};
  }
  // From 0.19.6 (PR 8215) CUDAQuantizer.quantize first casts a parameter that is not fp16 to an
  // fp16 temporary (PP:890 at 0.19.8), which the kernel reads and which is dropped when quantize
  // returns, before the caller drops its torch.cat.
  BufferId half = kNoBuffer;
  std::uint64_t kernel_in = partition_sz * dt;
  if (half_cast()) {
    half = buffer("quantize.fp16", BufferRole::kScratch, kNoUnit, partition_sz * 2);
    alloc(half, current_, purpose_);
    src.push_back({half, AccessMode::kWrite, 0, partition_sz * 2});
    push(OpKind::kCopy, current_, purpose_, src).mem_bytes =
        static_cast<double>(partition_sz * dt + partition_sz * 2);
    src = {{half, AccessMode::kRead, 0, partition_sz * 2}};
    kernel_in = partition_sz * 2;
  }
  alloc(q, current_, purpose_);
  src.push_back({q, AccessMode::kWrite, 0, partition_sz + groups * 4});
  push(OpKind::kQuantize, current_, purpose_, src).mem_bytes =
      static_cast<double>(kernel_in + partition_sz + groups * 4);
  if (half != kNoBuffer) free(half, current_, purpose_);
  // The torch.cat was quantize()'s argument only: dropped when it returns (PP:1283-1290).
  if (h.coalesced) free(cat, current_, purpose_);
  h.sbuf = buffer("allgather.scales", BufferRole::kScratch, kNoUnit, groups * 4 * group_size);
  // The scales' buffer is made before the values' gather when several are gathered (PP:1292),
  // after it for one (PP:1234-1239).
  if (h.coalesced) alloc(h.sbuf, current_, purpose_);
  h.end = collective(OpKind::kAllGather, g, partition_sz,
                     {{q, AccessMode::kRead, 0, partition_sz},
                      {h.qbuf, AccessMode::kWrite, 0, partition_sz * group_size}});
  if (!h.coalesced) alloc(h.sbuf, current_, purpose_);
  h.scale_end = collective(OpKind::kAllGather, g, groups * 4,
                           {{q, AccessMode::kRead, partition_sz, groups * 4},
                            {h.sbuf, AccessMode::kWrite, 0, groups * 4 * group_size}});
  // quantized_param and scales are the function's locals: dropped when it returns with the
  // handle (PP:1247, 1318); the collectives' own use is the allocator's business (record_stream).
  free(q, current_, purpose_);
  unit_ = saved_unit;
}

// AllGatherHandle.wait (PP:631-638) and AllGatherCoalescedHandle.wait (PP:664-703): the current
// stream (S_ag) waits for the NCCL end event; a coalesced gather then cats each parameter out
// of the flat buffer.
void RankBuilder::wait_handle(int hid) {
  Handle& h = handles_[hid];
  if (h.complete) return;
  const Purpose hp = Purpose::kNcclHandshake;
  wait(current_, h.end, hp);
  if (h.quantized) dequantize(h);
  if (h.coalesced) {
    for (std::size_t i = 0; i < h.params.size(); ++i) copy_out(h, i);
  }
  for (int p : h.params) ps_[p].status = Status::kAvailable;
  h.complete = true;
}

// A qwZ gather's end: the scales' handle waited for too, then dequantize (CUDAQuantizer.dequantize,
// PP:761): one kernel writes the parameter (one gathered) or a flat tensor of them all (several).
void RankBuilder::dequantize(Handle& h) {
  const Purpose hp = Purpose::kNcclHandshake;
  wait(current_, h.scale_end, hp);
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const std::uint64_t per_rank = h.per_rank_elems;
  const std::uint64_t total = per_rank * static_cast<std::uint64_t>(h.group_size);
  BufferId out = kNoBuffer;
  std::uint64_t out_bytes = 0;
  std::uint64_t out_elem = dt;  // the kernel's output element: fp16 where a cast follows
  if (h.coalesced) {
    out = h.flat = buffer("allgather.dequantized", BufferRole::kScratch, kNoUnit, total * dt);
    h.flat_stream = current_;
    out_bytes = total * dt;
    alloc(out, current_, Purpose::kFetchWait);
  } else if (half_cast()) {
    // From 0.19.6 (PR 8215): dequantize(..., dtype=param.dtype) writes the kernel's fp16
    // output, then casts it to the parameter's dtype; the fp16 tensor is dropped at the
    // reassignment (PP:727-730, 896-901 at 0.19.8).
    const std::uint64_t numel = md_.params[h.params[0]].numel;
    out = buffer("dequantize.fp16", BufferRole::kScratch, kNoUnit, numel * 2);
    out_bytes = numel * 2;
    out_elem = 2;
    alloc(out, current_, Purpose::kFetchWait);
  } else {
    const int p = h.params[0];
    const UnitId saved = unit_;
    unit_ = p;
    alloc(ps_[p].full, current_, Purpose::kFetchWait);
    unit_ = saved;
    out = ps_[p].full;
    out_bytes = md_.params[p].numel * dt;
  }
  const UnitId saved = unit_;
  unit_ = h.params[0];
  push(OpKind::kDequantize, current_, Purpose::kParamFetch,
       {{h.qbuf, AccessMode::kRead, 0, std::min(total, out_bytes / out_elem)},
        {h.sbuf, AccessMode::kRead, 0, out_.buffers[h.sbuf].bytes},
        {out, AccessMode::kWrite, 0, out_bytes}})
      .mem_bytes = static_cast<double>(total + out_bytes);
  if (!h.coalesced && half_cast()) {
    const int p = h.params[0];
    const std::uint64_t numel = md_.params[p].numel;
    alloc(ps_[p].full, current_, Purpose::kFetchWait);
    push(OpKind::kCopy, current_, Purpose::kParamFetch,
         {{out, AccessMode::kRead, 0, numel * 2}, {ps_[p].full, AccessMode::kWrite, 0, numel * dt}})
        .mem_bytes = static_cast<double>(numel * 2 + numel * dt);
    free(out, current_, Purpose::kFetchWait);
  }
  unit_ = saved;
}

// A coalesced gather's parameter i copied out of the flat buffer into its full buffer.
void RankBuilder::copy_out(Handle& h, std::size_t i) {
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const int p = h.params[i];
  const UnitId saved = unit_;
  unit_ = p;
  alloc(ps_[p].full, current_, Purpose::kFetchWait);
  Op& cat = push(OpKind::kCopy, current_, Purpose::kParamFetch);
  const std::uint64_t numel = md_.params[p].numel;
  // One slice per rank that holds some of p (PP:688-694), each at p's offset in that rank's
  // partition: one strided read for the ranks whose chunk is whole, one plain read for a
  // last, shorter one (the rest of the world holds padding).
  const std::uint64_t chunk = h.chunk[i];
  const std::uint64_t whole =
      chunk == 0 ? 0
                 : std::min<std::uint64_t>(numel / chunk, static_cast<std::uint64_t>(h.group_size));
  const std::uint64_t stride = h.per_rank_elems * dt;
  if (whole > 1 && whole <= std::numeric_limits<std::uint16_t>::max() &&
      stride <= std::numeric_limits<std::uint32_t>::max()) {
    Access a{h.flat, AccessMode::kRead, h.offsets[i] * dt, chunk * dt};
    a.count = static_cast<std::uint16_t>(whole);
    a.stride = static_cast<std::uint32_t>(stride);
    out_.accesses.push_back(a);
  } else {  // one slice, or beyond what Access's count and stride hold: slice by slice
    for (std::uint64_t r = 0; r < whole; ++r) {
      out_.accesses.push_back(
          {h.flat, AccessMode::kRead, r * stride + h.offsets[i] * dt, chunk * dt});
    }
  }
  if (whole < static_cast<std::uint64_t>(h.group_size) && whole * chunk < numel) {
    out_.accesses.push_back({h.flat, AccessMode::kRead,
                             (whole * h.per_rank_elems + h.offsets[i]) * dt,
                             (numel - whole * chunk) * dt});
  }
  out_.accesses.push_back({ps_[p].full, AccessMode::kWrite, 0, numel * dt});
  cat.access_count = static_cast<std::uint32_t>(out_.accesses.size() - cat.access_begin);
  cat.mem_bytes = 2.0 * static_cast<double>(numel * dt);
  unit_ = saved;
}

}  // namespace hpz::deepspeed
