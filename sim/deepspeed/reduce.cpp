// Stage 3's gradient reduction: the bucket, its reduce-scatter, and qgZ's all-to-all reduction.
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "sim/deepspeed/rank_builder.hpp"
#include "sim/error.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

// The gradient hook (S3:1213-1245): S_rs waits for the compute stream, the gradient is copied
// into the bucket on S_rs; a full bucket is reduced first.
void RankBuilder::grad_ready(int p) {
  const Phase saved = phase_;
  phase_ = Phase::kGradReduce;
  purpose_ = Purpose::kGradReduce;
  const std::uint64_t numel = md_.params[p].numel;
  // reduce_independent_p_g_buckets_and_remove_grads (S3:1213-1228), reduce_bucket_size in
  // elements (zero.reduce_bucket_size).
  const auto bucket = static_cast<std::uint64_t>(sc_.zero.reduce_bucket_size);
  if (ipg_elems_ + numel > bucket && ipg_elems_ > 0) reduce_ipg();
  // __add_grad_to_ipg_bucket waits on the default stream (S3:1363 at v0.18.7), from v0.18.8 on
  // the current one, the stream the gradient hook runs on (PR 7897): the compute stream,
  // S_step where run.step_stream = "side" (with torch 2.10 or later, the stream the forward
  // ran on: issue 7898).
  wait_stream(srs_, v_.reduce_waits_current_stream ? current_ : s0_, Purpose::kGradReduce);
  // __add_grad_to_ipg_bucket (S3:1230-1245): a gradient that fits is moved into the flat
  // bucket; one that does not (a vocabulary-sized embedding above reduce_bucket_size) stays
  // where it is and is reduced from there, alone.
  // v0.10.0-v0.10.3 compare with `<` (S3:1088 at v0.10.0).
  if (v_.bucket_strict_bound ? ipg_elems_ + numel < bucket : ipg_elems_ + numel <= bucket) {
    push(OpKind::kCopy, srs_, Purpose::kGradReduce,
         {{ps_[p].grad, AccessMode::kRead, 0, numel * dt_},
          {ipg_buffer_, AccessMode::kWrite, ipg_elems_ * dt_, numel * dt_}})
        .mem_bytes = 2.0 * static_cast<double>(numel * dt_);
    ipg_grad_[p] = {ipg_buffer_, AccessMode::kRead, ipg_elems_ * dt_, numel * dt_};
  } else {
    ipg_grad_[p] = {ps_[p].grad, AccessMode::kRead, 0, numel * dt_};
  }
  ipg_params_.push_back(p);
  ipg_elems_ += numel;
  phase_ = saved;
}

// __reduce_and_partition_ipg_grads (S3:1249-1300): throttle, then on S_rs one reduce-scatter of
// the bucket over the cloned world group, waited for at once, and an event for the throttle.
void RankBuilder::reduce_ipg() {
  if (ipg_params_.empty()) return;
  const Phase saved = phase_;
  phase_ = Phase::kGradReduce;
  purpose_ = Purpose::kGradReduce;
  if (param_reduce_events_.size() > 2) {
    push(OpKind::kHostEventSync, kHostStream, Purpose::kHostThrottle).event =
        param_reduce_events_.front();
    param_reduce_events_.pop_front();
  }
  const StreamId saved_stream = current_;
  current_ = srs_;
  if (sc_.zero.zero_quantized_gradients && sc_.cluster.nodes > 1) {
    reduce_quantized();
  } else {
    std::uint64_t bytes = 0;
    for (const int p : ipg_params_) bytes += md_.params[p].numel * dt_;
    // __avg_scatter_grads hands the bucket's gradients as a list to reduce_scatter_coalesced
    // (S3:1330-1343; coalesced_collectives.py 84-150 at v0.13.4), which pads each tensor to
    // ceil(numel / world) elements a rank, a primary shard's size: this rank's output is the
    // sum of those.
    std::uint64_t shard = 0;
    for (const int p : ipg_params_) shard += layouts_[p].shard_numel() * dt_;
    std::vector<Access> acc;
    bool in_bucket = true;
    for (const int p : ipg_params_) in_bucket = in_bucket && ipg_grad_[p].buffer == ipg_buffer_;
    if (in_bucket) {  // consecutive in the flat buffer, from the first one's offset
      acc.push_back(
          {ipg_buffer_, AccessMode::kRead, ipg_grad_.at(ipg_params_.front()).offset, bytes});
    } else {
      for (const int p : ipg_params_) acc.push_back(ipg_grad_[p]);
    }
    acc.push_back({grad_shard_, AccessMode::kWrite, 0, shard});
    const EventId done = collective(OpKind::kReduceScatter, reduce_group(), shard, std::move(acc));
    wait(srs_, done, Purpose::kGradReduce);
  }
  param_reduce_events_.push_back(record(srs_, Purpose::kGradReduce));
  current_ = saved_stream;
  ipg_params_.clear();
  ipg_grad_.clear();
  if (!v_.bucket_count_never_reset) ipg_elems_ = 0;
  phase_ = saved;
}

// qgZ: __avg_scatter_grads (S3:1327-1341) hands the bucket's gradients, by ds_id, to
// all_to_all_quant_reduce (runtime/comm/coalesced_collectives.py:30-76 at v0.13.4), on S_rs. A
// 1-D gradient, or one whose numel is not a multiple of 2 x world, goes through
// reduce_scatter_coalesced([g]) with no group: the world group (44-52). Every other one is
// quantized to int4 (swizzle_quant), all-to-all'd with its scales in the node, dequantized,
// reduced and requantized (quantized_reduction), all-to-all'd with its scales across nodes, and
// dequantized and averaged over the nodes (53-74). Every collective is blocking (the current
// stream waits for it). Sizes are the CUDA bindings' (csrc/quantization/pt_binding.cpp:179-250):
// int4 packs two values a byte, one fp32 scale a group (symmetric), `max(rows, cols, world)`
// groups in the node and that over the GPUs of a node across nodes.
void RankBuilder::reduce_quantized() {
  std::vector<int> params = ipg_params_;
  std::sort(params.begin(), params.end());
  const std::uint64_t local = static_cast<std::uint64_t>(sc_.cluster.gpus_per_node);
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  for (int p : params) {
    const DsParam& dp = md_.params[p];
    const Access grad = ipg_grad_.at(p);
    const std::uint64_t shard = layouts_[p].shard_numel() * dt;
    const Access out{grad_shard_, AccessMode::kWrite, 0, shard};
    const bool divides = dp.numel % (2 * static_cast<std::uint64_t>(world_)) == 0;
    if (dp.rows != 0 && !divides && v_.qgz_no_fallback) {
      // Before 0.13.2 such a gradient goes to the all-to-all too, which cannot split it
      // (coalesced_collectives.py:41-46 at v0.13.1; PR 5056).
      throw ReleaseRefusal(
          sc_.path, "zero.deepspeed_version",
          fmt::format("DeepSpeed {} raises at qgZ's all-to-all of the gradient of {} ({} "
                      "elements, not a multiple of 2 x world = {}: PR 5056 falls back to "
                      "reduce_scatter from 0.13.2); allowed: 0.13.2 or later, another world, or "
                      "zero_quantized_gradients off",
                      v_.name, dp.name, dp.numel, 2 * world_));
    }
    if (dp.rows == 0 || !divides) {
      // reduce_scatter_coalesced (84-150): the (padded) flat tensor divided, then one
      // reduce-scatter whose output is this rank's chunk.
      push(OpKind::kKernel, srs_, Purpose::kGradReduce, {grad}).mem_bytes =
          2.0 * static_cast<double>(dp.numel * dt);
      const EventId done = collective(OpKind::kReduceScatter, world_group_, shard, {grad, out});
      wait(srs_, done, Purpose::kGradReduce);
      continue;
    }
    const std::uint64_t cols = dp.numel / dp.rows;
    const std::uint64_t intra_groups =
        std::max({dp.rows, cols, static_cast<std::uint64_t>(world_)});
    const std::uint64_t inter_groups = intra_groups / local;
    const std::uint64_t q1 = dp.numel / 2, s1 = intra_groups * 4;
    const std::uint64_t q2 = q1 / local, s2 = inter_groups * 4;
    const BufferId qa = buffer("qgz.q", BufferRole::kScratch, kNoUnit, q1 + s1);
    const BufferId qb = buffer("qgz.q_recv", BufferRole::kScratch, kNoUnit, q1 + s1);
    const BufferId qc = buffer("qgz.q2", BufferRole::kScratch, kNoUnit, q2 + s2);
    const BufferId qd = buffer("qgz.q2_recv", BufferRole::kScratch, kNoUnit, q2 + s2);
    for (BufferId b : {qa, qb}) alloc(b, srs_, Purpose::kGradReduce);
    push(OpKind::kQuantize, srs_, Purpose::kGradReduce,
         {grad, {qa, AccessMode::kWrite, 0, q1 + s1}})
        .mem_bytes = static_cast<double>(dp.numel * dt + q1 + s1);
    auto all_to_all = [&](GroupId g, BufferId from, BufferId to, std::uint64_t at,
                          std::uint64_t bytes) {
      const EventId done =
          collective(OpKind::kAllToAll, g, bytes,
                     {{from, AccessMode::kRead, at, bytes}, {to, AccessMode::kWrite, at, bytes}});
      wait(srs_, done, Purpose::kGradReduce);
    };
    all_to_all(intra_group_, qa, qb, 0, q1);
    all_to_all(intra_group_, qa, qb, q1, s1);
    for (BufferId b : {qc, qd}) alloc(b, srs_, Purpose::kGradReduce);
    push(OpKind::kDequantize, srs_, Purpose::kGradReduce,
         {{qb, AccessMode::kRead, 0, q1 + s1}, {qc, AccessMode::kWrite, 0, q2 + s2}})
        .mem_bytes = static_cast<double>(q1 + s1 + q2 + s2);
    all_to_all(inter_group_, qc, qd, 0, q2);
    all_to_all(inter_group_, qc, qd, q2, s2);
    push(OpKind::kDequantize, srs_, Purpose::kGradReduce,
         {{qd, AccessMode::kRead, 0, q2 + s2}, out})
        .mem_bytes = static_cast<double>(q2 + s2 + shard);
  }
}

}  // namespace hpz::deepspeed
