// The stage-3 optimizer: its param groups and sub-groups, the step (overflow check, gradient
// norm, update, offload write-back), the secondaries' invalidation and the persistent gather.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "sim/deepspeed/rank_builder.hpp"
#include "sim/model_shape.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

// DeepSpeedZeroOptimizer_Stage3.step (S3:2016-2060): release everything still gathered
// (release_and_reset_all, PO:162), the global gradient norm, Adam on the primary shards,
// invalidate the secondaries (_post_step, S3:1991). The script's loss.item() follows in build().
void RankBuilder::optimizer_step() {
  phase_ = Phase::kOptimizer;
  purpose_ = Purpose::kParamRelease;
  for (const int p : optimized_) {
    ps_[p].active.clear();
    release_param_as(p, kNoLabel);
  }
  // release_and_reset_all's own reset, 0.16.0-0.16.7 only (COORD:432 at v0.16.0; PR 7258 moved
  // it back into reset_step). Elsewhere the count runs on, below zero after a reset, as
  // DeepSpeed's does.
  if (v_.available_kept_across_reset) n_available_ = 0;
  const bool overflow_checked = checks_overflow(sc_, v_);
  if (overflow_checked) overflow_check();
  // run.skipped_steps: a step whose gradients overflowed returns right after the check
  // (_overflow_check_and_loss_scale_update, then `return`: S3:2023-2027 at v0.13.4, S3:2880-2894
  // at 0.19.8): no norm, no update, no persistent gather, no invalidation. Held to
  // tiny-0.19.8-torch2.10-fp16-overflow.
  const bool skipped =
      std::binary_search(sc_.run.skipped_steps.begin(), sc_.run.skipped_steps.end(), step_);
  if (skipped && overflow_checked) return;
  purpose_ = Purpose::kGradNorm;
  // _get_norm_groups: get_grad_norm_direct per sub-group, each its own all-reduce of the summed
  // squares (S3:1702-1740 at v0.13.4); up to 0.12.6 each followed by its `.item()`.
  const std::vector<std::vector<int>>& groups = sub_groups_;
  const bool sync_each = v_.grad_norm_sync == NormSync::kAfterNorm && v_.norm_sync_per_sub_group;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const EventId norm = collective(OpKind::kAllReduce, reduce_group(), 8, {});
    wait(current_, norm, Purpose::kGradNorm);
    if (sync_each) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
  }
  switch (v_.grad_norm_sync) {
    case NormSync::kAfterNorm:  // math.sqrt of the norm tensor (get_global_norm)
      if (!sync_each) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
      break;
    case NormSync::kWhenClipping:  // per sub-group, with its update (below)
      break;
    case NormSync::kNone:
      break;
  }
  // 0.19.8: is_invalid_grad_norm's bool() of the combined norm (S3:2878-2893).
  if (v_.norm_validity_sync) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
  // 0.19.8's invalid norm (bf16, fp32): overflow set, then the same cleanup and `return`
  // (S3:2888-2894).
  if (skipped) return;
  // Each sub-group in turn (S3:2111-2126 at v0.16.4): unscale_and_clip_grads, whose
  // `if clip > 1` on a device tensor waits for it in 0.14.1-0.14.2 (S3:2109-2118 at v0.14.2);
  // _optimizer_step, Adam over the sub-group's fp32 partition; then its primaries written back
  // (_reassign_or_swap_out_partitioned_parameters). The recorder runs torch's AdamW in place of
  // FusedAdam (a CUDA kernel that reads nothing back); each of its steps logs one more host sync
  // of S0 (docs/record.md: every .item() is logged as a sync on the CPU), issued only to compare
  // with a recording (RunConfig::as_recorded): a GPU run has no such sync, and it would order
  // what the optimizer's step leaves unordered.
  const bool clip_sync =
      v_.grad_norm_sync == NormSync::kWhenClipping && sc_.training.gradient_clipping > 0;
  for (const std::vector<int>& group : groups) {
    if (clip_sync) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
    push(OpKind::kKernel, s0_, Purpose::kOptimizerStep, {{grad_shard_, AccessMode::kRead, 0, 0}});
    if (sc_.run.as_recorded) push(OpKind::kHostStreamSync, s0_, Purpose::kOptimizerStep);
    if (offload_.enabled) {
      offload_write_back(group);
      continue;
    }
    for (const int p : group) {
      unit_ = static_cast<UnitId>(p);
      const ElemRange pri = layouts_[p].primary_slice(rank_);
      push(OpKind::kKernel, s0_, Purpose::kOptimizerStep,
           {{grad_shard_, AccessMode::kRead, 0, 0},
            part(p, ps_[p].primary, pri, AccessMode::kRead, false),
            part(p, ps_[p].primary, pri, AccessMode::kWrite, false)})
          .mem_bytes = 16.0 * static_cast<double>(layouts_[p].shard_numel());
    }
    unit_ = kNoUnit;  // the next sub-group's step names no parameter
  }
  gather_persistent();
  if (v_.invalidate_after_step) invalidate_secondaries();
}

// offload_param: _reassign_or_swap_out_partitioned_parameters (S3:1999-2004 at v0.13.4,
// S3:2760-2766 at v0.19.8) copies the sub-group's updated fp32 partition, on the device without
// offload_optimizer (S3:225), into its fp16 flat buffer, which is pinned host memory
// (S3:652-655): one device-to-host copy_ without non_blocking, which the host waits for
// (offload.hpp); the primaries are views of that buffer (S3:1945-1950).
void RankBuilder::offload_write_back(const std::vector<int>& group) {
  std::vector<Access> written;
  double bytes = 0;
  for (const int p : group) {
    const ElemRange pri = layouts_[p].primary_slice(rank_);
    written.push_back(part(p, ps_[p].primary, pri, AccessMode::kWrite, false));
    bytes += static_cast<double>(layouts_[p].shard_numel() * (4 + dt_));
  }
  unit_ = group.empty() ? kNoUnit : static_cast<UnitId>(group.front());
  push(OpKind::kCopy, s0_, Purpose::kOptimizerStep, std::span<const Access>(written)).mem_bytes =
      bytes;
  push(OpKind::kHostStreamSync, s0_, Purpose::kOffloadCopy);
  unit_ = kNoUnit;
}

// invalidate_secondary_tensor (S3:568-572 at v0.18.2): every optimized parameter's secondary,
// in fp16_groups order (S3:465-468 at v0.13.4), dropped, freed on the compute stream.
void RankBuilder::invalidate_secondaries() {
  for (const int p : fp16_order_) {
    if (!ps_[p].has_secondary) continue;
    unit_ = static_cast<UnitId>(p);
    free(ps_[p].secondary, s0_, Purpose::kSecondaryInvalidate);
    ps_[p].has_secondary = false;
    ps_[p].secondary_ready = kNoEvent;
  }
  unit_ = kNoUnit;
}

// _overflow_check_and_loss_scale_update -> has_overflow (S3:2696-2730 at v0.19.5, S3:2016-2049
// at v0.11.1): the inf/nan tracker and its uint8 clone on S_rs, read from the gradient
// partitions; the default stream waits for S_rs; a 1-byte MAX all-reduce over the gradients'
// group from the current stream, waited for there; `overflow_gpu[0].item()`. A step without an
// overflow goes on (the skipped step is data-dependent and not modelled).
void RankBuilder::overflow_check() {
  purpose_ = Purpose::kGradNorm;
  push(OpKind::kKernel, srs_, Purpose::kGradNorm, {{grad_shard_, AccessMode::kRead, 0, 0}});
  wait_stream(s0_, srs_, Purpose::kGradNorm);
  const EventId done = collective(OpKind::kAllReduce, grad_group_, 1, {});
  wait(current_, done, Purpose::kGradNorm);
  push(OpKind::kHostStreamSync, current_, Purpose::kGradNorm);
}

// The optimizer's param groups. "model": one, model.parameters() (the recorder's AdamW, and
// DeepSpeed's own optimizer). "hf-trainer": Trainer.create_optimizer's two, the parameters
// get_decay_parameter_names names first, then the others, each in named_parameters order
// (transformers 4.51.3 trainer.py:1200-1224). get_decay_parameter_names leaves out every
// parameter inside a module of a class in ALL_LAYERNORM_LAYERS: nn.LayerNorm (GPT-2's,
// GPT-NeoX's and Falcon's norms) and, up to 4.51.3, LlamaRMSNorm, which modeling_llama.py
// appends to that list when it is imported (line 110 at 4.35.2; Mistral's, Qwen's and Gemma's
// norms are classes of their own); 4.57.1 and 5.24.0 append nothing. And, by its name in lower
// case:
// 4.35.2 one containing "bias" (trainer.py:935-944); 4.51.3 also "layernorm" or "rmsnorm"
// (trainer.py:1189-1198, trainer_pt_utils.py:1122-1141); 4.57.1 and 5.24.0 also "norm" as a
// whole component of the name or a component ending in "_norm" (trainer.py:1408-1418 at 5.24.0,
// 1274 at 4.57.1).
std::vector<std::vector<int>> RankBuilder::make_param_groups() const {
  if (sc_.training.param_groups != "hf-trainer") return {optimized_};
  const std::string tf = transformers_version_of(sc_.model, sc_.run.torch_version);
  const std::string& f = sc_.model.family;
  const bool layer_norm_class = f == "gpt2" || f == "gpt_neox" || f == "falcon" ||
                                (f == "llama" && (tf == "4.35.2" || tf == "4.51.3"));
  const auto decays = [&](int p) {
    const DsParam& param = md_.params[p];
    if (layer_norm_class && param.module >= 0 && md_.modules[param.module].kind == ModKind::kNorm) {
      return false;
    }
    std::string name = param.name;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name.find("bias") != std::string::npos) return false;
    if (tf == "4.35.2") return true;
    if (name.find("layernorm") != std::string::npos || name.find("rmsnorm") != std::string::npos) {
      return false;
    }
    if (tf == "4.51.3") return true;
    // (?:^|\.)norm(?:$|\.) and _norm(?:$|\.): a component "norm" or ending in "_norm".
    std::size_t from = 0;
    while (from <= name.size()) {
      const std::size_t dot = std::min(name.find('.', from), name.size());
      const std::string part = name.substr(from, dot - from);
      if (part == "norm" || part.ends_with("_norm")) return false;
      from = dot + 1;
    }
    return true;
  };
  std::vector<std::vector<int>> groups(2);
  for (const int p : optimized_) groups[decays(p) ? 0 : 1].push_back(p);
  return groups;
}

// _create_fp16_sub_groups (S3:903-925 at v0.13.4), per param group
// (_create_fp16_partitions_with_defragmentation, S3:661-673): a group whole if its partitions'
// elements do not pass zero.sub_group_size; else cut after each parameter that brings the
// running count to sub_group_size or more, and after the last. An empty group (a model with
// nothing the Trainer exempts from weight decay) is one empty sub-group, as DeepSpeed's.
std::vector<std::vector<int>> RankBuilder::make_sub_groups(
    const std::vector<std::vector<int>>& param_groups) const {
  const auto size = static_cast<std::uint64_t>(sc_.zero.sub_group_size);
  std::vector<std::vector<int>> out;
  for (const std::vector<int>& group : param_groups) {
    std::uint64_t total = 0;
    for (const int p : group) total += layouts_[p].shard_numel();
    if (size >= total) {
      out.push_back(group);
      continue;
    }
    out.emplace_back();
    std::uint64_t running = 0;
    for (const int p : group) {
      out.back().push_back(p);
      running += layouts_[p].shard_numel();
      if (running >= size && p != group.back()) {
        out.emplace_back();
        running = 0;
      }
    }
  }
  return out;
}

// _post_step (S3:1984-1986): persistent_parameters[0].all_gather(persistent_parameters), a
// blocking gather of every persistent parameter (all released by release_and_reset_all). One
// parameter goes through _allgather_params (PP:1822) as at init; several through
// _allgather_params_coalesced (PP:1718-1820): a full-size buffer each, one async
// all_gather_into_tensor each from the primary on ds_process_group (the world), a wait on the
// last handle only, the buffers become the parameters' data, and a device synchronize.
void RankBuilder::gather_persistent() {
  std::vector<int> list;
  for (int p = 0; p < static_cast<int>(md_.params.size()); ++p) {
    const DsParam& dp = md_.params[p];
    if (dp.persist && !dp.orphan && ps_[p].status == Status::kNotAvailable) list.push_back(p);
  }
  if (list.empty()) return;
  const Purpose saved_purpose = purpose_;
  purpose_ = Purpose::kOptimizerStep;
  gather_blocking_list(list);
  purpose_ = saved_purpose;
}

}  // namespace hpz::deepspeed
