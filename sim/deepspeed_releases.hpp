// DeepSpeed's releases and the changes between them that alter the ZeRO-3 / hpZ schedule: the
// release table (every release from the first with zero_hpz_partition_size to the newest on
// PyPI), the rules (one per change in what is issued or in what order, named after its PR and
// the first release that has it), and the fold of those rules into what the DeepSpeed builder
// does for one release. docs/deepspeed-releases.md is rendered from these tables
// (`hpzlab releases --markdown`).
#pragma once

#include <string>
#include <vector>

#include "sim/error.hpp"

namespace hpz {

/** How `_partition_param_sec` bounds its copy into the secondary (sim/deepspeed/partition.cpp). */
enum class CopyBounds {
  kLegacy,    ///< up to v0.13.4: tests the primary slice's bounds (PP:1637-1651 at v0.13.4)
  kSecNumel,  ///< v0.13.5 - v0.14.2 (PR 5216): `sec_numel`, negative past the end (issue 5642)
  /// v0.14.4 on (PR 5652): `max(0, min(...))`, the secondary slice's own elements; a slice that
  /// starts past the end still raises (issue 6659)
  kClamped,
  /// v0.19.5 on (PR 8210): the secondary zero-filled first, then the clamped count copied only
  /// where it is positive: a slice past the end holds zeros
  kZeroFilled,
};

/** Where the optimizer step waits on the host for the gradient norm (sim/deepspeed/optimizer.cpp,
 *  optimizer_step). */
enum class NormSync {
  /// v0.13.0 - v0.14.0 and v0.14.3 - v0.14.4: `math.sqrt` of the norm tensor after the norm's
  /// all-reduce (S3:1969 at v0.13.4; get_global_norm, runtime/utils.py:312 at v0.14.3)
  kAfterNorm,
  /// v0.14.1 - v0.14.2 (PR 5256): the norm stays a device tensor; only gradient clipping's
  /// `if clip > 1` syncs, once per sub-group before its update (S3:2114 at v0.14.2)
  kWhenClipping,
  /// v0.14.5 on (PR 5504): `torch.linalg.norm` and `torch.clamp` on the device, no sync
  kNone,
};

/** What the DeepSpeed builder does differently from one release to the next on the hpZ path:
 *  the fold of the modelled rules (ReleaseRule::apply) up to a release. */
struct VersionRules {
  std::string name;  ///< the release, "0.13.4"
  /// The pre-forward hook passes forward=torch.is_grad_enabled() (PO:497-507 at v0.13.1), and
  /// gathers with forward=True never use the secondary (PP:1175 at v0.13.1); later versions
  /// pass forward=True (PO:452) and use the secondary whenever it exists (PP:1174-1176).
  bool secondary_only_backward = true;
  /// `_partition_param_sec` returns early when a secondary exists: no copy on release
  /// (PP:1611-1613 at v0.13.1; again from v0.14.3, PR 5613, has_been_updated never passed).
  bool copy_only_on_create = true;
  /// `current_stream().synchronize()` after the copy (PR 5216, v0.13.5).
  bool host_sync_after_copy = false;
  /// `invalidate_secondary_tensor()` in `_post_step` (S3:1991; commented out at v0.13.1).
  bool invalidate_after_step = false;
  /// engine.backward logs the loss with `loss.mean().item()`, a host sync of S0 before the
  /// backward pass (runtime/engine.py:1944 at v0.13.1); later versions keep it as a tensor.
  bool loss_item_in_backward = true;
  /// The coordinator gathers parameters with and without a secondary in separate calls
  /// (COORD:440-455, PR 4906); v0.13.1 gathers them in one (COORD:447 at v0.13.1).
  bool split_by_secondary = false;
  /// initialize_optimizer_states runs the optimizer step once to create its states (S3:1014 at
  /// v0.13.1); later versions do not.
  bool optimizer_step_at_init = true;
  /// One coordinator for training and inference (PR 6662, v0.15.4): reset_step runs at the
  /// start of every forward (PO:248-253 at v0.17.6, the trace starting INVALID) instead of at
  /// the end of the optimizer's backward (S3:2215 at v0.13.4).
  bool reset_at_forward_start = false;
  /// `_partition_param_sec`'s copy bounds (PR 5216 in v0.13.5, PR 5652 in v0.14.4).
  CopyBounds copy_bounds = CopyBounds::kLegacy;
  /// assert_ints_same_as_other_ranks broadcasts the list's length first, then `.item()` of each
  /// element (ZU:71-85, 112 at v0.17.6, PR 7525); before, one broadcast of the list.
  bool length_broadcast_in_trace_check = false;
  /// `ds_secondary_tensor.zero_()` over the whole secondary before its copy, and no copy where
  /// the slice starts past the parameter's end (PP:1899-1902 at v0.19.5, PR 8210).
  bool zero_fill_secondary = false;
  /// The step tests the gradient norm with `bool(...)` (`is_invalid_grad_norm`), a host sync of
  /// the compute stream before the sub-groups' updates, in bf16 too (S3:2878-2893 at 0.19.8).
  bool norm_validity_sync = false;
  /// Where the step waits on the host for the gradient norm (NormSync).
  NormSync grad_norm_sync = NormSync::kAfterNorm;
  /// kAfterNorm's wait after each sub-group's norm all-reduce, `.item()` inside
  /// get_grad_norm_direct (S3:1689 at v0.12.6), instead of one after all of them (PR 4436).
  bool norm_sync_per_sub_group = false;
  /// `__reduce_and_partition_ipg_grads` clears the bucket's parameters but not its element
  /// count (S3:1337 at v0.17.2, PR 6993; reset again by PR 7418 in v0.17.3): once a bucket has
  /// been reduced, no gradient fits any more, none is copied into the flat buffer, and each is
  /// reduced alone at the next one's hook.
  bool bucket_count_never_reset = false;
  /// engine.backward logs `loss.mean().item()` only off a gradient-accumulation boundary
  /// (ENG:1884 at v0.10.0): no host sync before the backward of a step's last micro-batch.
  bool loss_item_off_boundary_only = false;
  /// The pre-forward hook passes forward=torch.is_grad_enabled() (PO:505 at v0.10.2, PR 4232);
  /// v0.10.0-v0.10.1 pass forward=True (PO:494), so no forward gather uses the secondary.
  bool forward_passes_grad_enabled = true;
  /// A gradient is copied into the flat bucket only if it leaves room (`<`, S3:1088 at
  /// v0.10.0); `<=` from v0.11.0 (PR 4321).
  bool bucket_strict_bound = false;
  /// The step's overflow check (has_overflow: the tracker on S_rs, the default stream waits for
  /// it, a 1-byte MAX all-reduce, `.item()`) runs whatever the dtype (S3:1799 at v0.10.0); from
  /// v0.11.2 (PR 4512) only for fp16 (S3:1847).
  bool overflow_check_every_dtype = false;
  /// `_partition_param_sec` with has_been_updated makes a new secondary (`torch.empty`, the old
  /// one dropped) before its copy (PP:1619-1632 at v0.13.1); from v0.13.2 (PR 4906) it keeps
  /// the existing one (`if param.ds_secondary_tensor is None`, PP:1613).
  bool secondary_realloc_on_update = true;
  /// At the end of every backward, after the gradient epilogue, modules whose pre-backward hook
  /// ran but whose post-backward never does (the embedding) are released (COORD:554-566, S3:3068
  /// at 0.19.8; PR 8148, v0.19.3), not at the optimizer step.
  bool release_backward_leftovers = false;
  /// Mixtral's and Qwen2-MoE's sparse blocks are z3 leaf modules (PR 7604, v0.18.0): no hooks on
  /// the router and the experts; the block fetches and releases its whole subtree (COORD:300,
  /// 437 at v0.18.2) and reduces its gradients from a full backward hook (S3:1261-1274, PR 7592).
  bool default_moe_leaf = false;
  /// A blocking gather of one parameter (init's re-gather of every parameter, one persistent
  /// parameter at the step) takes `_allgather_params_sequential`: no copy into or out of a flat
  /// buffer, a device synchronize after (PP:1618, 1997-2050 at v0.18.5; PR 7661).
  bool sequential_blocking_gather = false;
  /// `_allgather_params_coalesced` waits on every launch handle (PP:2111-2112 at 0.19.8), not
  /// only the last (PP:2092 at 0.19.7).
  bool wait_every_blocking_handle = false;
  /// Init._partition passes has_been_updated to `_partition_param_sec` (PP:1295 at v0.10.0,
  /// PP:1635 at v0.18.3; not at PP:1473 at v0.13.2): a partition after a load
  /// (GatheredParameters(modifier_rank) exits with has_been_updated=True) re-copies an existing
  /// secondary. PR 4906 (v0.13.2) stopped passing it; PR 7707 (v0.18.3) passes it again.
  bool secondary_sees_update = true;
  /// checkpoint_event_epilogue invalidates the secondaries after a checkpoint load (S3:3027 at
  /// v0.18.3, PR 7707).
  bool invalidate_after_checkpoint_load = false;
  /// CUDAQuantizer casts a parameter that is not fp16 to fp16 before the quantize kernel, and a
  /// single parameter's dequantized fp16 back to its dtype (PP:890, 896-901 at 0.19.8; PR 8215).
  bool qwz_half_cast = false;
  /// reset_step keeps `__n_available_params`; only release_and_reset_all zeroes it (COORD:432
  /// at v0.16.0, PR 6726; reverted by PR 7258 in v0.16.8): parameters still gathered at a reset
  /// (between the micro-steps of gradient accumulation) shrink the next prefetch budget.
  bool available_kept_across_reset = false;
  /// qgZ's all_to_all_quant_reduce has no reduce_scatter fallback for a 2-D gradient whose size
  /// does not divide by 2 x world (coalesced_collectives.py:41-46 at v0.13.1): the all-to-all
  /// of such a gradient cannot be done, and DeepSpeed raises (PR 5056 adds the fallback).
  bool qgz_no_fallback = false;
  /// The gradients' reduce-scatter and the gradient norm's all-reduce go over each parameter's
  /// ds_process_group (`_get_param_partition_group`, S3:594-595 at v0.19.3; zero.Init's group,
  /// the world) instead of the optimizer's clone of it (PR 8060); the fp16 overflow check still
  /// uses the clone (S3:2684).
  bool grads_on_param_group = false;
  /// `__add_grad_to_ipg_bucket` makes the reduce stream wait on the current stream, the one the
  /// gradient hook runs on (S3:1363 at v0.18.8, PR 7897), not the default stream.
  bool reduce_waits_current_stream = false;

  bool operator==(const VersionRules&) const = default;
};

/** A release the builder does not model, or a configuration on which that release of DeepSpeed
 *  itself raises: one line, as any InputError, but a matrix of releases (`check --deepspeed
 *  A..B`) prints it on that release's line and goes on. */
class ReleaseRefusal : public InputError {
 public:
  using InputError::InputError;
};

/** One release of DeepSpeed: its version and the day it was tagged (or uploaded to PyPI). */
struct DeepSpeedRelease {
  const char* version;
  const char* date;
};

/** Whether a rule changes what the builder issues, and so what a release it applies to needs. */
enum class RuleScope {
  kModelled,    ///< the builder models it (ReleaseRule::apply)
  kElsewhere,   ///< it changes only a path the builder's schedules never take (ReleaseRule::where)
  kUnmodelled,  ///< it changes the builder's schedules and is not modelled: refused from `first`
  /// A DeepSpeed bug that is not an ordering bug (wrong values computed on one stream), which the
  /// checker cannot find in a schedule: the verdict names it where it holds and applies
  /// (known_defects), and a check counts it as a finding.
  kDefect,
  /// It changes only the order of ops that one host thread issues on one stream inside one hook
  /// (a Python set's order, which follows addresses), which orders nothing against another
  /// stream: the builder keeps one such order, and its comparison with recordings takes those
  /// ops as a set (sim/projection.hpp).
  kUnordered,
};

/** What a run has that decides whether a conditional rule applies to it. */
struct RunTraits {
  std::string torch;          ///< torch's version, "" = the recordings' (2.1.2)
  int grad_accum = 1;         ///< gradient_accumulation_steps
  std::string family;         ///< model.family ("llama", "mixtral", ...)
  bool qwz_non_fp16 = false;  ///< qwZ on parameters that are not fp16 (bf16, fp32)
  bool qgz = false;           ///< qgZ (zero_quantized_gradients)
  /// The script issues forward and backward from another stream than the default one
  /// (run.step_stream = "side").
  bool step_off_default_stream = false;
};

/** When a rule applies: always, or only to runs with a trait. */
enum class RuleWhen {
  kAlways,
  kGradAccum,   ///< gradient accumulation over more than one micro-step
  kMoeLeaf,     ///< Mixtral, Qwen2-MoE or Qwen3-MoE, whose sparse blocks are z3 leaf modules
  kTorch,       ///< torch at ReleaseRule::torch_from or newer
  kQwzNonFp16,  ///< qwZ on parameters that are not fp16 (bf16 or fp32)
  kQgz,         ///< qgZ
  /// forward and backward issued from another stream (run.step_stream = "side") with a torch
  /// older than ReleaseRule::torch_from
  kSideStepOlderTorch,
};

/** A change in DeepSpeed's ZeRO-3 code that alters what is issued, or in what order. */
struct ReleaseRule {
  const char* id;     ///< short name, e.g. "secondary-in-forward"
  const char* pr;     ///< "PR 4906" (or "issue N" where no PR is named)
  const char* first;  ///< the first release that has it (`git tag --contains`)
  const char* what;   ///< what changes in the issued schedule, with file:line at `first`
  RuleScope scope = RuleScope::kModelled;
  void (*apply)(VersionRules&) = nullptr;  ///< kModelled: the change to the builder's rules
  const char* where = "";  ///< kElsewhere: the path it changes and why the builder never takes it
  /// The first release that no longer has it ("" = every release from `first` on, or until a
  /// rule that `ends` it); for a kUnmodelled rule, the releases from `until` on are not refused
  /// for it. A modelled rule's `apply` is folded in only where it holds (until_of).
  const char* until = "";
  /// The id of an earlier rule this change undoes: that rule holds up to the release before this
  /// one's `first` (its `until` is then ""); this one changes the schedule back, so has no
  /// `apply` of its own.
  const char* ends = "";
  RuleWhen when = RuleWhen::kAlways;  ///< which runs it applies to
  /// RuleWhen::kTorch: the first torch it applies to; kSideStepOlderTorch: the first it does not
  const char* torch_from = "";
};

/** Every release from the first with zero_hpz_partition_size (ZeRO++, PR 3784) to the newest on
 *  PyPI, oldest first. */
const std::vector<DeepSpeedRelease>& deepspeed_releases();

/** The newest release in deepspeed_releases(), what `latest` names. */
const std::string& latest_deepspeed_release();

/** The rules, in the order of their first release. */
const std::vector<ReleaseRule>& deepspeed_release_rules();

/** The first release that no longer has `rule`: its `until`, or the first release of the rule
 *  that `ends` it ("" when neither). */
std::string until_of(const ReleaseRule& rule);

/** -1, 0 or 1 as version `a` is older than, the same as or newer than `b` ("0.13.4" < "0.13.10").
 */
int compare_versions(const std::string& a, const std::string& b);

/** Whether `version` is in deepspeed_releases(). */
bool is_deepspeed_release(const std::string& version);

/** "latest" as the newest release; any other name as given. */
std::string canonical_deepspeed_version(const std::string& version);

/** "fixed in 0.13.5" (until_of), or "not fixed yet". */
std::string fixed_label(const ReleaseRule& rule);

/** "0.14.1 to the release before 0.14.3", "from 0.18.0", with the torch it needs if any. */
std::string window_of(const ReleaseRule& rule);

/** Which runs `rule` applies to, "" for every run: "with gradient accumulation > 1", ... */
std::string condition_of(const ReleaseRule& rule);

/** Why the builder refuses a release under `rule`, the one wording every refusal uses: "the
 *  builder lacks rule 'ID' (PR, WINDOW)". */
std::string lacks_rule(const ReleaseRule& rule);

/** Whether `rule` applies to a run with `traits`. */
bool rule_applies(const ReleaseRule& rule, const RunTraits& traits);

/** What the builder does for `release` on a run with `traits`: the fold of every modelled rule
 *  up to it that applies to the run (rule_applies). Throws InputError (file `where`, key `key`) for
 * a name that is no release, and ReleaseRefusal for a release under a rule the builder does not
 * model, naming the rule. */
VersionRules version_rules(const std::string& release, const RunTraits& traits = {},
                           const std::string& where = "",
                           const std::string& key = "zero.deepspeed_version");

/** The DeepSpeed defects (RuleScope::kDefect) in `release` for a run with `traits`: bugs that are
 *  not of the checker's kinds, named in the verdict (`release` must be a release). */
std::vector<const ReleaseRule*> known_defects(const std::string& release,
                                              const RunTraits& traits = {});

/** The rule that keeps the builder from modelling `release` for a run with `traits`, nullptr
 *  when it models it (`release` must be a release). */
const ReleaseRule* missing_rule(const std::string& release, const RunTraits& traits = {});

/** "0.13.2-0.13.4 (3 releases)" where `releases` are consecutive in deepspeed_releases(), else
 *  "0.13.4, 0.14.4"; one release as itself. */
std::string releases_label(const std::vector<std::string>& releases);

/** Releases the builder treats alike: consecutive releases under the same rules. */
struct ReleaseEpoch {
  std::vector<std::string> releases;      ///< oldest first
  std::vector<const ReleaseRule*> rules;  ///< the rules whose first release opens this epoch
  /// Why the builder refuses these releases ("" when it models them): the rule it lacks.
  std::string refused;
  std::string first() const { return releases.front(); }
};

/** The releases grouped into epochs for a run with `traits`, oldest first: a new epoch opens at
 *  each rule's first release and where a rule ends (kElsewhere rules included, so that the table
 *  shows them). */
std::vector<ReleaseEpoch> deepspeed_epochs(const RunTraits& traits = {});

/** The releases a --deepspeed value names, oldest first, without repeats: a release, `latest`,
 *  `all`, a range `A..B` (both ends releases, or `latest`), or a comma-separated list of these.
 *  Throws InputError (key `key`) naming the first part that is none of these. */
std::vector<std::string> expand_deepspeed_versions(const std::string& spec,
                                                   const std::string& key = "--deepspeed");

}  // namespace hpz
