// build_deepspeed_schedule: what the builder refuses, the module tree and walk, the schedule's
// header and groups, then one RankBuilder per rank.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/deepspeed/derive.hpp"
#include "sim/deepspeed/hooks.hpp"
#include "sim/deepspeed/model_tree.hpp"
#include "sim/deepspeed/offload.hpp"
#include "sim/deepspeed/rank_builder.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/ir/shard.hpp"
#include "sim/model_shape.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz {
namespace {

using deepspeed::DsModule;
using deepspeed::DsParam;
using deepspeed::Model;
using deepspeed::RankBuilder;
using deepspeed::Walk;

/** What the builder does not model: one line naming it and what to do instead. */
[[noreturn]] void refuse(const Scenario& sc, const std::string& what, const std::string& instead) {
  throw InputError(sc.path, "model",
                   "the DeepSpeed builder does not model " + what + " yet (" + instead + ")");
}

/** Refuses a transformers release `tf` that builds no model of the family, or another model than
 *  the config says. */
void check_transformers_release(const Scenario& sc, const std::string& tf) {
  const ModelConfig& m = sc.model;
  const bool tf457 = tf == "4.57.1";
  const std::string& f = m.family;
  const bool deepseek = f == "deepseek_v2";
  if (deepseek && !tf457) {
    // transformers 4.35.2 has no DeepSeek-V2; 4.51.3 runs only DeepSeek's remote code, another
    // implementation, which no recording holds the builder to.
    throw InputError(sc.path, "model.transformers_version",
                     "transformers " + tf +
                         " has no native model_type deepseek_v2 (allowed here: \"4.57.1\", the "
                         "release its recordings were made with, or \"auto\")");
  }
  if (tf457 && !deepseek) {
    throw InputError(sc.path, "model.transformers_version",
                     "the DeepSpeed builder walks model_type " + f +
                         " as transformers 4.35.2 or 4.51.3 builds it, the releases its "
                         "recordings were made with; 4.57.1 only for deepseek_v2 (allowed here: "
                         "\"4.35.2\", \"4.51.3\" or \"auto\")");
  }
  if (tf == "4.35.2") {
    // transformers 4.35.2 has no Qwen2, Qwen3, Gemma or Phi-3; its Llama and Mistral read
    // neither head_dim (head_dim = hidden_size // num_attention_heads) nor mlp_bias: they would
    // build another model than the config says.
    const char* why = !in_transformers_4_35(m)     ? "has no model_type"
                      : own_head_dim(m)            ? "ignores the config's head_dim for model_type"
                      : m.mlp_bias && f == "llama" ? "ignores the config's mlp_bias for model_type"
                                                   : nullptr;
    if (why != nullptr) {
      throw InputError(
          sc.path, "model.transformers_version",
          fmt::format("transformers {} {} {} (allowed here: \"4.51.3\" or \"auto\")", tf, why, f));
    }
  }
}

/** Whether the model is one of the families of mixtures of experts walked as Llama's tree. */
bool llama_tree_moe(const ModelConfig& m) {
  const std::string& f = m.family;
  return f == "mixtral" || f == "qwen2_moe" || f == "qwen3_moe";
}

/** Which family's tree, of those the builder walks, the model's shape fits at transformers `tf`. */
struct WalkableTrees {
  bool llama = false, deepseek = false, phi3 = false, falcon = false, neox = false, gpt2 = false;

  bool any() const { return llama || phi3 || falcon || neox || gpt2 || deepseek; }
};

WalkableTrees walkable_trees(const ModelConfig& m, const std::string& tf) {
  const bool tf451 = tf == "4.51.3";
  const std::string& f = m.family;
  WalkableTrees w;
  // Llama's tree (MistralForCausalLM, Qwen2's, Qwen3's and Gemma's have its modules; Qwen3 adds
  // q_norm and k_norm), with each projection's bias as the family sets it (Llama's
  // attention_bias and mlp_bias, Qwen2's on q, k and v, Qwen3's attention_bias), tied or not.
  // Mixtral's and Qwen2-MoE's are Llama's with a sparse block for the MLP, in every layer.
  const bool moe = llama_tree_moe(m);
  const bool llama_tree =
      f == "llama" || f == "mistral" || f == "qwen2" || f == "qwen3" || f == "gemma" || moe;
  const bool dense_rms = m.gated_mlp && !m.linear_bias && !m.norm_bias && (m.experts > 0) == moe &&
                         m.dense_layers == 0 && m.kv_lora_rank == 0 && m.learned_positions == 0 &&
                         m.norms_per_layer == 2 && !m.alibi;
  w.llama = llama_tree && dense_rms && (!m.qk_norm || f == "qwen3" || f == "qwen3_moe");
  // DeepSeek-V2 (transformers 4.57.1): Llama's tree with multi-head latent attention, dense MLPs
  // in the first first_k_dense_replace layers and a DeepseekV2MoE after them.
  w.deepseek = f == "deepseek_v2" && tf == "4.57.1" && m.gated_mlp && !m.linear_bias &&
               !m.norm_bias && m.kv_lora_rank > 0 && m.learned_positions == 0 &&
               m.norms_per_layer == 2 && !m.alibi && !m.qk_norm;
  w.phi3 = f == "phi3" && tf451 && dense_rms && !m.qkv_bias && !m.o_bias && !m.mlp_bias &&
           !m.qk_norm && !own_head_dim(m);
  w.falcon = f == "falcon" && !tf451 && !m.gated_mlp && m.norm_bias && m.parallel_blocks &&
             !m.alibi && !m.qkv_bias && !m.qk_norm && m.experts == 0 && m.kv_lora_rank == 0 &&
             m.learned_positions == 0 && m.head_dim == 0 &&
             (m.norms_per_layer == 1 || m.norms_per_layer == 2);
  w.neox = f == "gpt_neox" && !tf451 && !m.gated_mlp && m.norm_bias && m.parallel_blocks &&
           m.experts == 0 && m.head_dim == 0;
  w.gpt2 = f == "gpt2" && !tf451 && !m.gated_mlp && m.norm_bias && m.linear_bias &&
           m.learned_positions > 0 && m.experts == 0 && m.head_dim == 0;
  return w;
}

/** Refuses a model whose tree the builder does not walk at transformers `tf`; returns whether
 *  it is transformers 5's mixture of experts, whose fused experts module is a z3 leaf's child. */
bool check_tree(const Scenario& sc, const VersionRules& v, const std::string& tf) {
  const ModelConfig& m = sc.model;
  const std::string& f = m.family;
  const bool tf5 = tf.starts_with("5.");
  const WalkableTrees walkable = walkable_trees(m, tf);
  if (f == "qwen3_moe" && (m.qkv_bias || m.o_bias)) {
    // The replaced attention's Linears would each be converted with their bias, as one group.
    throw InputError(m.name, "attention_bias",
                     "true is not modelled yet for Qwen3-MoE: its layers' replaced "
                     "attention (transformers 4.51.3 builds it twice) is walked without biases "
                     "(allowed: attention_bias false, as Qwen3-MoE's public configs have it)");
  }
  // transformers 5's Mixtral, Qwen2-MoE and Qwen3-MoE: their fused experts module as the z3
  // leaf's child, held to tiny-mixtral-0.19.8-torch2.10 and tiny-{qwen2,qwen3}-moe-0.18.2-
  // torch2.10-pretrained; before
  // 0.18.0 the experts module has hooks of its own, and no recording shows how they fetch its
  // 3-D parameters. qgZ would split them by shape (all_to_all_quant_reduce), which the builder
  // reads for 2-D parameters only.
  const bool tf5_moe = tf5 && llama_tree_moe(m) && walkable.llama && v.default_moe_leaf;
  if (tf5_moe && sc.zero.zero_quantized_gradients) {
    throw InputError(sc.path, "zero.zero_quantized_gradients",
                     "true is not modelled with transformers " + tf +
                         "'s fused MoE experts (3-D parameters) (allowed: false, or "
                         "model.transformers_version \"4.51.3\")");
  }
  if (tf5 && !tf5_moe && (llama_tree_moe(m) || !walkable.llama)) {
    // transformers 5's dense Llama-tree families (Llama, Mistral, Qwen2, Qwen3, Gemma): their
    // masks and non-reentrant checkpointing, held to recordings (tiny-*-torch2.10); Mixtral
    // from DeepSpeed 0.18.0, where its sparse block is a z3 leaf module.
    throw InputError(sc.path, "model.transformers_version",
                     "the DeepSpeed builder walks transformers " + tf +
                         " for model_type llama, mistral, qwen2, qwen3 and gemma, and mixtral, "
                         "qwen2_moe and qwen3_moe from DeepSpeed 0.18.0, the models its "
                         "recordings were made with" +
                         (sc.model.transformers_version == "auto"
                              ? " (\"auto\" takes it with run.torch_version 2.10 or later)"
                              : std::string()) +
                         " (allowed here: \"4.51.3\", the tree of transformers 4)");
  }
  if (tf == "4.51.3" && (f == "falcon" || f == "gpt_neox" || f == "gpt2")) {
    throw InputError(sc.path, "model.transformers_version",
                     "the DeepSpeed builder walks model_type " + f +
                         " as transformers 4.35.2 builds it, the release its recordings were "
                         "made with (allowed here: \"4.35.2\" or \"auto\")");
  }
  if (!walkable.any()) {
    refuse(sc,
           "model_type " + f +
               " with this shape (it walks the trees of transformers' Llama, Mistral, Qwen2, "
               "Qwen3, Gemma and Phi-3, Mixtral's and Qwen2-MoE's with every layer sparse, "
               "DeepSeek-V2's, "
               "Falcon's with parallel attention and rotary embeddings, GPT-NeoX's with "
               "parallel residuals, and GPT-2's)",
           "a model of those families and shapes");
  }
  return tf5_moe;
}

/** Refuses what of the run the builder does not model, or models elsewhere: ZeRO stages 0-2,
 *  offload it does not model, and a skipped step DeepSpeed would not skip. */
void check_run(const Scenario& sc, const VersionRules& v) {
  if (sc.zero.stage != 3) {
    // ZeRO-0/1/2 issue none of stage 3's gathers: a stage-3 schedule in their place would check
    // another run. hpZ is stage 3's (zero.Init builds the secondary partitions), so none of its
    // bugs can occur; ZeRO-1/2's own ordering bugs are not modelled.
    throw InputError(
        sc.path, "zero.stage",
        fmt::format("{} (zero_optimization.stage): the DeepSpeed builder models ZeRO stage 3 only, "
                    "so this run gets no verdict; hpZ exists only at stage 3, so none of hpZ's "
                    "ordering bugs can occur in it; ZeRO-1/2's own (DeepSpeed issues 5545, 7188, "
                    "7965) are checked on a recording of real DeepSpeed: add --record "
                    "(allowed: 3)",
                    sc.zero.stage));
  }
  // offload_param = cpu is modelled (sim/deepspeed/offload.hpp); what is not is refused there
  // (nvme: at the ds_config, sim/scenario/ds_config.cpp).
  param_offload(sc);
  if (!sc.run.skipped_steps.empty() && !deepspeed::checks_overflow(sc, v) &&
      !v.norm_validity_sync) {
    // Only an overflow (fp16; every dtype up to 0.11.1, PR 4512) or 0.19.8's invalid norm skips
    // a step: otherwise a NaN gradient is applied.
    throw InputError(sc.path, "run.skipped_steps",
                     fmt::format("DeepSpeed {} skips no {} step: it checks for overflow in fp16 "
                                 "only (every dtype up to 0.11.1) and the norm's validity from "
                                 "0.19.8, so a NaN gradient is applied, not skipped (allowed: "
                                 "\"\", or training.dtype fp16)",
                                 v.name, sc.training.dtype));
  }
}

/** The module tree transformers `tf` builds for the scenario's model, its z3 leaf modules marked
 *  where the release makes them, and its persistent parameters. */
Model model_tree(const Scenario& sc, const VersionRules& v, const std::string& tf, bool tf5_moe) {
  Model md = deepspeed::build_model(
      sc.model, tf == "4.51.3" || tf == "4.57.1" || tf.starts_with("5."), tf5_moe);
  // DeepseekV2MoE is not among the default leaf classes (its blocks keep their hooks).
  if (v.default_moe_leaf && llama_tree_moe(sc.model)) deepspeed::mark_z3_leaf_modules(md);
  // ds_persist: mark_persistent_parameters (PO:242-260) over named_parameters, with
  // model_persistence_threshold at its default (sys.maxsize); zero.Init marks the same ones
  // (PP:1086).
  for (DsParam& p : md.params) {
    p.persist = static_cast<std::int64_t>(p.numel) <= sc.zero.stage3_param_persistence_threshold;
  }
  return md;
}

/** How transformers `tf` runs the model's forward and backward beyond its module tree. */
Walk model_walk(const Scenario& sc, const std::string& tf) {
  const bool tf5 = tf.starts_with("5.");
  const std::string& f = sc.model.family;
  Walk walk;
  walk.checkpointing = sc.training.grad_checkpointing;
  walk.non_reentrant = tf5;
  if (tf5 && walk.checkpointing) {
    walk.mask_host_waits = 1 + ((f == "qwen2" || f == "qwen3") && sc.model.sliding_layers ? 1 : 0);
  }
  return walk;
}

/** The schedule's header: its scenario, sizes, source and one unit per parameter. */
Schedule schedule_header(const Scenario& sc, const VersionRules& v, const std::string& tf,
                         const Model& md) {
  Schedule s;
  s.scenario = sc.path;
  s.variant = to_string(sc.run.variant);
  s.world_size = sc.cluster.world_size();
  s.hpz_size = sc.zero.zero_hpz_partition_size;
  s.dtype_bytes = sc.training.dtype_bytes();
  s.source["builder"] = "deepspeed";
  s.source["deepspeed"] = v.name;
  s.source["transformers"] = tf;
  for (const DsParam& p : md.params) {
    const ShardLayout l(p.numel, s.world_size, s.hpz_size);
    ParamUnit u;
    u.name = p.name;
    u.layer = p.layer;
    u.numel = p.numel;
    u.padded_numel = l.padded_numel();
    u.shard_numel = l.shard_numel();
    u.secondary_numel = s.hpz_size > 1 ? l.secondary_numel() : 0;
    u.persistent = p.persist;
    s.units.push_back(u);
  }
  return s;
}

/** The process groups DeepSpeed makes for the run, in the order it makes them. */
void add_groups(const Scenario& sc, Schedule& s) {
  // Groups: hpZ blocks (DeepSpeed utils/groups.py _create_zero_param_parallel_group), the
  // world, and the world's clone that stage 3 reduces gradients over (groups.py
  // _clone_world_group).
  const int world = s.world_size;
  if (s.hpz_size > 1) {
    for (int b = 0; b < world / s.hpz_size; ++b) {
      Group g{"hpz" + std::to_string(b), GroupKind::kHpz, {}};
      for (int r = b * s.hpz_size; r < (b + 1) * s.hpz_size; ++r) g.ranks.push_back(r);
      s.groups.push_back(g);
    }
  }
  Group w{"world", GroupKind::kWorld, {}};
  for (int r = 0; r < world; ++r) w.ranks.push_back(r);
  s.groups.push_back(w);
  // qgZ's all-to-all groups (utils/groups.py _get_local_all_to_all_group at v0.13.4, made by
  // the stage-3 optimizer, S3:265-268): the ranks of each node, and the ranks with the same
  // local index on every node; on one node only the first (groups.py:367-370: local_0), and
  // the gradients are reduce-scattered (S3:1338-1341).
  if (sc.zero.zero_quantized_gradients) {
    const int local = sc.cluster.gpus_per_node;
    for (int n = 0; n < sc.cluster.nodes; ++n) {
      Group g{"intra_node" + std::to_string(n), GroupKind::kIntraNode, {}};
      for (int i = 0; i < local; ++i) g.ranks.push_back(n * local + i);
      s.groups.push_back(g);
    }
    for (int i = 0; i < local && sc.cluster.nodes > 1; ++i) {
      Group g{"inter_node" + std::to_string(i), GroupKind::kInterNode, {}};
      for (int n = 0; n < sc.cluster.nodes; ++n) g.ranks.push_back(n * local + i);
      s.groups.push_back(g);
    }
  }
  w.name = "world1";
  s.groups.push_back(w);
}

}  // namespace

RunTraits run_traits(const Scenario& sc) {
  RunTraits t;
  t.torch = sc.run.torch_version;
  t.grad_accum = sc.training.grad_accum;
  t.family = sc.model.family;
  t.qwz_non_fp16 = sc.zero.zero_quantized_weights && sc.training.dtype != "fp16";
  t.qgz = sc.zero.zero_quantized_gradients;
  t.step_off_default_stream = sc.run.step_stream == "side";
  return t;
}

std::vector<const ReleaseRule*> scenario_defects(const Scenario& sc) {
  const std::string v = canonical_deepspeed_version(sc.zero.deepspeed_version);
  return is_deepspeed_release(v) ? known_defects(v, run_traits(sc))
                                 : std::vector<const ReleaseRule*>{};
}

std::size_t schedule_bytes(const RankSchedule& rank, const RankSchedule* base) {
  std::size_t bytes = 0;
  if (!base || !rank.ops.shares_with(base->ops)) bytes += rank.ops.size() * sizeof(Op);
  if (!base || !rank.accesses.shares_with(base->accesses)) {
    bytes += rank.accesses.size() * sizeof(Access);
  } else {
    bytes += rank.accesses.own_count() * sizeof(Access);
    rank.accesses.for_each_own_range(
        [&](std::size_t, std::size_t) { bytes += 2 * sizeof(std::uint32_t); });
  }
  if (!base || !rank.buffers.shares_with(base->buffers)) {
    for (const Buffer& b : rank.buffers) bytes += sizeof(Buffer) + b.name.size();
  }
  return bytes;
}

Schedule build_deepspeed_schedule(const Scenario& sc, const std::string& version,
                                  const OnRankBuilt& on_rank_built, RankBuild how) {
  const VersionRules v = version_rules(version, run_traits(sc), sc.path);
  // The module tree transformers builds for the family, at the release the scenario names
  // (model.transformers_version): each is held to recordings of real DeepSpeed made with that
  // release (traces/deepspeed/README.md).
  const std::string tf = transformers_version_of(sc.model, sc.run.torch_version);
  check_transformers_release(sc, tf);
  const bool tf5_moe = check_tree(sc, v, tf);
  check_run(sc, v);
  const Model md = model_tree(sc, v, tf, tf5_moe);
  const Walk walk = model_walk(sc, tf);
  Schedule s = schedule_header(sc, v, tf, md);
  add_groups(sc, s);
  for (const DsModule& mod : md.modules) {
    if (std::find(s.labels.begin(), s.labels.end(), mod.path) == s.labels.end()) {
      s.labels.push_back(mod.path);
    }
  }
  const int world = s.world_size;
  s.ranks.reserve(static_cast<std::size_t>(world));
  const deepspeed::WorldIndex index(s, md);
  // Ranks the builder reads alike: the first two and the last of each kind are built, the
  // others derived from the first two (sim/deepspeed/derive.hpp).
  const bool derive = how == RankBuild::kDeriveAlike;
  const deepspeed::RankKinds kinds =
      derive ? deepspeed::rank_kinds(s, sc.cluster.gpus_per_node, sc.bugs.secondary_mismatch_rank)
             : deepspeed::RankKinds{};
  std::vector<std::optional<deepspeed::Derivation>> derivations(kinds.members.size());
  BuildProgress progress;
  progress.lead_ranks = std::min(s.hpz_size, world);
  for (Rank r = 0; r < world; ++r) {
    const auto at = static_cast<std::size_t>(r);
    const std::size_t kind = derive ? static_cast<std::size_t>(kinds.kind_of[at]) : 0;
    const std::size_t place = derive ? static_cast<std::size_t>(kinds.place[at]) : 0;
    const std::vector<Rank>* members = derive ? &kinds.members[kind] : nullptr;
    const bool last = derive && place + 1 == members->size();
    std::optional<RankSchedule> derived;
    if (derive && place >= 2 && !last && derivations[kind]) {
      derived = derivations[kind]->derive(s, index, r);
    }
    // A built rank issues the ops of the first of its kind, or else of the rank one hpZ group (a
    // node) before it, each on its own groups, and keeps one copy for all (issue 16's 1,024
    // ranks); the first group's ranks follow rank 0. Rank 0 would not do for all: where a
    // parameter's secondary slice at some hpZ position lies in the padding, that position's
    // ranks copy nothing into it (16,384 GPUs of llama2-70b.toml, 128 ranks or more of
    // tiny.toml), so they issue other ops than rank 0, but the same as each other.
    const RankSchedule* like = r == 0       ? nullptr
                               : place >= 1 ? &s.ranks[static_cast<std::size_t>(members->front())]
                                            : &s.ranks[r >= s.hpz_size ? r - s.hpz_size : 0];
    if (derived) {
      s.ranks.push_back(std::move(*derived));
      ++progress.derived;
    } else {
      RankBuilder b(sc, v, md, walk, index, s, r);
      if (like) b.follow(*like);
      s.ranks.push_back(b.build());
      if (like) share_alike(s.ranks.back(), *like);
      if (derive && place == 1) {
        derivations[kind] = deepspeed::Derivation::make(s, index, members->front(), r);
      }
      // The last of a kind, built, must be what its derivation says; where it is not, the
      // derivation's premise (the file comment of derive.hpp) fails on this world, and every
      // rank is built.
      if (derive && last && place >= 2 && derivations[kind]) {
        const std::optional<RankSchedule> predicted = derivations[kind]->derive(s, index, r);
        if (!predicted || !deepspeed::same_rank_schedule(*predicted, s.ranks.back())) {
          s = Schedule();  // not held through the rebuild
          return build_deepspeed_schedule(sc, version, on_rank_built, RankBuild::kEach);
        }
      }
    }
    const std::size_t bytes = schedule_bytes(s.ranks.back(), like);
    if (r < progress.lead_ranks) progress.lead_bytes += bytes;
    progress.held += bytes;
    progress.ranks_built = r + 1;
    if (on_rank_built) on_rank_built(progress);
  }
  return s;
}

}  // namespace hpz
