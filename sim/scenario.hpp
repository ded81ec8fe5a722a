// A scenario: one experiment, read from one TOML file (see scenarios/README.md for every key,
// its default and its unit). Nothing else carries configuration; the engines below it read
// only what they need, made from a Scenario here (timing_inputs_of, replay_inputs_of:
// sim/platform.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/ir/fill.hpp"
#include "sim/platform.hpp"

namespace hpz {

/** Which DeepSpeed code path issues the secondary partition copy and the hpZ gather. */
enum class Variant {
  kStock,      ///< DeepSpeed before PR 5216: nothing orders the copy before the gather
  kHostSync,   ///< fix A (PR 5216): the host blocks until the compute stream drains
  kEventWait,  ///< fix B: an event after the copy, the all-gather stream waits on it
};

/** [model]: a decoder-only transformer (Llama / Falcon shape). */
struct ModelConfig {
  std::string name;       ///< preset name, HF config path or "custom"
  int layers = 0;         ///< decoder layers
  int hidden = 0;         ///< hidden size
  int ffn = 0;            ///< MLP intermediate size
  int heads = 0;          ///< attention heads
  int kv_heads = 0;       ///< key/value heads (grouped-query attention when < heads)
  int vocab = 0;          ///< vocabulary size
  bool gated_mlp = true;  ///< Llama-style gate/up/down MLP (3 matrices) or 2 matrices (Falcon)
  std::string hf_config;  ///< the Hugging Face config.json it was read from ("" = none)

  // The architecture's details, as its Hugging Face config gives them (read_hf_config; the
  // presets set them too). The defaults are Llama's. sim/model_shape.hpp counts from them.
  std::string family = "llama";  ///< HF model_type: llama, mistral, qwen2, falcon, gpt2, ...
  int head_dim = 0;              ///< per attention head; 0 = hidden / heads
  bool tied_embeddings = false;  ///< lm_head shares the token embedding's weight
  bool qkv_bias = false;  ///< q, k and v projections have biases (Qwen2; DeepSeek-V2: q_a_proj and
                          ///< kv_a_proj_with_mqa, its attention_bias)
  bool linear_bias = false;  ///< every Linear has a bias (GPT-2, GPT-NeoX)
  bool o_bias = false;    ///< the attention output projection has a bias (Llama's attention_bias)
  bool mlp_bias = false;  ///< the MLP's projections have biases (Llama's mlp_bias)
  /// Falcon: attention and MLP read the same layer input (new_decoder_architecture, or
  /// parallel_attn), their outputs summed; false: one after the other.
  bool parallel_blocks = false;
  bool alibi = false;  ///< Falcon's ALiBi in place of rotary embeddings (no maybe_rotary module)
  bool norm_bias = false;  ///< norms are LayerNorms with a bias (GPT-2, GPT-NeoX, Falcon)
  bool qk_norm = false;    ///< per-head RMSNorms of q and k (Qwen3)
  /// Qwen2's and Qwen3's layers past max_window_layers use sliding-window attention
  /// (use_sliding_window, or "sliding_attention" in layer_types): transformers 5 makes a
  /// second mask for them.
  bool sliding_layers = false;
  int norms_per_layer = 2;          ///< 1: Falcon-7B's one input_layernorm before parallel blocks
  int learned_positions = 0;        ///< rows of a learned position embedding (GPT-2's wpe)
  int experts = 0;                  ///< routed experts of a mixture-of-experts layer (0 = dense)
  int experts_per_token = 0;        ///< experts each token is routed to
  int expert_ffn = 0;               ///< one expert's MLP width
  int shared_expert_ffn = 0;        ///< the always-used shared experts' MLP width (0 = none)
  bool shared_expert_gate = false;  ///< a Linear(hidden, 1) gating the shared expert (Qwen2-MoE)
  int dense_layers = 0;             ///< first layers with a dense MLP of width ffn (DeepSeek-V2)
  int kv_lora_rank = 0;             ///< multi-head latent attention (DeepSeek-V2) when > 0
  int q_lora_rank = 0;              ///< MLA's low-rank query (0 = a full q_proj)
  int qk_nope_head_dim = 0;         ///< MLA: per-head query/key part without rotary embedding
  int qk_rope_head_dim = 0;         ///< MLA: per-head rotary part
  int v_head_dim = 0;               ///< MLA: per-head value width
  /// The transformers release whose module tree the DeepSpeed builder walks: "4.35.2",
  /// "4.51.3", "4.57.1" (DeepSeek-V2 only), "5.24.0" (Llama only: the mask's host wait and
  /// non-reentrant checkpointing outside the layer's hooks), or "auto" (transformers_version_of:
  /// 5.24.0 with torch 2.10 or later, the release the recorder's torch 2.10 base pins; else
  /// 4.35.2 for the families it has, 4.57.1 for DeepSeek-V2, else 4.51.3).
  std::string transformers_version = "auto";
  bool operator==(const ModelConfig&) const = default;
};

/** [training]: the batch and the numeric format. */
struct TrainingConfig {
  int seq_len = 2048;              ///< tokens per sequence
  int micro_batch = 1;             ///< sequences per rank per micro-step
  int grad_accum = 1;              ///< micro-steps per optimizer step
  bool grad_checkpointing = true;  ///< recompute each layer's forward in backward
  std::string dtype = "bf16";      ///< bf16 | fp16 | fp32
  /// The run uses the Hugging Face Trainer (or accelerate, axolotl, LLaMA-Factory, which fill
  /// alike): a ds_config's "auto" values are filled as it fills them, from the model's hidden
  /// size; otherwise "auto" keeps DeepSpeed's default. A note says which, either way.
  bool hf_trainer = false;
  /// The optimizer's parameter groups: "model" (one group, model.parameters(): DeepSpeed's own
  /// optimizer from a ds_config "optimizer" section, which the HF Trainer hands DeepSpeed then)
  /// or "hf-trainer" (the Trainer's own optimizer, made when the ds_config has none:
  /// Trainer.create_optimizer's two groups, with weight decay and without). Set to "hf-trainer"
  /// with hf_trainer when the ds_config has no "optimizer" section (a note says so).
  std::string param_groups = "model";
  /// The ds_config's `gradient_clipping` (DeepSpeed's default 0.0, none): whether the optimizer
  /// step clips, which decides a host sync in DeepSpeed 0.14.1-0.14.2 (NormSync).
  double gradient_clipping = 0.0;

  int dtype_bytes() const { return dtype == "fp32" ? 4 : 2; }
  bool operator==(const TrainingConfig&) const = default;
};

/** [zero]: the DeepSpeed ZeRO-3 / ZeRO++ keys, under their DeepSpeed names and defaults. */
struct ZeroConfig {
  /// ZeRO stage. hpzlab models stage 3; below it DeepSpeed partitions no parameters and uses no
  /// hpZ, so a lower stage turns hpZ off (with a note). A ds_config without it means stage 0,
  /// DeepSpeed's default (deepspeed/runtime/zero/config.py, v0.13.4 line 87).
  int stage = 3;
  int zero_hpz_partition_size = 1;                        ///< P', ranks per hpZ group (1 = hpZ off)
  bool zero_quantized_weights = false;                    ///< qwZ
  bool zero_quantized_gradients = false;                  ///< qgZ
  bool overlap_comm = true;                               ///< gathers on their own stream
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;  ///< elements
  std::int64_t stage3_max_live_parameters = 1'000'000'000;  ///< elements
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;   ///< elements
  /// Gradient elements the stage-3 optimizer collects before it reduces them (DeepSpeed's
  /// default 5e8); used by the DeepSpeed builder.
  std::int64_t reduce_bucket_size = 500'000'000;
  /// Elements of a rank's partition per optimizer sub-group (DeepSpeed's default 1e9,
  /// runtime/zero/config.py): the stage-3 optimizer steps each sub-group in turn
  /// (_create_fp16_sub_groups); used by the DeepSpeed builder.
  std::int64_t sub_group_size = 1'000'000'000;
  std::int64_t stage3_param_persistence_threshold = 100'000;  ///< elements
  bool offload_param = false;                                 ///< parameters live in host memory
  /// The DeepSpeed version whose hpZ behaviour the builder issues (sim/deepspeed/).
  std::string deepspeed_version = "0.13.4";
  std::string ds_config;  ///< the DeepSpeed config JSON the keys were read from ("" = none)
  bool operator==(const ZeroConfig&) const = default;
};

/** [run]: which variant to build and how to run it. */
struct RunConfig {
  Variant variant = Variant::kStock;
  Fill fill = Fill::kNan;
  std::uint64_t seed = 1;
  int steps = 2;  ///< optimizer steps to build
  /// A spin kernel of this many microseconds on the compute stream ahead of every secondary
  /// copy of a training step (0 = none): the way a reproduction keeps the producer stream busy
  /// so that the race shows even where the compute stream would not back up by itself.
  double spin_before_copy_us = 0;
  /// The torch the run uses ("" = not said: a torch before 2.10, as the recordings' 2.1.2): a
  /// release rule may apply only from some torch on (sim/deepspeed_releases.hpp).
  std::string torch_version;
  /// What writes the weights after zero.Init and before step 0 (DeepSpeed builder):
  /// "none" (the model as built from its config), "pretrained" (transformers' from_pretrained:
  /// each module's weights loaded on rank 0 inside GatheredParameters(modifier_rank=0), before
  /// deepspeed.initialize) or "checkpoint" (engine.load_checkpoint of a ZeRO checkpoint after
  /// it: the primary shards written). Issue 7606.
  std::string load = "none";
  /// The stream the training script issues the forward and backward from (DeepSpeed builder):
  /// "default" (DeepSpeed's examples, the HF Trainer, accelerate) or "side" (under
  /// `torch.cuda.stream(s)`, the default stream waiting on s before engine.step()). With torch
  /// 2.10 or later the gradient hooks run on that stream (issue 7898; measured with DeepSpeed's
  /// own code, traces/gpu-probes/deepspeed-grad-hook-stream-h100-2026-11-27/).
  std::string step_stream = "default";
  /// The optimizer steps DeepSpeed skips (DeepSpeed builder), ascending: fp16's loss scaler found
  /// an overflow (DeepSpeed logs "OVERFLOW! ... Skipping step"; common in the first steps, the
  /// scale starting at 2^16), or from 0.19.8 the gradient norm was not finite
  /// (is_invalid_grad_norm). A skipped step updates nothing and invalidates no secondary. Written
  /// "0,1" (comma-separated step numbers); empty: every step taken.
  std::vector<int> skipped_steps;
  /// Not a scenario key: set by code that compares the DeepSpeed builder with a recording. The
  /// recorder runs on a CPU, where DeepSpeed steps torch's AdamW instead of FusedAdam (a CUDA
  /// kernel that reads nothing back), and logs each `.item()` of AdamW's step as a host sync
  /// (docs/record.md). On a GPU there is no such sync; with this set the builder issues it, as
  /// the recording has it.
  bool as_recorded = false;
  bool operator==(const RunConfig&) const = default;
};

/** [bugs]: re-introduce the other public hpZ bug classes (all off by default). */
struct BugConfig {
  /// DeepSpeed issue 5030: this rank believes no secondary exists and gathers over the world
  /// while its hpZ peers gather over the hpZ group (-1 = all ranks agree).
  int secondary_mismatch_rank = -1;
  bool operator==(const BugConfig&) const = default;
};

/** One experiment. */
struct Scenario {
  std::string path;  ///< the file it came from ("" when built in code)
  ClusterConfig cluster;
  ModelConfig model;
  TrainingConfig training;
  ZeroConfig zero;
  RunConfig run;
  BugConfig bugs;
  SimConfig sim;                   ///< timing-engine parameters
  std::vector<std::string> notes;  ///< informational notes from loading (ignored ds_config keys)
  bool operator==(const Scenario&) const = default;
};

/** A `--set key=value` override, e.g. {"zero.overlap_comm", "false"}. */
using Override = std::pair<std::string, std::string>;

/** Reads a scenario file and applies overrides; throws InputError on any mistake. */
Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides = {});

/** A key set by a command-line flag of its own, such as `--ds-config FILE` for zero.ds_config
 *  (issue 17's one-command form); `flag` names it in errors and notes. */
struct FlagSetting {
  std::string flag;   ///< e.g. "--ds-config"
  std::string key;    ///< e.g. "zero.ds_config"
  std::string value;  ///< read as --set reads it
};

/** As above, with keys set by flags: the file's keys, then the flags', then `overrides` (--set),
 *  each later one winning. `path` may be "" (no scenario file: every key at its documented
 *  default), in which case the flags must name the model (model.hf_config) and the ds_config,
 *  the scenario is named after those two files, and run.load is "pretrained" (fine-tuning, with
 *  a note) unless a flag or an override sets it. */
Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides,
                       const std::vector<FlagSetting>& flags);

/** Parses "key=value" from the command line; throws InputError when there is no '='. */
Override parse_override(const std::string& text);

/** run.skipped_steps' value: comma-separated step numbers ("0,1"; "" for none), ascending,
 *  each once. Throws InputError(where, key) naming the value otherwise. Recordings carry the
 *  steps DeepSpeed skipped in this form (source "skipped_steps"). */
std::vector<int> parse_step_list(const std::string& text, const std::string& where,
                                 const std::string& key);

/** The name in `known` that `name` is a plausible typo of (a unique completion of it, else the
 *  closest within a small edit distance): what a "did you mean" suggests; none if none is close. */
std::optional<std::string> closest_name(const std::string& name,
                                        const std::vector<std::string>& known);

/** Resolves a model preset (llama2-7b, llama2-13b, llama2-70b, falcon-40b, tiny); throws
 *  InputError for an unknown name. */
ModelConfig model_preset(const std::string& name);

/** Resolves a GPU preset (a100-80g, h100-sxm, h200); throws InputError for an unknown name. */
GpuSpec gpu_preset(const std::string& name);

/** The names model_preset() accepts, in the order they are documented. */
std::vector<std::string> model_preset_names();

/** The names gpu_preset() accepts, in the order they are documented. */
std::vector<std::string> gpu_preset_names();

/** Checks cross-key constraints (divisibility, positive sizes); throws InputError. */
void validate(const Scenario& scenario);

/** What the timing engine (sim/time/) reads of `scenario`: its [cluster] and [sim] sections,
 *  run.steps, run.seed, run.spin_before_copy_us and the batch (sim/platform.hpp). */
TimingInputs timing_inputs_of(const Scenario& scenario);

/** What the data replay (sim/replay/) reads of `scenario`: the model's shape, the batch, the
 *  world size, run.steps and run.seed (sim/platform.hpp). */
ReplayInputs replay_inputs_of(const Scenario& scenario);

/** Names for printing and JSON. */
const char* to_string(Variant v);

}  // namespace hpz
