#include "sim/deepspeed_releases.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <string>

#include "sim/error.hpp"

// Citations: PP = deepspeed/runtime/zero/partition_parameters.py, COORD =
// partitioned_param_coordinator.py, PO = parameter_offload.py, S3 = stage3.py, each at the tag
// the rule names (deepspeedai/DeepSpeed; 0.19.6 to 0.19.8 from their PyPI sdists, which no tag of
// the snapshot read holds).

namespace hpz {
namespace {

// Tags of deepspeedai/DeepSpeed from v0.10.0, the first holding PR 3784 (ZeRO++), with
// `git log -1 --format=%cs`; 0.19.6 to 0.19.8 with their sdists' dates on PyPI.
const std::vector<DeepSpeedRelease> kReleases = {
    {"0.10.0", "2023-07-17"}, {"0.10.1", "2023-08-18"}, {"0.10.2", "2023-08-31"},
    {"0.10.3", "2023-09-11"}, {"0.11.0", "2023-10-06"}, {"0.11.1", "2023-10-09"},
    {"0.11.2", "2023-10-31"}, {"0.12.0", "2023-11-03"}, {"0.12.1", "2023-11-03"},
    {"0.12.2", "2023-11-03"}, {"0.12.3", "2023-11-10"}, {"0.12.4", "2023-11-30"},
    {"0.12.5", "2023-12-15"}, {"0.12.6", "2023-12-20"}, {"0.13.0", "2024-01-19"},
    {"0.13.1", "2024-01-23"}, {"0.13.2", "2024-02-10"}, {"0.13.3", "2024-02-23"},
    {"0.13.4", "2024-02-26"}, {"0.13.5", "2024-03-05"}, {"0.14.0", "2024-03-07"},
    {"0.14.1", "2024-04-15"}, {"0.14.2", "2024-04-23"}, {"0.14.3", "2024-06-12"},
    {"0.14.4", "2024-06-20"}, {"0.14.5", "2024-08-15"}, {"0.15.0", "2024-08-22"},
    {"0.15.1", "2024-09-04"}, {"0.15.2", "2024-10-09"}, {"0.15.3", "2024-10-22"},
    {"0.15.4", "2024-11-06"}, {"0.16.0", "2024-11-25"}, {"0.16.1", "2024-12-05"},
    {"0.16.2", "2024-12-18"}, {"0.16.3", "2025-01-21"}, {"0.16.4", "2025-02-20"},
    {"0.16.5", "2025-03-27"}, {"0.16.6", "2025-04-16"}, {"0.16.7", "2025-04-18"},
    {"0.16.8", "2025-05-19"}, {"0.16.9", "2025-05-22"}, {"0.17.0", "2025-06-02"},
    {"0.17.1", "2025-06-09"}, {"0.17.2", "2025-07-06"}, {"0.17.3", "2025-07-26"},
    {"0.17.4", "2025-07-31"}, {"0.17.5", "2025-08-19"}, {"0.17.6", "2025-09-19"},
    {"0.18.0", "2025-10-07"}, {"0.18.1", "2025-10-23"}, {"0.18.2", "2025-11-04"},
    {"0.18.3", "2025-12-09"}, {"0.18.4", "2026-01-07"}, {"0.18.5", "2026-01-29"},
    {"0.18.6", "2026-02-12"}, {"0.18.7", "2026-03-05"}, {"0.18.8", "2026-03-13"},
    {"0.18.9", "2026-03-30"}, {"0.19.0", "2026-05-06"}, {"0.19.1", "2026-05-25"},
    {"0.19.2", "2026-06-16"}, {"0.19.3", "2026-07-22"}, {"0.19.4", "2026-08-06"},
    {"0.19.5", "2026-08-09"}, {"0.19.6", "2026-08-27"}, {"0.19.7", "2026-09-16"},
    {"0.19.8", "2026-10-20"},
};

// The rules, oldest first, read release by release in deepspeedai/DeepSpeed's ZeRO-3 files
// (docs/deepspeed-releases.md). Each modelled one changes VersionRules from the state before it;
// the state before the first is VersionRules's defaults, v0.13.0-v0.13.1's behaviour. A rule
// with `until` holds from `first` up to the release before `until`.
const std::vector<ReleaseRule> kRules = {
    // v0.10.0 to v0.12.6: ZeRO++ (PR 3784) as it first shipped, before the state the builder
    // starts from.
    {.id = "loss-item-off-boundary-only",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "engine.backward logs `loss.mean().item()` only on micro-steps that are not a "
             "gradient-accumulation boundary (ENG:1884 at v0.10.0): no host sync before the "
             "backward of a step's last micro-batch",
     .apply = [](VersionRules& v) { v.loss_item_off_boundary_only = true; }},
    {.id = "loss-item-every-micro-step",
     .pr = "PR 4030",
     .first = "0.10.1",
     .what = "`self.losses += loss.mean().item()` on every micro-step (ENG:1870 at v0.10.1): the "
             "host sync before each backward that the builder starts from",
     .ends = "loss-item-off-boundary-only"},
    {.id = "forward-gathers-never-use-secondary",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "every forward gather, no_grad ones too (reentrant checkpointing's first forward), "
             "gathers the primary over the world; only backward gathers read the secondary "
             "(PO:494, 516 at v0.10.0). PR 4232 lets no-grad forwards use it in v0.10.2",
     .apply = [](VersionRules& v) { v.forward_passes_grad_enabled = false; }},
    {.id = "no-grad-forward-uses-secondary",
     .pr = "PR 4232",
     .first = "0.10.2",
     .what = "the pre-forward hook passes forward=torch.is_grad_enabled() (PO:505 at v0.10.2): a "
             "forward under no_grad (reentrant checkpointing's first) gathers from the secondary",
     .ends = "forward-gathers-never-use-secondary"},
    {.id = "gradient-bucket-strict-bound",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "a gradient that exactly fills the bucket is not copied into the contiguous buffer "
             "(`<`, S3:1088 at v0.10.0, S3:1108 at v0.10.3) and is reduced from where it is",
     .apply = [](VersionRules& v) { v.bucket_strict_bound = true; }},
    {.id = "gradient-bucket-inclusive-bound",
     .pr = "PR 4321",
     .first = "0.11.0",
     .what = "`<=`: a gradient that exactly fills the bucket is copied into it (S3:1119)",
     .ends = "gradient-bucket-strict-bound"},
    {.id = "blocking-gathers-as-list-all-gather",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "`_allgather_params` (zero.Init's gather of each parameter, a single persistent "
             "parameter at the step) issues a list all_gather into narrowed views of its flat "
             "buffer (PP:1818 at v0.12.3); PR 4705 makes it all_gather_into_tensor in v0.12.4. "
             "Its accesses are the same; ProcessGroupNCCL's copy out of its own flattened "
             "output (allgather's post-hook, on the NCCL stream inside the collective) is part "
             "of the collective in the IR, as in the recordings (tiny-0.10.0 to tiny-0.12.3: "
             "one all_gather writing 16 slices of one buffer)",
     .apply = [](VersionRules&) {},
     .until = "0.12.4"},
    {.id = "grad-norm-sync-per-sub-group",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "the gradient norm's `.item()` after each sub-group's all-reduce (S3:1578 at "
             "v0.10.0, S3:1689 at v0.12.6): one host sync per sub-group; PR 4436 leaves one "
             "sync after all of them in v0.13.0 (S3:1969). With one sub-group both are one "
             "all-reduce and one sync. The recording tiny-0.12.6-sub-group-2000 (3 sub-groups) "
             "agrees",
     .apply = [](VersionRules& v) { v.norm_sync_per_sub_group = true; },
     .until = "0.13.0"},
    {.id = "qgz-without-reduce-scatter-fallback",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "qgZ sends every 2-D gradient through its two-stage all-to-all (CC:41-46 at "
             "v0.13.1); one whose size does not divide by twice the world cannot be split so, and "
             "DeepSpeed raises there (PR 5056's description), which the builder says in one "
             "line. PR 5056 sends those through reduce_scatter from v0.13.2 (CC:46). Held to "
             "recordings of 0.10.3 and 0.13.1 with qgZ",
     .apply = [](VersionRules& v) { v.qgz_no_fallback = true; },
     .until = "0.13.2",
     .when = RuleWhen::kQgz},
    {.id = "qgz-reduction-sized-for-16-gpus",
     .pr = "PR 4085",
     .first = "0.10.0",
     .what = "qgZ's quantized_reduction sizes its output for 16 GPUs a node whatever the node "
             "has (csrc/quantization/pt_binding.cpp:204 at v0.10.0, `gpu_per_node = 16`), so the "
             "inter-node all-to-all moves other sizes; PR 4085 passes the node's size from "
             "v0.10.1",
     .scope = RuleScope::kUnmodelled,
     .until = "0.10.1",
     .when = RuleWhen::kQgz},
    {.id = "overflow-check-every-dtype",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "the step checks for overflow in bf16 and fp32 too (S3:1799 at v0.10.0, "
             "`check_overflow` unconditional): the inf/nan tracker on S_rs, the default stream "
             "waits for S_rs, a 1-byte MAX all-reduce and its `.item()`, every step. PR 4512 "
             "restricts it to fp16 in v0.11.2 (S3:1847); fp16 keeps it in every release",
     .apply = [](VersionRules& v) { v.overflow_check_every_dtype = true; }},
    {.id = "overflow-check-fp16-only",
     .pr = "PR 4512",
     .first = "0.11.2",
     .what = "`if self.dtype == torch.float16: self.check_overflow()` (S3:1847)",
     .ends = "overflow-check-every-dtype"},
    {.id = "invalidate-after-step-early",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "`invalidate_secondary_tensor()` in `_post_step` (S3:1822 at v0.10.0); PR 4288 "
             "comments it out in v0.10.3 (issue 4851's stale secondaries)",
     .apply = [](VersionRules& v) { v.invalidate_after_step = true; }},
    {.id = "no-invalidation-after-step",
     .pr = "PR 4288",
     .first = "0.10.3",
     .what = "the step no longer frees the secondaries (S3:1858 at v0.10.3, commented out): a "
             "gather after the step reads the secondary copied before it, stale (issue 4851)",
     .ends = "invalidate-after-step-early"},
    {.id = "per-dtype-coalesced-gather",
     .pr = "PR 4647",
     .first = "0.12.3",
     .what = "one all-gather per dtype in a coalesced fetch (PP:1064)",
     .scope = RuleScope::kElsewhere,
     .where = "models with parameters of more than one dtype; the builder's have one"},
    {.id = "one-grad-norm-sync",
     .pr = "PR 4436",
     .first = "0.13.0",
     .what = "one host sync for the gradient norm, `math.sqrt` of the norm tensor in "
             "`get_global_norm` after every sub-group's all-reduce (S3:1702, 1969): the "
             "builder's starting state",
     .apply = [](VersionRules&) {}},
    {.id = "z3-leaf-modules",
     .pr = "PR 4966",
     .first = "0.13.0",
     .what = "`set_z3_leaf_modules`: a leaf module's parameters are fetched in one coalesced "
             "gather at its own hooks, none on its children (PO:387, COORD:272)",
     .scope = RuleScope::kElsewhere,
     .where = "an opt-in until v0.18.0 (rule default-moe-leaf-modules)"},
    {.id = "secondary-in-forward",
     .pr = "PR 4906",
     .first = "0.13.2",
     .what = "the secondary is used by every gather once it exists, forward too "
             "(PP:1174-1176), copied on every release of a parameter (the early return of "
             "PP:1611-1613 at v0.13.1 removed), invalidated after every optimizer step (S3:1990), "
             "and the coordinator gathers parameters with and without a secondary in separate "
             "calls (COORD:449): the copy on the compute stream and the prefetched hpZ gather on "
             "another are unordered (issue 5059); `_partition` stops passing has_been_updated to "
             "it (PP:1473), harmless while every release copies, and an existing secondary is "
             "kept rather than made anew before the copy (PP:1613). PR 5104 drops the optimizer "
             "step at init",
     .apply =
         [](VersionRules& v) {
           v.secondary_only_backward = false;
           v.copy_only_on_create = false;
           v.invalidate_after_step = true;
           v.split_by_secondary = true;
           v.optimizer_step_at_init = false;
           v.secondary_sees_update = false;
           v.secondary_realloc_on_update = false;
         }},
    {.id = "no-loss-item-in-backward",
     .pr = "PR 5135",
     .first = "0.13.3",
     .what = "engine.backward keeps the loss as a tensor (ENG:1955 `loss.mean().detach()`): no "
             "host sync of the compute stream before the backward (v0.13.2 still has it, "
             "ENG:1954)",
     .apply = [](VersionRules& v) { v.loss_item_in_backward = false; }},
    {.id = "host-sync-after-secondary-copy",
     .pr = "PR 5216",
     .first = "0.13.5",
     .what = "`get_accelerator().current_stream().synchronize()` at the end of "
             "`_partition_param_sec` (PP:1647): the host waits for each secondary copy, which "
             "orders it before every later gather; the copy's bounds become "
             "`narrow(0, 0, sec_numel)`, which raises where a secondary slice starts past the "
             "parameter's end (PP:1640; issue 5642)",
     .apply =
         [](VersionRules& v) {
           v.host_sync_after_copy = true;
           v.copy_bounds = CopyBounds::kSecNumel;
         }},
    {.id = "grad-norm-without-host-sync",
     .pr = "PR 5256",
     .first = "0.14.1",
     .what = "the gradient norm stays on the device (S3:2030 `torch.norm(torch.stack(...))`): no "
             "host sync after the norm's all-reduces; with gradient_clipping, `if clip > 1` on a "
             "device tensor syncs once per sub-group before its update (S3:2114). Reverted by PR "
             "5461 in v0.14.3",
     .apply = [](VersionRules& v) { v.grad_norm_sync = NormSync::kWhenClipping; }},
    {.id = "grad-norm-host-sync-restored",
     .pr = "PR 5461",
     .first = "0.14.3",
     .what = "`get_global_norm` (runtime/utils.py:305-312) sums the norms and takes `math.sqrt`: "
             "one host sync after the norm's all-reduces again (S3:2030)",
     .ends = "grad-norm-without-host-sync"},
    {.id = "secondary-copy-only-when-updated",
     .pr = "PR 5613",
     .first = "0.14.3",
     .what = "`_partition_param_sec` returns early when a secondary exists and "
             "`has_been_updated` is false, which `_partition` never passes (PP:1667, 1531): the "
             "secondary is copied once after each invalidation and never refreshed by a release. "
             "A model or checkpoint load after zero.Init leaves it stale (issue 7606)",
     .apply = [](VersionRules& v) { v.copy_only_on_create = true; }},
    {.id = "zero-element-secondary-slices",
     .pr = "PR 5652",
     .first = "0.14.4",
     .what = "the secondary copy's element count is clamped, `max(0, min(...))` (PP:1692), so a "
             "slice that straddles the parameter's end copies its own elements; one that starts "
             "past the end still raises in narrow() (issue 6659)",
     .apply = [](VersionRules& v) { v.copy_bounds = CopyBounds::kClamped; }},
    {.id = "grad-norm-on-device",
     .pr = "PR 5504",
     .first = "0.14.5",
     .what = "the norm and the clipping run on the device (S3:2031 `torch.linalg.norm`, S3:2115 "
             "`torch.clamp`): no host sync is left on the norm's path. The recordings agree: "
             "0.15.4, 0.16.9, 0.17.6 and 0.18.2 hold one host sync of the compute stream in the "
             "step (the recorder's AdamW) where 0.13.4's hold two",
     .apply = [](VersionRules& v) { v.grad_norm_sync = NormSync::kNone; }},
    {.id = "in-flight-cleanup-at-reset",
     .pr = "PR 6557",
     .first = "0.15.3",
     .what = "reset_step, _invalidate_trace and release_and_reset_all wait on every gather "
             "still in flight and release its parameters (COORD:156-160, 167, 214, 417)",
     .scope = RuleScope::kElsewhere,
     .where = "a trace invalidated with prefetches in flight; none is in flight at a reset in the "
              "builder's schedules, as the 0.17.6 recording shows"},
    {.id = "one-coordinator-reset-at-forward-start",
     .pr = "PR 6662",
     .first = "0.15.4",
     .what =
         "one coordinator for training and inference: reset_step runs at the start of every "
         "forward (PO:226-230 `_start_of_forward_hook`), the trace starting INVALID (COORD:96), "
         "instead of at the end of the optimizer's backward (S3:2252 at v0.15.3)",
     .apply = [](VersionRules& v) { v.reset_at_forward_start = true; }},
    {.id = "prefetch-budget-kept-across-resets",
     .pr = "PR 6726",
     .first = "0.16.0",
     .what =
         "`__n_available_params` is kept across reset_step and zeroed only in "
         "release_and_reset_all (COORD:432 at v0.16.0): parameters still gathered at a reset (the "
         "ones a backward leaves gathered, between the micro-steps of gradient accumulation) "
         "shrink the next prefetch budget (max_params_to_prefetch, COORD:381 at v0.16.4). Reverted "
         "by PR 7258 in v0.16.8",
     .apply = [](VersionRules& v) { v.available_kept_across_reset = true; },
     .until = "0.16.8"},
    {.id = "post-accumulate-grad-hook",
     .pr = "PR 6773",
     .first = "0.16.3",
     .what = "the gradient hook is registered with `register_post_accumulate_grad_hook` on torch "
             ">= 2.1 (S3:1175, utils/torch.py:27): it fires at the same point, with the stream "
             "AccumulateGrad runs on current",
     .scope = RuleScope::kElsewhere,
     .where = "the hook fires where it did, on the compute stream with the torch the recordings "
              "ran (2.1.2); off it from torch 2.10 (rule accumulate-grad-off-compute-stream)"},
    {.id = "gradient-bucket-never-reset",
     .pr = "PR 6993",
     .first = "0.17.2",
     .what = "the IPG bucket's element count is never reset (S3:1301, 1337; nor across "
             "steps): after the first bucket every gradient is reduced alone, one "
             "reduce_scatter_coalesced each without the flat-buffer copy. Fixed by PR 7418 in "
             "v0.17.3",
     .apply = [](VersionRules& v) { v.bucket_count_never_reset = true; }},
    {.id = "gradient-bucket-reset",
     .pr = "PR 7418",
     .first = "0.17.3",
     .what = "`bucket.elements = 0` after each reduction again (S3:1338)",
     .ends = "gradient-bucket-never-reset"},
    {.id = "trace-check-broadcasts-length",
     .pr = "PR 7525",
     .first = "0.17.6",
     .what = "assert_ints_same_as_other_ranks broadcasts the list's length, then the list, and "
             "reads each element with `.item()` (ZU:71-85, 100, 112)",
     .apply = [](VersionRules& v) { v.length_broadcast_in_trace_check = true; }},
    {.id = "default-moe-leaf-modules",
     .pr = "PR 7604",
     .first = "0.18.0",
     .what = "MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock and Qwen3MoeSparseMoeBlock are z3 "
             "leaf modules by default (leaf_module_config.py:11-15; ENG:1302): no hooks on the "
             "router and the experts (PO:290-296); the block gathers its whole subtree in one "
             "coalesced fetch and releases it at its post-forward and post-backward hooks "
             "(COORD:300, 437), its pre-backward hook fires twice (router_logits gets a zero "
             "gradient through the full backward hook's node), and its gradients are reduced "
             "from that full backward hook in parameter order (PR 7592, S3:1261-1274)",
     .apply = [](VersionRules& v) { v.default_moe_leaf = true; },
     .when = RuleWhen::kMoeLeaf},
    {.id = "secondary-recopied-after-load",
     .pr = "PR 7707",
     .first = "0.18.3",
     .what = "`_partition` passes `has_been_updated` again (PP:1635), so a load through "
             "GatheredParameters(modifier_rank) (from_pretrained under zero.Init) re-copies the "
             "secondary, and checkpoint_event_epilogue invalidates the secondaries after "
             "load_checkpoint (S3:3027): issue 7606's stale secondaries after a load (v0.14.3 to "
             "v0.18.2; `run.load`) are fixed",
     .apply =
         [](VersionRules& v) {
           v.secondary_sees_update = true;
           v.invalidate_after_checkpoint_load = true;
         }},
    {.id = "sequential-blocking-gather",
     .pr = "PR 7661",
     .first = "0.18.5",
     .what = "a blocking gather of one parameter (init's re-gather of every parameter in "
             "create_reduce_and_remove_grad_hooks, one persistent parameter at the step) goes "
             "through `_allgather_params_sequential` (PP:1618, 1997-2050): all_gather_into_tensor "
             "straight from the shard into a flat tensor that becomes the parameter's data, then "
             "a device synchronize; before, `_allgather_params` copied the shard into a flat "
             "buffer and the parameter out of it. The recordings of 0.18.3 and 0.18.7 (torch "
             "2.10) differ exactly there",
     .apply = [](VersionRules& v) { v.sequential_blocking_gather = true; }},
    {.id = "leaf-backward-fetch-serialized",
     .pr = "PR 7825",
     .first = "0.18.6",
     .what = "concurrent pre-backward fetches of one leaf module from autograd's threads: one "
             "fetches, the others wait on it (COORD:295-330; issue 7824)",
     .scope = RuleScope::kElsewhere,
     .where = "z3 leaf modules whose pre-backward hooks run on several autograd threads at "
              "once; autograd runs one device's backward on one thread, and the builder runs a "
              "leaf's two pre-backward fetches one after the other, the second after the first "
              "has finished, which this change leaves as it was (COORD:305-330 at v0.18.6)"},
    {.id = "reduce-stream-waits-on-current-stream",
     .pr = "PR 7897",
     .first = "0.18.8",
     .what = "the reduce stream waits on the current stream, the one the gradient hook runs on, "
             "not the default one, before a gradient's bucket copy (S3:1363; issue 7898): the "
             "same wait where the hook runs on the default stream; with torch 2.10 or later "
             "and the forward and backward issued from another stream (run.step_stream = "
             "\"side\"), the first release whose copy waits for the gradient. Measured with "
             "DeepSpeed's own code on an H100 with torch 2.11 (2026-11-27, "
             "tools/gpu-probes/deepspeed-grad-hook-stream.py): 0.18.7 read every gradient "
             "early from a side stream (12 of 12) and none from the default stream, with or "
             "without checkpointing (36 of 36); 0.18.8 none",
     .apply = [](VersionRules& v) { v.reduce_waits_current_stream = true; }},
    {.id = "accumulate-grad-off-compute-stream",
     .pr = "issue 7898",
     .first = "0.10.0",
     .what = "which stream the gradient hook runs on when the forward and backward are issued "
             "from another stream than the default one (run.step_stream = \"side\"): with "
             "torch 2.10 or later the stream the forward ran on (measured with torch 2.11, "
             "tools/gpu-probes/grad-hook-stream.py and deepspeed-grad-hook-stream.py), which "
             "the builder models; with an older torch not measured, and PR 7897's author "
             "reports the early read only from torch 2.10 on, so refused. A step issued from "
             "the default stream, as DeepSpeed's examples, the HF Trainer and accelerate "
             "issue it, runs every hook there with every torch",
     .scope = RuleScope::kUnmodelled,
     .when = RuleWhen::kSideStepOlderTorch,
     .torch_from = "2.10"},
    {.id = "trace-invalidated-on-hook-reregistration",
     .pr = "PR 8043",
     .first = "0.19.2",
     .what = "re-registering the hooks invalidates the trace (PO:310-313, COORD:165)",
     .scope = RuleScope::kElsewhere,
     .where = "hooks removed and added again (TRL's unwrap_model_for_generation); the builder "
              "registers them once"},
    {.id = "backward-leftovers-released",
     .pr = "PR 8148",
     .first = "0.19.3",
     .what = "modules whose pre-backward hook ran but whose post-backward never runs (their "
             "inputs need no gradient: the embedding) are released at the end of every backward, "
             "after the reduction epilogue's synchronize (COORD:554, S3:2742), instead of at the "
             "step",
     .apply = [](VersionRules& v) { v.release_backward_leftovers = true; }},
    {.id = "leaf-release-in-set-order",
     .pr = "PR 8148",
     .first = "0.19.3",
     .what = "release_sub_module frees a leaf module's parameters iterating "
             "`set(iter_params(...))` (COORD:518 at v0.19.3): in Python's set order, which "
             "follows the parameters' addresses, not their ds_id order: two recordings of "
             "tiny-mixtral-0.19.8-torch2.10-pretrained with one command freed layer 0's "
             "gate_up_proj and down_proj in opposite orders. The builder frees in ds_id order, "
             "one of the orders a set can give",
     .scope = RuleScope::kUnordered,
     .when = RuleWhen::kMoeLeaf},
    {.id = "secondary-zero-filled",
     .pr = "PR 8210",
     .first = "0.19.5",
     .what = "`ds_secondary_tensor.zero_()` over the whole secondary, then the copy only where "
             "`sec_numel > 0` (PP:1899-1902): a slice that starts past the parameter's end holds "
             "zeros instead of raising (issue 6659), and padding is written",
     .apply =
         [](VersionRules& v) {
           v.zero_fill_secondary = true;
           v.copy_bounds = CopyBounds::kZeroFilled;
         }},
    {.id = "gradients-reduced-over-param-group",
     .pr = "PR 8060",
     .first = "0.19.3",
     .what = "the gradients' reduce_scatter_coalesced and the gradient norm's all-reduce take "
             "their group from `_get_param_partition_group(param)` (S3:594-595, 1713, 2236 at "
             "v0.19.3): the parameter's ds_process_group, which zero.Init sets to the world, in "
             "place of the optimizer's dp_process_group, a clone of the world "
             "(groups._clone_world_group): other communicators, ordered on other NCCL streams. "
             "The fp16 overflow check keeps the clone (S3:2684). The recording tiny-0.19.8 "
             "(torch 2.10) agrees",
     .apply = [](VersionRules& v) { v.grads_on_param_group = true; }},
    {.id = "qwz-bf16-cast",
     .pr = "PR 8215",
     .first = "0.19.6",
     .what = "qwZ's quantizer casts a parameter that is not fp16 to fp16 before the kernel "
             "(PP:890: an fp16 temporary and a cast kernel on the gather's stream, freed when "
             "quantize returns), and a single parameter's wait dequantizes to fp16 and casts back "
             "to the parameter's dtype (PP:727-730, 896-901). The coalesced wait is as before: "
             "its fp16 flat tensor is sliced and each parameter's torch.cat cast with "
             ".to(ds_tensor.dtype) (PP:795), which the builder issues as one copy in every "
             "release",
     .apply = [](VersionRules& v) { v.qwz_half_cast = true; },
     .when = RuleWhen::kQwzNonFp16},
    {.id = "qwz-quantizer-reads-half",
     .pr = "PR 3784",
     .first = "0.10.0",
     .what = "qwZ's quantize kernel reads its input through a __half pointer whatever its dtype "
             "(csrc/quantization/pt_binding.cpp:96) and dequantize writes fp16 (:113, 390): a bf16 "
             "shard's bits are read as fp16 numbers, so every qwZ gather delivers wrong weights "
             "(an fp32 shard: half of its bytes), and a parameter gathered alone becomes an fp16 "
             "tensor that the bf16 forward rejects with a dtype error (issues 3992, 4852, 7775). "
             "Fixed by PR 8215 in v0.19.6 (rule qwz-bf16-cast)",
     .scope = RuleScope::kDefect,
     .until = "0.19.6",
     .when = RuleWhen::kQwzNonFp16},
    {.id = "norm-validity-host-sync",
     .pr = "sdist 0.19.8",
     .first = "0.19.8",
     .what = "the step combines the norm groups and tests the norm with `bool(...)` "
             "(`is_invalid_grad_norm`, S3:2878-2893): a host sync of the compute stream before "
             "the sub-groups' updates, in bf16 too",
     .apply = [](VersionRules& v) { v.norm_validity_sync = true; }},
    {.id = "blocking-gather-waits-every-handle",
     .pr = "sdist 0.19.8",
     .first = "0.19.8",
     .what = "`_allgather_params_coalesced` (the step's gather of the persistent parameters) "
             "waits on every launch handle (PP:2111-2112), not only the last (PP:2092 at 0.19.7)",
     .apply = [](VersionRules& v) { v.wait_every_blocking_handle = true; }},
    {.id = "broadcasts-as-bytes",
     .pr = "sdist 0.19.8",
     .first = "0.19.8",
     .what = "zero.Init's and the engine's broadcasts send `param.data.view(torch.uint8)` "
             "(PP:471, 1204; ENG:2054-2061): the same group, root and bytes",
     .scope = RuleScope::kElsewhere,
     .where = "a collective's NCCL datatype, which the schedule does not record (it records "
              "bytes)"},
};

/** The numbers of "0.13.4"; an empty vector for anything else. */
std::vector<int> numbers_of(const std::string& v) {
  std::vector<int> out;
  const char* p = v.data();
  const char* end = p + v.size();
  while (p < end) {
    int n = 0;
    const auto [next, ec] = std::from_chars(p, end, n);
    if (ec != std::errc{} || next == p) return {};
    out.push_back(n);
    p = next;
    if (p == end) break;
    if (*p != '.') return {};
    ++p;
    if (p == end) return {};
  }
  return out;
}

std::string release_list_hint() {
  return fmt::format("a DeepSpeed release from {} to {}, latest, all, or a range A..B",
                     kReleases.front().version, kReleases.back().version);
}

}  // namespace

std::string until_of(const ReleaseRule& rule) {
  if (*rule.until != '\0') return rule.until;
  // Which rule ends which, read once from the table (version_rules asks per rule and release).
  static const std::map<std::string, std::string> ended_at = [] {
    std::map<std::string, std::string> out;
    for (const ReleaseRule& r : kRules) {
      if (*r.ends != '\0') out.emplace(r.ends, r.first);
    }
    return out;
  }();
  const auto it = ended_at.find(rule.id);
  return it == ended_at.end() ? "" : it->second;
}

namespace {

/** Whether `rule` holds in `release` (from its first release to the one before until_of). */
bool holds_in(const ReleaseRule& rule, const std::string& release) {
  const std::string until = until_of(rule);
  return compare_versions(rule.first, release) <= 0 &&
         (until.empty() || compare_versions(release, until) < 0);
}

}  // namespace

const std::vector<DeepSpeedRelease>& deepspeed_releases() {
  return kReleases;
}

const std::string& latest_deepspeed_release() {
  static const std::string latest = kReleases.back().version;
  return latest;
}

const std::vector<ReleaseRule>& deepspeed_release_rules() {
  return kRules;
}

int compare_versions(const std::string& a, const std::string& b) {
  const std::vector<int> x = numbers_of(a);
  const std::vector<int> y = numbers_of(b);
  if (x < y) return -1;
  return x == y ? 0 : 1;
}

bool is_deepspeed_release(const std::string& version) {
  return std::any_of(kReleases.begin(), kReleases.end(),
                     [&](const DeepSpeedRelease& r) { return version == r.version; });
}

std::string canonical_deepspeed_version(const std::string& version) {
  return version == "latest" ? latest_deepspeed_release() : version;
}

bool rule_applies(const ReleaseRule& rule, const RunTraits& traits) {
  switch (rule.when) {
    case RuleWhen::kAlways:
      return true;
    case RuleWhen::kGradAccum:
      return traits.grad_accum > 1;
    case RuleWhen::kMoeLeaf:
      return traits.family == "mixtral" || traits.family == "qwen2_moe" ||
             traits.family == "qwen3_moe";
    case RuleWhen::kTorch:
      return !traits.torch.empty() && compare_versions(traits.torch, rule.torch_from) >= 0;
    case RuleWhen::kQwzNonFp16:
      return traits.qwz_non_fp16;
    case RuleWhen::kQgz:
      return traits.qgz;
    case RuleWhen::kSideStepOlderTorch:
      return traits.step_off_default_stream &&
             (traits.torch.empty() || compare_versions(traits.torch, rule.torch_from) < 0);
  }
  return true;
}

VersionRules version_rules(const std::string& release, const RunTraits& traits,
                           const std::string& where, const std::string& key) {
  const std::string v = canonical_deepspeed_version(release);
  if (!is_deepspeed_release(v)) {
    throw InputError(where, key, fmt::format("'{}' is not {}", release, release_list_hint()));
  }
  if (const ReleaseRule* r = missing_rule(v, traits)) {
    throw ReleaseRefusal(where, key,
                         fmt::format("DeepSpeed {} is not modelled yet: {}, which changes this "
                                     "run's schedule (docs/deepspeed-releases.md)",
                                     v, lacks_rule(*r)));
  }
  VersionRules out;
  for (const ReleaseRule& r : kRules) {
    // A conditional rule only for the runs it applies to: the others' epochs do not split
    // where it opens (a dense model's 0.17.6 and 0.18.0 build alike).
    if (r.scope == RuleScope::kModelled && r.apply != nullptr && holds_in(r, v) &&
        rule_applies(r, traits)) {
      r.apply(out);
    }
  }
  out.name = v;
  return out;
}

std::vector<const ReleaseRule*> known_defects(const std::string& release, const RunTraits& traits) {
  std::vector<const ReleaseRule*> out;
  for (const ReleaseRule& r : kRules) {
    if (r.scope == RuleScope::kDefect && holds_in(r, release) && rule_applies(r, traits)) {
      out.push_back(&r);
    }
  }
  return out;
}

const ReleaseRule* missing_rule(const std::string& release, const RunTraits& traits) {
  for (const ReleaseRule& r : kRules) {
    if (r.scope == RuleScope::kUnmodelled && holds_in(r, release) && rule_applies(r, traits)) {
      return &r;
    }
  }
  return nullptr;
}

std::string condition_of(const ReleaseRule& rule) {
  switch (rule.when) {
    case RuleWhen::kAlways:
      return "";
    case RuleWhen::kGradAccum:
      return "with gradient accumulation > 1";
    case RuleWhen::kMoeLeaf:
      return "for Mixtral, Qwen2-MoE and Qwen3-MoE";
    case RuleWhen::kTorch:
      return fmt::format("with torch >= {}", rule.torch_from);
    case RuleWhen::kQwzNonFp16:
      return "with qwZ on bf16 or fp32 parameters";
    case RuleWhen::kQgz:
      return "with qgZ";
    case RuleWhen::kSideStepOlderTorch:
      return fmt::format("with run.step_stream = side and torch < {}", rule.torch_from);
  }
  return "";
}

std::string lacks_rule(const ReleaseRule& rule) {
  return fmt::format("the builder lacks rule '{}' ({}, {})", rule.id, rule.pr, window_of(rule));
}

std::string fixed_label(const ReleaseRule& rule) {
  const std::string until = until_of(rule);
  return until.empty() ? "not fixed yet" : "fixed in " + until;
}

std::string window_of(const ReleaseRule& rule) {
  const std::string until = until_of(rule);
  std::string out = until.empty() ? fmt::format("from {}", rule.first)
                                  : fmt::format("{} to the release before {}", rule.first, until);
  if (rule.when == RuleWhen::kTorch || rule.when == RuleWhen::kSideStepOlderTorch) {
    out += ", " + condition_of(rule);
  }
  return out;
}

std::string releases_label(const std::vector<std::string>& releases) {
  if (releases.size() == 1) return releases.front();
  std::size_t at = 0;
  while (at < kReleases.size() && releases.front() != kReleases[at].version) ++at;
  bool consecutive = at + releases.size() <= kReleases.size();
  for (std::size_t i = 0; consecutive && i < releases.size(); ++i) {
    consecutive = releases[i] == kReleases[at + i].version;
  }
  if (consecutive) {
    return fmt::format("{}-{} ({} releases)", releases.front(), releases.back(), releases.size());
  }
  std::string out;
  for (const std::string& r : releases) out += (out.empty() ? "" : ", ") + r;
  return out;
}

std::vector<ReleaseEpoch> deepspeed_epochs(const RunTraits& traits) {
  std::vector<ReleaseEpoch> out;
  for (const DeepSpeedRelease& rel : kReleases) {
    std::vector<const ReleaseRule*> opening;
    bool ends = false;
    for (const ReleaseRule& r : kRules) {
      if (r.first == std::string(rel.version)) opening.push_back(&r);
      ends = ends || until_of(r) == rel.version;
    }
    const ReleaseRule* missing = missing_rule(rel.version, traits);
    const std::string refused = missing ? lacks_rule(*missing) : "";
    if (out.empty() || !opening.empty() || ends || out.back().refused != refused) {
      out.push_back({{}, std::move(opening), refused});
    }
    out.back().releases.emplace_back(rel.version);
  }
  return out;
}

std::vector<std::string> expand_deepspeed_versions(const std::string& spec,
                                                   const std::string& key) {
  std::vector<bool> chosen(kReleases.size(), false);  // by place in the table, oldest first
  const auto place_of = [&](const std::string& name) {
    const std::string v = canonical_deepspeed_version(name);
    for (std::size_t i = 0; i < kReleases.size(); ++i) {
      if (v == kReleases[i].version) return i;
    }
    throw InputError("", key,
                     fmt::format("'{}' is not {} (comma-separated)", name, release_list_hint()));
  };
  std::size_t from = 0;
  while (from <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', from), spec.size());
    const std::string part = spec.substr(from, comma - from);
    from = comma + 1;
    if (part == "all") {
      chosen.assign(kReleases.size(), true);
      continue;
    }
    const std::size_t dots = part.find("..");
    if (dots == std::string::npos) {
      chosen[place_of(part)] = true;
      continue;
    }
    const std::size_t lo = place_of(part.substr(0, dots));
    const std::size_t hi = place_of(part.substr(dots + 2));
    if (lo > hi) {
      throw InputError("", key,
                       fmt::format("the range '{}' runs backwards (write {}..{})", part,
                                   kReleases[hi].version, kReleases[lo].version));
    }
    for (std::size_t i = lo; i <= hi; ++i) chosen[i] = true;
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < kReleases.size(); ++i) {
    if (chosen[i]) out.emplace_back(kReleases[i].version);
  }
  return out;
}

}  // namespace hpz
