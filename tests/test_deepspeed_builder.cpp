// The DeepSpeed builder held equal to real DeepSpeed: for each recording in traces/deepspeed/
// (made by `hpzlab record`, tools/recorder/record-traces), the builder is run on the same model,
// ds_config, world and version, and the projections (sim/projection.hpp) of both are compared,
// op by op, for the recorded rank and one rank of the other node. A divergence is reported with
// context from both sides.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/report.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/projection.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/model_shape.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz {
namespace {

std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  gzclose(f);
  return out;
}

Schedule recording(const std::string& name) {
  const std::string path = test::source_dir() + "/traces/deepspeed/" + name + ".json.gz";
  return schedule_from_json(nlohmann::json::parse(gunzip(path)), path);
}

/** The scenario the recording was made with: its model config (read as model.hf_config), the
 *  transformers release that built it and the ds_config the recorder used (all named in its
 *  `source`), DeepSpeed's defaults for the keys that ds_config leaves out. */
Scenario scenario_of(const Schedule& rec) {
  const nlohmann::json ds = nlohmann::json::parse(rec.source.at("ds_config_used"));
  const nlohmann::json& z = ds.at("zero_optimization");
  Scenario sc;
  sc.path = "recording";
  sc.cluster.nodes = std::stoi(rec.source.at("nodes"));
  sc.cluster.gpus_per_node = std::stoi(rec.source.at("gpus_per_node"));
  sc.model =
      load_scenario(test::scenario_path("tiny"),
                    {{"model.hf_config", test::source_dir() + "/" + rec.source.at("hf_config")},
                     {"model.transformers_version", rec.source.at("transformers")}})
          .model;
  sc.training.micro_batch = std::stoi(rec.source.at("micro_batch"));
  sc.training.seq_len = std::stoi(rec.source.at("seq_len"));
  sc.training.grad_checkpointing = rec.source.at("grad_checkpointing") == "on";
  sc.run.steps = std::stoi(rec.source.at("steps"));
  sc.training.grad_accum = ds.value("gradient_accumulation_steps", 1);
  sc.zero.overlap_comm = z.value("overlap_comm", true);  // None -> stage == 3 (config.py)
  sc.zero.zero_hpz_partition_size = z.value("zero_hpz_partition_size", 1);
  // DeepSpeed's defaults (runtime/zero/config.py at v0.13.4): persistence 1e5, prefetch
  // bucket 5e7, max live 1e9, max reuse distance 1e9.
  sc.zero.stage3_param_persistence_threshold =
      z.value("stage3_param_persistence_threshold", std::int64_t{100'000});
  sc.zero.stage3_prefetch_bucket_size =
      z.value("stage3_prefetch_bucket_size", std::int64_t{50'000'000});
  sc.zero.stage3_max_live_parameters =
      z.value("stage3_max_live_parameters", std::int64_t{1'000'000'000});
  sc.zero.zero_quantized_gradients = z.value("zero_quantized_gradients", false);
  sc.zero.zero_quantized_weights = z.value("zero_quantized_weights", false);
  sc.zero.stage3_max_reuse_distance =
      z.value("stage3_max_reuse_distance", std::int64_t{1'000'000'000});
  sc.zero.reduce_bucket_size = z.value("reduce_bucket_size", std::int64_t{500'000'000});
  sc.zero.sub_group_size = z.value("sub_group_size", std::int64_t{1'000'000'000});
  if (const auto skipped = rec.source.find("skipped_steps"); skipped != rec.source.end()) {
    sc.run.skipped_steps = parse_step_list(skipped->second, "recording", "skipped_steps");
  }
  if (const auto load = rec.source.find("load"); load != rec.source.end()) {
    sc.run.load = load->second;  // recorded with --load (issue 7606)
  }
  if (const auto groups = rec.source.find("param_groups"); groups != rec.source.end()) {
    sc.training.param_groups = groups->second;  // recorded with --param-groups
  }
  const std::string& dtype = rec.source.at("dtype");  // torch's name
  sc.training.dtype = dtype == "float16" ? "fp16" : dtype == "bfloat16" ? "bf16" : "fp32";
  sc.run.as_recorded = true;  // the recorder's AdamW logs a host sync per step
  return sc;
}

class DeepSpeedBuilderMatches : public testing::TestWithParam<const char*> {};

TEST_P(DeepSpeedBuilderMatches, Recording) {
  const Schedule rec = recording(GetParam());
  const Schedule built = build_deepspeed_schedule(scenario_of(rec), rec.source.at("deepspeed"));
  ASSERT_EQ(built.world_size, rec.world_size);
  for (const Rank r : {0, rec.world_size - 3}) {
    const auto expected = project(rec, r, true);
    const auto actual = project(built, r, true);
    EXPECT_GT(expected.size(), 100u);
    const std::string diff = first_divergence(expected, "DeepSpeed (recorded)", actual, "builder");
    EXPECT_TRUE(diff.empty()) << GetParam() << ", rank " << r << ": " << diff;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Recordings, DeepSpeedBuilderMatches,
    testing::Values(
        "tiny-0.13.4", "tiny-0.13.4-overlap-off", "tiny-0.13.4-hpz-off", "tiny-0.13.4-prefetch-0",
        "tiny-0.13.4-max-live-3000", "tiny-0.13.4-max-live-30000",
        "tiny-0.13.4-max-live-1000000000", "tiny-0.13.4-no-checkpointing", "tiny-0.13.4-accum-2",
        "tiny-0.13.4-bucket-5000", "tiny-0.13.4-qgz", "tiny-0.13.1-qgz", "tiny-0.10.3-qgz",
        "tiny128-0.13.4-qwz", "tiny-0.16.4-accum-2", "tiny-0.13.1", "tiny-0.13.5", "tiny-0.14.4",
        "tiny-0.13.4-all-ranks", "tiny-0.13.5-all-ranks", "tiny-0.17.6", "tiny-0.13.4-tied",
        "tiny-0.13.4-attention-bias", "tiny-falcon-0.13.4", "tiny-falcon7b-0.13.4",
        "tiny-gptneox-0.13.4", "tiny-gpt2-0.13.4", "tiny-gpt2-0.13.4-bucket-5000",
        "tiny-gptneox-0.13.4-bucket-5000", "tiny-0.13.4-one-node", "llama2-7b-0.13.4",
        "tiny-llama-tf4.51-0.13.4", "tiny-qwen2-tf4.51-0.13.4", "tiny-qwen3-tf4.51-0.13.4",
        "tiny-gemma-tf4.51-0.13.4", "tiny-phi3-tf4.51-0.13.4", "tiny-mixtral-tf4.51-0.13.4",
        "tiny-qwen2-moe-tf4.51-0.13.4", "tiny-deepseek-v2-tf4.57-0.13.4",
        "tiny-deepseek-v2-qlora-tf4.57-0.13.4",
        // Releases after 0.17.6 (issue 36), the rules from 0.15.4 on: torch 2.1.2.
        "tiny-0.15.4", "tiny-0.16.9", "tiny-0.18.2",
        // The HF Trainer's own optimizer: two param groups (training.param_groups).
        "tiny-0.13.4-hf-trainer-groups", "tiny-qwen2-tf4.51-0.13.4-hf-trainer-groups",
        "tiny-gpt2-0.13.4-hf-trainer-groups", "tiny-0.13.4-sub-group-2000-hf-trainer-groups",
        "tiny-0.19.8-torch2.10-hf-trainer-groups",
        // 0.18's default z3 leaf modules (PR 7604): Mixtral's and Qwen2-MoE's sparse blocks
        // (with its shared expert and gate) fetched, released and reduced as one.
        "tiny-mixtral-tf4.51-0.18.2", "tiny-qwen2-moe-tf4.51-0.18.2",
        // transformers 5.24.0's Mixtral (MixtralExperts: two 3-D parameters) on 0.19.8, whose
        // leaf frees in set order (PR 8148).
        "tiny-mixtral-0.19.8-torch2.10-pretrained", "tiny-mixtral-0.18.2-torch2.10-pretrained",
        "tiny-qwen2-moe-0.18.2-torch2.10-pretrained", "tiny-qwen3-moe-0.18.2-torch2.10-pretrained",
        // Built from its config: garbage weights, an invalid norm, both steps skipped.
        "tiny-mixtral-0.19.8-torch2.10", "tiny-mixtral-0.18.8-torch2.10-pretrained",
        "tiny-mixtral-0.18.3-torch2.10-pretrained", "tiny-mixtral-0.18.7-torch2.10-pretrained",
        // Mixtral before the leaf modules, on the releases between (every expert Linear hooked).
        "tiny-mixtral-tf4.51-0.16.9", "tiny-mixtral-tf4.51-0.15.4",
        // Qwen3-MoE (transformers 4.51.3): each layer's first attention and dense MLP replaced,
        // their parameters converted by zero.Init only; the block a leaf from 0.18.0.
        "tiny-qwen3-moe-tf4.51-0.13.4", "tiny-qwen3-moe-tf4.51-0.18.2",
        // fp16 (torch 2.10's CPU has half-precision matmuls; 2.1.2's does not): the overflow
        // check's 1-byte all-reduce and host read each step.
        "tiny-0.19.8-torch2.10-fp16",
        // ... and with a loss scale of 2^32, both steps overflow and are skipped (the recording
        // names them: run.skipped_steps "0,1").
        "tiny-0.19.8-torch2.10-fp16-overflow",
        // from_pretrained's load after zero.Init (issue 7606).
        "tiny-0.16.9-pretrained", "tiny-0.18.2-pretrained",
        // Up to 0.13.1 the load's repartition makes each secondary anew.
        "tiny-0.12.3-pretrained", "tiny-0.13.1-pretrained",
        // torch 2.10 and transformers 5.24.0: the causal mask's host wait, non-reentrant
        // checkpointing outside the layer's hooks, and 0.19.3's gradient group (PR 8060).
        "tiny-0.18.2-torch2.10", "tiny-0.18.3-torch2.10", "tiny-0.18.7-torch2.10",
        "tiny-0.18.8-torch2.10", "tiny-0.19.8-torch2.10", "tiny-0.18.2-torch2.10-pretrained",
        "tiny-0.18.3-torch2.10-pretrained", "tiny-0.19.8-torch2.10-no-checkpointing",
        "tiny-0.19.8-torch2.10-accum-2",
        // transformers 5.24.0's other dense families: Mistral (a sliding-window mask), Qwen2,
        // Qwen3, Gemma, and Qwen2 with a sliding layer (a second mask, a second host wait).
        "tiny-mistral-0.19.8-torch2.10", "tiny-qwen2-0.19.8-torch2.10",
        "tiny-qwen3-0.19.8-torch2.10", "tiny-gemma-0.19.8-torch2.10",
        "tiny-qwen2-sliding-0.19.8-torch2.10",
        // qwZ on bf16 from 0.19.6 (PR 8215): the quantizer's fp16 casts.
        "tiny128-0.19.8-torch2.10-qwz",
        // Optimizer sub-groups of 2000 elements (3 a rank): a norm all-reduce and an optimizer
        // step each, and up to 0.12.6 a norm sync each.
        "tiny-0.13.4-sub-group-2000", "tiny-0.12.6-sub-group-2000",
        "tiny-0.19.8-torch2.10-sub-group-2000",
        // The releases before 0.13 and the epochs of one or two releases (issue
        // 36): each rule of docs/deepspeed-releases.md that changes what they issue.
        "tiny-0.10.0", "tiny-0.10.1", "tiny-0.10.3", "tiny-0.11.0", "tiny-0.12.3", "tiny-0.12.6",
        "tiny-0.14.2", "tiny-0.17.2"),
    [](const testing::TestParamInfo<const char*>& p) {
      std::string n = p.param;
      for (char& c : n) {
        if (c == '-' || c == '.') c = '_';
      }
      return n;
    });

// The projection leaves the gradient bucket's copies out (they write no parameter): where each
// lands in the flat buffer, step by step, is held equal here. 0.17.2 never resets the bucket's
// element count (PR 6993), so step 1's gradients land after step 0's; 0.16.9 starts again at 0.
// The bucket is the buffer the first gradient is copied into on S_rs.
std::vector<std::pair<int, std::uint64_t>> bucket_copies(const Schedule& s) {
  const RankSchedule& rs = s.ranks.at(0);
  std::vector<std::pair<int, std::uint64_t>> out;
  BufferId bucket = kNoBuffer;
  for (std::size_t i = 0; i < rs.ops.size(); ++i) {
    const Op& o = rs.ops[i];
    if (o.kind != OpKind::kCopy || o.stream < 0 || rs.streams[o.stream].name != "S_rs" ||
        o.access_count != 2) {
      continue;
    }
    const Access& to = rs.accesses[o.access_begin + 1];
    if (bucket == kNoBuffer) bucket = to.buffer;
    if (to.buffer == bucket) out.emplace_back(o.step, to.offset);
  }
  return out;
}

TEST(DeepSpeedBuilder, GradientBucketOffsetsFollowEachRelease) {
  for (const char* name : {"tiny-0.17.2", "tiny-0.16.9"}) {
    const Schedule rec = recording(name);
    const Schedule built = build_deepspeed_schedule(scenario_of(rec), rec.source.at("deepspeed"));
    const auto expected = bucket_copies(rec);
    EXPECT_GT(expected.size(), 40u) << name;
    EXPECT_EQ(bucket_copies(built), expected) << name;
  }
  // The control: 0.17.2's step 1 starts where step 0 ended, 0.16.9's at 0.
  const auto never_reset = bucket_copies(recording("tiny-0.17.2"));
  const auto reset = bucket_copies(recording("tiny-0.16.9"));
  ASSERT_EQ(never_reset.size(), reset.size());
  EXPECT_NE(never_reset, reset);
}

// Each rule of the releases before 0.13 and of 0.14.2 shows in its recording: the release after
// it (the rule's end) built on the same scenario differs from the recording.
TEST(DeepSpeedBuilder, EachOldRuleIsNeededByItsRecording) {
  const std::vector<std::pair<const char*, const char*>> pairs = {
      {"tiny-0.10.0", "0.10.1"},  // loss-item-off-boundary-only
      {"tiny-0.10.1", "0.10.3"},  // forward-gathers-never-use-secondary, invalidate-after-step
      {"tiny-0.11.0", "0.11.2"},  // overflow-check-every-dtype
      {"tiny-0.14.2", "0.14.3"},  // grad-norm-without-host-sync
      {"tiny-0.16.4-accum-2", "0.16.8"},         // prefetch-budget-kept-across-resets
      {"tiny-0.12.6-sub-group-2000", "0.13.0"},  // grad-norm-sync-per-sub-group
  };
  for (const auto& [name, next] : pairs) {
    const Schedule rec = recording(name);
    const Schedule built = build_deepspeed_schedule(scenario_of(rec), next);
    EXPECT_NE(first_difference(project(rec, 0, true), project(built, 0, true)), kEqual)
        << name << " built as " << next;
  }
}

/** Host syncs of rank 0 in optimizer step `step`. */
int step_host_syncs(const Schedule& s, int step) {
  int n = 0;
  for (const Op& o : s.ranks.at(0).ops) {
    n += o.kind == OpKind::kHostStreamSync && o.phase == Phase::kOptimizer && o.step == step;
  }
  return n;
}

// 0.14.1-0.14.2 keep the norm on the device: only gradient clipping's `if clip > 1` waits for
// it (S3:2114 at v0.14.2). tiny-0.14.2's ds_config does not clip.
TEST(DeepSpeedBuilder, GradientClippingAloneSyncsTheNormIn0142) {
  Scenario sc = scenario_of(recording("tiny-0.14.2"));
  ASSERT_EQ(sc.training.gradient_clipping, 0.0);
  auto syncs = [&](const char* release, double clip) {
    sc.training.gradient_clipping = clip;
    return step_host_syncs(build_deepspeed_schedule(sc, release), 0);
  };
  EXPECT_EQ(syncs("0.14.2", 1.0), syncs("0.14.2", 0.0) + 1);
  // 0.14.4 waits after the norm, clipping or not; 0.14.5 (PR 5504) does not.
  EXPECT_EQ(syncs("0.14.4", 1.0), syncs("0.14.4", 0.0));
  EXPECT_EQ(syncs("0.14.5", 0.0), syncs("0.14.4", 0.0) - 1);
}

// The releases that need torch 2.10 (0.18.3 on) were recorded with transformers 5.24.0. Walked as
// transformers 4.51.3 builds Llama (the same modules), each recording equals the builder from
// zero.Init through the first forward's embedding and first differs at transformers 5's host
// wait; walked as 5.24.0 it is equal (DeepSpeedBuilderMatches). Built as 0.19.2, before PR 8060,
// 0.19.8's recording first differs at the gradients' reduce-scatter, on the world's clone.
TEST(DeepSpeedBuilder, TransformersFiveAndTheParamGroupAreEachNeeded) {
  for (const char* name : {"tiny-0.18.2-torch2.10", "tiny-0.19.8-torch2.10"}) {
    const Schedule rec = recording(name);
    ASSERT_EQ(rec.source.at("transformers"), "5.24.0") << name;
    Scenario sc = scenario_of(rec);
    sc.model.transformers_version = "4.51.3";
    const Schedule built = build_deepspeed_schedule(sc, rec.source.at("deepspeed"));
    const auto expected = project(rec, 0, true);
    const std::size_t at = first_difference(expected, project(built, 0, true));
    ASSERT_NE(at, kEqual) << name;
    EXPECT_GT(at, 400u) << name;
    EXPECT_EQ(expected[at].line, "host waits for S0") << name;
    EXPECT_NE(expected[at].where.find("step 0 forward"), std::string::npos) << name;
  }
  const Schedule rec = recording("tiny-0.19.8-torch2.10");
  const auto expected = project(rec, 0, true);
  const auto built = project(build_deepspeed_schedule(scenario_of(rec), "0.19.2"), 0, true);
  const std::size_t at = first_difference(expected, built);
  ASSERT_NE(at, kEqual);
  ASSERT_LT(at, built.size());
  EXPECT_NE(built[at].line.find("clone_world_group"), std::string::npos) << built[at].line;
  EXPECT_NE(expected[at].where.find("grad_reduce"), std::string::npos) << expected[at].where;
}

// transformers 5's walk is the dense Llama-tree families' and, from DeepSpeed 0.18.0 (a leaf),
// Mixtral's, Qwen2-MoE's and Qwen3-MoE's; "auto" takes it with torch 2.10 or later.
TEST(DeepSpeedBuilder, TransformersFiveWalksMixtralOnlyAsALeafAndAutoFollowsTorch) {
  Scenario sc = scenario_of(recording("tiny-0.18.2-torch2.10"));
  sc.model.transformers_version = "auto";
  sc.run.torch_version = "2.10.0";
  EXPECT_EQ(build_deepspeed_schedule(sc, "0.18.8").source.at("transformers"), "5.24.0");
  sc.run.torch_version = "";
  EXPECT_EQ(build_deepspeed_schedule(sc, "0.18.8").source.at("transformers"), "4.35.2");
  Scenario mixtral = scenario_of(recording("tiny-mixtral-0.19.8-torch2.10"));
  mixtral.model.transformers_version = "5.24.0";
  mixtral.run.skipped_steps.clear();  // its bf16 steps skip on 0.19.8's invalid norm only
  try {
    // Before 0.18.0 the experts module has hooks of its own: no recording shows them.
    build_deepspeed_schedule(mixtral, "0.17.6");
    ADD_FAILURE() << "transformers 5.24.0 on Mixtral was built as 0.17.6";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2_moe and qwen3_moe from DeepSpeed 0.18.0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(build_deepspeed_schedule(mixtral, "0.18.2"));
}

// DeepSpeed 0.18's default z3 leaf modules (rule default-moe-leaf-modules, PR 7604). Built as
// 0.17.6, the 0.18.2 Mixtral recording first differs at the first sparse block's forward fetch
// (one gather per expert Linear before, one coalesced gather of the block's 13 parameters from
// 0.18.0). In the 0.18.2 schedule the block's pre-backward hook fires twice (router_logits gets a
// zero gradient through the full backward hook's node), so a layer-1 block's hooks make the
// compute stream wait for S_ag once more in the backward than 0.17.6's; and step 1's trace check
// broadcasts 67 modules and 146 parameters (536 and 1168 bytes), both pre-backward calls counted.
TEST(DeepSpeedBuilder, MixtralSparseBlocksAreLeafModulesFrom0180) {
  const Schedule rec = recording("tiny-mixtral-tf4.51-0.18.2");
  const Scenario sc = scenario_of(rec);
  const Schedule as_0176 = build_deepspeed_schedule(sc, "0.17.6");
  const auto expected = project(rec, 0, true);
  const std::size_t at = first_difference(expected, project(as_0176, 0, true));
  ASSERT_NE(at, kEqual);
  EXPECT_NE(expected[at].where.find("step 0 forward at model.layers.0.block_sparse_moe"),
            std::string::npos)
      << expected[at].where;
  const Schedule built = build_deepspeed_schedule(sc, "0.18.2");
  const auto block_waits = [](const Schedule& s) {
    const RankSchedule& rs = s.ranks.at(0);
    const auto label =
        std::find(s.labels.begin(), s.labels.end(), "model.layers.1.block_sparse_moe") -
        s.labels.begin();
    int n = 0;
    for (std::size_t i = 0; i < rs.ops.size(); ++i) {
      const Op& o = rs.ops[i];
      n += o.step == 0 && o.phase == Phase::kBackward && o.label == label &&
           o.kind == OpKind::kStreamWaitEvent && o.stream == 0;
    }
    return n;
  };
  EXPECT_EQ(block_waits(built), block_waits(as_0176) + 1);
  std::multiset<std::uint64_t> trace;
  for (const Op& o : built.ranks.at(0).ops) {
    if (o.step == 1 && o.phase == Phase::kForward && o.kind == OpKind::kAllReduce) {
      trace.insert(o.comm_bytes);
    }
  }
  EXPECT_EQ(trace.count(8 * 67), 1u);
  EXPECT_EQ(trace.count(8 * 146), 2u);
}

/** A recording whose run skipped both its steps (source skipped_steps "0,1"), against the
 *  builder with every step taken: step 0's optimizer in the recording is the builder's up to the
 *  host read that decided the skip, where the recording goes on to step 1 and the builder on to
 *  the update and the invalidation of the secondaries, which the recording never has. */
void ExpectEqualUpToTheSkippingRead(const char* name) {
  const Schedule rec = recording(name);
  ASSERT_EQ(rec.source.at("skipped_steps"), "0,1") << name;
  Scenario every_step = scenario_of(rec);
  every_step.run.skipped_steps.clear();
  const auto expected = project(rec, 0, true);
  const auto built =
      project(build_deepspeed_schedule(every_step, rec.source.at("deepspeed")), 0, true);
  const auto step0 = [](const std::vector<ProjectedOp>& v) {
    std::vector<std::string> out;
    for (const ProjectedOp& o : v) {
      if (o.where.starts_with("step 0 optimizer")) out.push_back(o.line);
    }
    return out;
  };
  const std::vector<std::string> rec0 = step0(expected), built0 = step0(built);
  ASSERT_FALSE(rec0.empty()) << name;
  ASSERT_GT(built0.size(), rec0.size()) << name;
  EXPECT_TRUE(std::equal(rec0.begin(), rec0.end(), built0.begin())) << name;
  EXPECT_EQ(rec0.back(), "host waits for S0") << name;
  EXPECT_TRUE(
      std::any_of(built0.begin() + static_cast<std::ptrdiff_t>(rec0.size()), built0.end(),
                  [](const std::string& l) { return l.starts_with("free on S0 secondary:"); }))
      << name;
  for (const ProjectedOp& o : expected) {
    EXPECT_FALSE(o.line.starts_with("free on S0 secondary:")) << name << ": " << o.where;
  }
}

// tiny-mixtral-0.19.8-torch2.10 was built from its config: transformers 5's experts and router
// weights are torch.empty, and zero.Init broadcast what the recording rank's allocator held. Its
// gradient norm came out invalid, and 0.19.8 skipped both steps after the norm's validity read
// (is_invalid_grad_norm, S3:2888-2894). The recording names them and equals the builder with
// them (DeepSpeedBuilderMatches).
TEST(DeepSpeedBuilder, AStepSkippedForAnInvalidNormIsTheOneDifference) {
  ExpectEqualUpToTheSkippingRead("tiny-mixtral-0.19.8-torch2.10");
}

// fp16 with a loss scale of 2^32 (initial_scale_power 32): every gradient overflows, DeepSpeed
// halves the scale and skips the step right after the overflow flag's .item() (step, S3:2873-2896
// at 0.19.8: _overflow_check_and_loss_scale_update, then return), and 2^31 overflows again: no
// norm, no update, no persistent gather, no invalidation. The recording names the skipped steps
// and equals the builder with them (DeepSpeedBuilderMatches). A bf16 step is skipped only from
// 0.19.8 (an invalid norm): earlier, refused.
TEST(DeepSpeedBuilder, AnOverflowedFp16StepIsSkippedOnlyWhereTheRunSaysSo) {
  ExpectEqualUpToTheSkippingRead("tiny-0.19.8-torch2.10-fp16-overflow");
  const Schedule rec = recording("tiny-0.19.8-torch2.10-fp16-overflow");
  // bf16: 0.19.8 skips a step whose norm is invalid (after the norm and its validity read);
  // 0.19.7 applies it.
  Scenario bf16 = scenario_of(rec);
  bf16.training.dtype = "bf16";
  EXPECT_NO_THROW(build_deepspeed_schedule(bf16, "0.19.8"));
  try {
    build_deepspeed_schedule(bf16, "0.19.7");
    ADD_FAILURE() << "0.19.7 skipped a bf16 step";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("DeepSpeed 0.19.7 skips no bf16 step"), std::string::npos)
        << e.what();
  }
}

// DeepSpeed issue 7898: with torch 2.10 or later a gradient hook runs on the stream the forward
// ran on. A script that issues forward and backward from a stream of its own (run.step_stream =
// "side") leaves 0.18.7's bucket copy waiting on the default stream, unordered with the
// gradient kernel that writes what it reads; 0.18.8 (PR 7897) waits on the current stream.
// From the default stream, the way DeepSpeed's engine is driven by the HF Trainer, both are
// clean. DeepSpeed's own code did the same on an H100 with torch 2.11
// (traces/gpu-probes/deepspeed-grad-hook-stream-h100-2026-11-27/).
TEST(DeepSpeedBuilder, GradientHooksOnASideStreamRaceTheBucketCopyBefore0188) {
  const auto check = [](const char* version, const char* stream) {
    const Scenario sc =
        load_scenario(test::scenario_path("tiny"), {{"run.builder", "deepspeed"},
                                                    {"zero.deepspeed_version", version},
                                                    {"run.torch_version", "2.10.0"},
                                                    {"run.step_stream", stream}});
    return check::check_schedule(build_schedule(sc));
  };
  const check::CheckResult before = check("0.18.7", "side");
  ASSERT_GT(before.count(check::FindingKind::kRace), 0u)
      << check::TextReporter().render_one(before);
  for (const check::FindingGroup& g : before.groups) {
    const check::Finding& f = g.example;
    EXPECT_EQ(f.kind, check::FindingKind::kRace);
    EXPECT_EQ(f.role, BufferRole::kGradFull) << f.buffer;
    // The gradient kernel on the script's stream, then the bucket copy on the reduce stream.
    EXPECT_EQ(f.first.stream, "S_step");
    EXPECT_EQ(f.first.kind, OpKind::kKernel);
    EXPECT_EQ(f.second.stream, "S_rs");
    EXPECT_EQ(f.second.kind, OpKind::kCopy);
    EXPECT_EQ(f.second.purpose, Purpose::kGradReduce);
  }
  const check::CheckResult fixed = check("0.18.8", "side");
  EXPECT_TRUE(fixed.clean()) << check::TextReporter().render_one(fixed);
  const check::CheckResult on_default = check("0.18.7", "default");
  EXPECT_TRUE(on_default.clean()) << check::TextReporter().render_one(on_default);
}

// Findings per kind: (occurrences, groups).
std::map<check::FindingKind, std::pair<std::uint64_t, std::size_t>> verdict(
    const check::CheckResult& r) {
  std::map<check::FindingKind, std::pair<std::uint64_t, std::size_t>> out;
  for (const check::FindingGroup& g : r.groups) {
    out[g.example.kind].first += g.count;
    out[g.example.kind].second += 1;
  }
  return out;
}

// Models whose norms do not divide by the world (16 ranks, hpZ 8), so that DeepSpeed's ranks
// differ, recorded as every rank (`hpzlab record --rank all`): every rank is compared, and so
// are the checker's verdicts (below). The hidden-12 model's
// 12-element norms leave ranks 12-15's primary shards in the padding, and rank 7's secondary
// slice starts past the end: 0.13.4's bounds skip that copy, every later version raises on it
// (above), so only 0.13.4 runs it. The hidden-30 model's norms (30 elements, padded to 32:
// secondary slices of 4) end inside the last slice, which starts at 28: 0.13.4 tests rank 7's
// primary slice and copies none of it (elements 28-29 stay unwritten, read by the gathers),
// 0.14.4 copies its 2 elements, and both run on every rank. 0.13.4's norms' secondaries of
// step 1 are allocated and invalidated without ever being written or read; the recorder keeps
// such parameter tensors since 2026-11-25 (it had dropped them, which first showed here as a
// divergence).
TEST(DeepSpeedBuilder, EveryRankOfModelsWithPaddedShardsMatches) {
  std::map<std::string, std::vector<ProjectedOp>> rank7;
  for (const char* name : {"tiny-h12-0.13.4", "tiny-h30-0.13.4", "tiny-h30-0.14.4"}) {
    const Schedule rec = recording(name);
    ASSERT_EQ(rec.source.at("recorded_rank"), "all");
    const Schedule built = build_deepspeed_schedule(scenario_of(rec), rec.source.at("deepspeed"));
    ASSERT_EQ(built.world_size, rec.world_size);
    for (Rank r = 0; r < rec.world_size; ++r) {
      const auto expected = project(rec, r, true);
      EXPECT_GT(expected.size(), 1000u);
      const std::string diff =
          first_divergence(expected, "DeepSpeed (recorded)", project(built, r, true), "builder");
      EXPECT_TRUE(diff.empty()) << name << ", rank " << r << ": " << diff;
      if (r == 7) rank7[name] = expected;
    }
    // Padding is no data on either side: the recorder drops a shard's elements past the
    // parameter's end and reduce_scatter_coalesced's padding, the builder reads only the
    // parameters' own elements (until 2026-11-26 both read padding, the recordings far more,
    // and this compared only which findings the builder had).
    const auto got = verdict(check::check_schedule(built));
    EXPECT_EQ(got, verdict(check::check_schedule(rec))) << name;
    // 0.13.4 leaves rank 7's and 15's last secondary slices unwritten (its copy-bounds bug);
    // 0.14.4 copies them, and its padding is read by nothing.
    const bool v0134 = rec.source.at("deepspeed") == "0.13.4";
    EXPECT_EQ(got.count(check::FindingKind::kUninitializedRead) > 0, v0134) << name;
  }
  // The positive control: the recordings themselves differ in rank 7's copies into the norms'
  // secondaries.
  const auto norm_copies = [](const std::vector<ProjectedOp>& ops) {
    return std::count_if(ops.begin(), ops.end(), [](const ProjectedOp& op) {
      return op.line.find("copy on") == 0 &&
             op.line.find("w:secondary:model.layers.0.input_layernorm.weight") != std::string::npos;
    });
  };
  EXPECT_EQ(norm_copies(rank7["tiny-h30-0.13.4"]), 0);
  EXPECT_GT(norm_copies(rank7["tiny-h30-0.14.4"]), 0);
}

// The checker's verdict on the built schedule equals its verdict on the recording: per finding
// kind, the number of groups and of findings.
TEST_P(DeepSpeedBuilderMatches, CheckerVerdict) {
  const Schedule rec = recording(GetParam());
  const Schedule built = build_deepspeed_schedule(scenario_of(rec), rec.source.at("deepspeed"));
  const auto want = verdict(check::check_schedule(rec));
  const auto got = verdict(check::check_schedule(built));
  EXPECT_EQ(got, want) << GetParam();
  // The versions' known verdicts (docs/record.md), so that a change to both sides is seen too.
  const std::string v = rec.source.at("deepspeed");
  const bool hpz = rec.hpz_size > 1;
  const bool overlap = scenario_of(rec).zero.overlap_comm;
  const bool races = got.count(check::FindingKind::kRace) > 0;
  // Mixtral's experts each begin with torch.where, a nonzero: the host waits for the compute
  // stream, secondary copies included, before it launches anything more
  // (docs/deepspeed-builder.md).
  const bool mixtral = rec.source.at("hf_config").find("mixtral") != std::string::npos;
  // 0.10.0 races too: no loss.item() before the step's last backward (rule
  // loss-item-off-boundary-only), the host sync that orders 0.10.1's copies.
  EXPECT_EQ(races, (v == "0.13.4" || v == "0.10.0") && hpz && overlap && !mixtral) << GetParam();
  // Stale: the step of 0.10.3 to 0.13.1 (issue 4851), or a from_pretrained load from 0.14.3 to
  // 0.18.2 (7606).
  const auto load = rec.source.find("load");
  const bool loaded_7606 =
      load != rec.source.end() && load->second == "pretrained" && (v == "0.16.9" || v == "0.18.2");
  const bool step_4851 = compare_versions(v, "0.10.3") >= 0 && compare_versions(v, "0.13.1") <= 0;
  EXPECT_EQ(got.count(check::FindingKind::kStaleRead) > 0, step_4851 || loaded_7606) << GetParam();
}

TEST(DeepSpeedBuilder, ScenarioKeyTakesEveryReleaseAndLatest) {
  for (const DeepSpeedRelease& r : deepspeed_releases()) {
    Scenario sc =
        load_scenario(test::scenario_path("tiny"), {{"zero.deepspeed_version", r.version}});
    EXPECT_EQ(sc.zero.deepspeed_version, r.version);
  }
  EXPECT_EQ(load_scenario(test::scenario_path("tiny"), {{"zero.deepspeed_version", "latest"}})
                .zero.deepspeed_version,
            latest_deepspeed_release());
  // Before ZeRO++ (v0.10.0) there is no hpZ; 0.13.10 was never released.
  EXPECT_THROW(load_scenario(test::scenario_path("tiny"), {{"zero.deepspeed_version", "0.9.5"}}),
               InputError);
  EXPECT_THROW(load_scenario(test::scenario_path("tiny"), {{"zero.deepspeed_version", "0.13.10"}}),
               InputError);
  EXPECT_THROW(load_scenario(test::scenario_path("tiny"), {{"run.builder", "exact"}}), InputError);
}

// What follows from DeepSpeed's code: with the copy ordered before every read of the secondary,
// or with no secondary read on another stream, no configuration races. Checked on a model and
// world none of the recordings has (4 layers, hidden 96, 2 x 4 ranks, hpZ 4), with the limits
// that make the stock version race there (the positive control).
Scenario unrecorded_llama() {
  Scenario sc;
  sc.path = "unrecorded";
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 4;
  sc.model = ModelConfig{};
  sc.model.name = "llama-4x96";
  sc.model.layers = 4;
  sc.model.hidden = 96;
  sc.model.ffn = 256;
  sc.model.heads = 4;
  sc.model.kv_heads = 2;
  sc.model.vocab = 160;
  sc.training.seq_len = 512;
  sc.run.steps = 3;
  sc.zero.overlap_comm = true;
  sc.zero.zero_hpz_partition_size = 4;
  sc.zero.stage3_param_persistence_threshold = 100;  // the norms persist
  sc.zero.stage3_prefetch_bucket_size = 20'000;
  sc.zero.stage3_max_live_parameters = 60'000;
  sc.zero.stage3_max_reuse_distance = 0;
  return sc;
}

/** The races the checker finds in a schedule. */
std::uint64_t races(const Schedule& s) {
  const check::CheckResult r = check::check_schedule(s);
  std::uint64_t n = 0;
  for (const check::FindingGroup& g : r.groups) {
    if (g.example.kind == check::FindingKind::kRace) n += g.count;
  }
  return n;
}

std::uint64_t races(const Scenario& sc, const std::string& version) {
  return races(build_deepspeed_schedule(sc, version));
}

TEST(DeepSpeedBuilder, StockRacesWhereTheFixesAndLaterVersionsDoNot) {
  const Scenario stock = unrecorded_llama();
  ASSERT_GT(races(stock, "0.13.4"), 0u) << "the positive control: 0.13.4 stock races here";
  for (const char* v : {"0.13.5", "0.14.4", "0.17.6"}) EXPECT_EQ(races(stock, v), 0u) << v;
  Scenario fix = stock;
  for (const Variant var : {Variant::kHostSync, Variant::kEventWait}) {
    fix.run.variant = var;
    EXPECT_EQ(races(fix, "0.13.4"), 0u) << to_string(var);
  }
  Scenario no_overlap = stock;
  no_overlap.zero.overlap_comm = false;  // S_ag is the compute stream (PO:138-139)
  EXPECT_EQ(races(no_overlap, "0.13.4"), 0u);
  Scenario no_hpz = stock;
  no_hpz.zero.zero_hpz_partition_size = 1;  // no secondary to read
  EXPECT_EQ(races(no_hpz, "0.13.4"), 0u);
}

/** The findings of one kind the checker finds in a schedule, and the earliest step of one. */
std::pair<std::uint64_t, int> findings(const Schedule& s, check::FindingKind kind) {
  const check::CheckResult r = check::check_schedule(s);
  std::uint64_t n = 0;
  int first = std::numeric_limits<int>::max();
  for (const check::FindingGroup& g : r.groups) {
    if (g.example.kind != kind) continue;
    n += g.count;
    first = std::min(first, g.example.second.step);
  }
  return {n, first};
}

// Issue 7606: a load after zero.Init leaves the secondaries stale from v0.14.3 (PR 5613's early
// return, has_been_updated not passed) to v0.18.2; PR 7707 (v0.18.3) re-copies them on a
// from_pretrained load and invalidates them after load_checkpoint. Before v0.13.2 the
// pretrained load's partition re-copied them (has_been_updated passed) and v0.13.2-v0.14.2
// copy on every partition (0.14.1-0.14.2 are not modelled), but nothing touched them on a
// checkpoint load before v0.18.3: the first gather that reads one (step 0's backward before
// v0.13.2, its forward from v0.13.2) reads the weights from before the load. Event-wait removes
// 0.13.2-0.13.4's race, so only this bug shows.
TEST(DeepSpeedBuilder, LoadsLeaveSecondariesStaleWhereIssue7606Says) {
  Scenario sc = unrecorded_llama();
  sc.run.variant = Variant::kEventWait;
  sc.run.steps = 1;
  const auto stale = [&](const char* load, const char* version) {
    Scenario l = sc;
    l.run.load = load;
    return findings(build_deepspeed_schedule(l, version), check::FindingKind::kStaleRead);
  };
  for (const char* v : {"0.13.5", "0.14.3", "0.16.9", "0.18.2", "0.18.3", "0.19.8"}) {
    EXPECT_EQ(stale("none", v).first, 0u) << "no load, " << v;
  }
  for (const char* v : {"0.14.3", "0.16.9", "0.18.2"}) {
    const auto [n, step] = stale("pretrained", v);
    EXPECT_GT(n, 0u) << "from_pretrained, " << v;
    EXPECT_EQ(step, 0) << "the first step reads the weights zero.Init made, " << v;
  }
  for (const char* v : {"0.12.6", "0.13.1", "0.13.4", "0.13.5", "0.14.0", "0.18.3", "0.19.8"}) {
    EXPECT_EQ(stale("pretrained", v).first, 0u) << "from_pretrained, " << v;
  }
  for (const char* v : {"0.12.6", "0.13.4", "0.13.5", "0.14.3", "0.18.2"}) {
    const auto [n, step] = stale("checkpoint", v);
    EXPECT_GT(n, 0u) << "load_checkpoint, " << v;
    EXPECT_EQ(step, 0) << v;
  }
  for (const char* v : {"0.18.3", "0.19.8"}) {
    EXPECT_EQ(stale("checkpoint", v).first, 0u) << "load_checkpoint, " << v;
  }
  // The load is in the schedule: rank 0 writes every parameter, and everyone receives it.
  Scenario l = sc;
  l.run.load = "pretrained";
  const Schedule s = build_deepspeed_schedule(l, "0.18.3");
  std::size_t writes = 0;
  for (const Op& op : s.ranks.at(0).ops) writes += op.purpose == Purpose::kCheckpointLoad;
  EXPECT_GT(writes, s.units.size());
}

/** A schedule's parameter names and the elements they hold together. */
std::pair<std::set<std::string>, double> units_of(const Schedule& s) {
  std::set<std::string> names;
  double total = 0;
  for (const ParamUnit& u : s.units) {
    names.insert(u.name);
    total += static_cast<double>(u.numel);
  }
  return {names, total};
}

// Qwen2 (transformers' Qwen2ForCausalLM) is Llama's module tree with biases on q, k and v_proj
// and none on o_proj (tests/data/hf_qwen2/config.json: a tiny one). The builder walks it as
// Llama's, as transformers 4.51.3 builds it (4.35.2 has no Qwen2; the recording
// tiny-qwen2-tf4.51-0.13.4 holds the walk): the units are the model's parameters as the
// Hugging Face reader counts them, and 0.13.4 races where 0.13.5 does not.
TEST(DeepSpeedBuilder, Qwen2IsLlamasTreeWithBiasesOnQKAndV) {
  const Scenario sc =
      load_scenario(test::scenario_path("tiny"),
                    {{"model.hf_config", test::source_dir() + "/tests/data/hf_qwen2/config.json"}});
  ASSERT_EQ(sc.model.family, "qwen2");
  const auto [names, total] = units_of(build_deepspeed_schedule(sc, "0.13.4"));
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    EXPECT_TRUE(names.count(fmt::format("model.layers.1.self_attn.{}.weight", p))) << p;
    EXPECT_EQ(names.count(fmt::format("model.layers.1.self_attn.{}.bias", p)),
              std::string(p) == "o_proj" ? 0u : 1u)
        << p;
  }
  EXPECT_FALSE(names.count("model.layers.1.mlp.up_proj.bias"));
  EXPECT_EQ(total, parameter_count(sc.model));
  EXPECT_GT(races(sc, "0.13.4"), 0u);
  EXPECT_EQ(races(sc, "0.13.5"), 0u);
}

// Llama's mlp_bias (transformers 4.41 and on, so walked as 4.51.3 builds it) puts a bias on
// gate, up and down_proj (tests/data/hf_llama_bias/config.json, attention_bias too): every bias
// is a unit of its own,
// the units add up to the Hugging Face reader's count, and 0.13.4 races where 0.13.5 does not.
TEST(DeepSpeedBuilder, LlamasMlpBiasGivesTheThreeMlpProjectionsABias) {
  const Scenario sc = load_scenario(
      test::scenario_path("tiny"),
      {{"model.hf_config", test::source_dir() + "/tests/data/hf_llama_bias/config.json"}});
  ASSERT_TRUE(sc.model.mlp_bias);
  const auto [names, total] = units_of(build_deepspeed_schedule(sc, "0.13.4"));
  for (const char* p :
       {"self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
    EXPECT_TRUE(names.count(fmt::format("model.layers.1.{}.bias", p))) << p;
  }
  EXPECT_EQ(total, parameter_count(sc.model));
  EXPECT_GT(races(sc, "0.13.4"), 0u);
  EXPECT_EQ(races(sc, "0.13.5"), 0u);
}

// The public configs of every family the builder walks (tests/data/hf), cut to two layers: each is
// built in the transformers release that has it (model.transformers_version "auto": 4.35.2 for
// Llama and Mistral with their heads' width hidden / heads, 4.57.1 for DeepSeek-V2, else
// 4.51.3), its units add up to the Hugging Face reader's count, and 0.13.4 races where 0.13.5
// does not, but for Mixtral and DeepSeek-V2-Lite: before each of Mixtral's experts torch.where
// makes the host wait for the compute stream, which orders every secondary copy before the
// gathers that read it (as in the recording tiny-mixtral-tf4.51-0.13.4), and DeepSeek-V2 reads
// each expert's token count on the host. Qwen1.5-MoE and Qwen3-30B-A3B race inside the last
// expert of layer 1: no torch.where comes after it, and its gate_proj's secondary copy meets the
// prefetch of the same weight (for the recompute) issued at its down_proj.
TEST(DeepSpeedBuilder, PublicConfigsOfEveryWalkedFamilyBuild) {
  struct Expected {
    std::string transformers;
    bool races;
  };
  const std::map<std::string, Expected> expected = {
      {"llama-2-7b", {"4.35.2", true}},    {"llama-3-8b", {"4.35.2", true}},
      {"llama-3.2-1b", {"4.35.2", true}},  {"mistral-7b", {"4.35.2", true}},
      {"qwen2-7b", {"4.51.3", true}},      {"qwen2.5-0.5b", {"4.51.3", true}},
      {"qwen3-8b", {"4.51.3", true}},      {"gemma-2b", {"4.51.3", true}},
      {"gemma-7b", {"4.51.3", true}},      {"phi-3-mini", {"4.51.3", true}},
      {"mixtral-8x7b", {"4.51.3", false}}, {"qwen1.5-moe-a2.7b", {"4.51.3", true}},
      {"qwen3-30b-a3b", {"4.51.3", true}}, {"deepseek-v2-lite", {"4.57.1", false}}};
  for (const auto& [name, want] : expected) {
    const Scenario sc =
        load_scenario(test::scenario_path("tiny"),
                      {{"model.hf_config", test::source_dir() + "/tests/data/hf/" + name + ".json"},
                       {"model.layers", "2"}});
    const Schedule s = build_deepspeed_schedule(sc, "0.13.4");
    EXPECT_EQ(s.source.at("transformers"), want.transformers) << name;
    // A tied model's lm_head weight, made before tie_weights() replaced it, is zero.Init's
    // parameter too (the recording tiny-0.13.4-tied): once more the embedding's size.
    double orphan =
        sc.model.tied_embeddings ? static_cast<double>(sc.model.vocab) * sc.model.hidden : 0;
    if (sc.model.family == "qwen3_moe") {
      // Each layer's first attention (q, k, v, o, q_norm, k_norm) and dense MLP, replaced in
      // Qwen3MoeDecoderLayer.__init__ (transformers 4.51.3): zero.Init's too.
      const ModelConfig& m = sc.model;
      const double h = m.hidden, head = m.head_dim, q = head * m.heads, kv = head * m.kv_heads;
      orphan += m.layers * (2 * q * h + 2 * kv * h + 2 * head + 3.0 * h * m.ffn);
    }
    EXPECT_EQ(units_of(s).second, parameter_count(sc.model) + orphan) << name;
    EXPECT_EQ(races(sc, "0.13.4") > 0, want.races) << name;
    EXPECT_EQ(races(sc, "0.13.5"), 0u) << name;
  }
}

// Mixtral's and DeepSeek-V2-Lite's schedules are clean on 0.13.4 because of the models' own host
// waits: before each of Mixtral's experts torch.where is a nonzero, and before each of
// DeepSeek-V2's, moe() reads the expert's token count with .item(); the host waits for the
// compute stream (its secondary copies included) before it launches anything more. Erased from
// the built schedule (the wait right before each expert's first hook op), the same schedule
// races: the positive control.
TEST(DeepSpeedBuilder, MoEHostWaitsBeforeEachExpertOrderItsSecondaryCopies) {
  // (config, experts in its sparse layers of the first two)
  for (const auto& [config, experts] :
       {std::pair<std::string, std::size_t>{"mixtral-8x7b", 8 * 2}, {"deepseek-v2-lite", 64 * 1}}) {
    const Scenario sc = load_scenario(
        test::scenario_path("tiny"),
        {{"model.hf_config", test::source_dir() + "/tests/data/hf/" + config + ".json"},
         {"model.layers", "2"}});
    Schedule s = build_deepspeed_schedule(sc, "0.13.4");
    EXPECT_EQ(races(s), 0u) << config;
    std::size_t erased = 0;
    for (RankSchedule& r : s.ranks) {
      std::vector<Op>& ops = r.ops.mut();
      std::vector<Op> kept;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const bool before_expert =
            ops[i].kind == OpKind::kHostStreamSync && i + 1 < ops.size() &&
            ops[i + 1].label != kNoLabel &&
            s.labels[ops[i + 1].label].find(".experts.") != std::string::npos;
        if (before_expert) {
          ++erased;
        } else {
          kept.push_back(ops[i]);
        }
      }
      ops = std::move(kept);
    }
    // Forward and recompute, tiny.toml's 4 steps and 4 ranks.
    EXPECT_EQ(erased, experts * 2 * 4 * 4) << config;
    EXPECT_GT(races(s), 0u) << config;
  }
}

// Gemma-7B's heads are 256 wide, 16 of them on a 3072-wide model: transformers 4.35.2 has no
// Gemma, and its Llama would build hidden / heads = 192-wide heads from such a config. Asked
// for a release that cannot build the model as its config says, or for a family the builder
// walks only as 4.35.2 builds it, the builder refuses in one line naming the key.
TEST(DeepSpeedBuilder, TransformersVersionItCannotWalkIsRefusedNamingTheKey) {
  const auto refusal = [](const std::string& config, const std::string& tf) {
    try {
      build_deepspeed_schedule(
          load_scenario(test::scenario_path("tiny"),
                        {{"model.hf_config", test::source_dir() + "/tests/data/hf/" + config},
                         {"model.layers", "2"},
                         {"model.transformers_version", tf}}),
          "0.13.4");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(built)");
  };
  EXPECT_NE(refusal("gemma-7b.json", "4.35.2")
                .find("model.transformers_version: transformers "
                      "4.35.2 has no model_type gemma"),
            std::string::npos);
  EXPECT_NE(refusal("qwen3-8b.json", "4.35.2").find("has no model_type qwen3"), std::string::npos);
  EXPECT_NE(refusal("mixtral-8x7b.json", "4.35.2").find("has no model_type mixtral"),
            std::string::npos);
  // DeepSeek-V2 is walked as transformers 4.57.1 builds it natively; 4.51.3 has it only as
  // DeepSeek's remote code, and a family recorded with 4.35.2 or 4.51.3 is not walked as 4.57.1.
  EXPECT_NE(refusal("deepseek-v2-lite.json", "4.51.3")
                .find("model.transformers_version: transformers 4.51.3 has no native model_type "
                      "deepseek_v2"),
            std::string::npos);
  EXPECT_NE(refusal("llama-2-7b.json", "4.57.1")
                .find("the DeepSpeed builder walks model_type llama as transformers 4.35.2 or "
                      "4.51.3 builds it"),
            std::string::npos);
  EXPECT_EQ(refusal("deepseek-v2-lite.json", "auto"), "(built)");
  EXPECT_NE(refusal("falcon-7b.json", "4.51.3")
                .find("model.transformers_version: the DeepSpeed "
                      "builder walks model_type falcon as "
                      "transformers 4.35.2 builds it"),
            std::string::npos);
  // The positive controls: the same configs in a release that has them.
  EXPECT_EQ(refusal("gemma-7b.json", "4.51.3"), "(built)");
  EXPECT_EQ(refusal("falcon-7b.json", "auto"), "(built)");
  // A Llama with heads of its own width: transformers 4.35.2 would ignore head_dim.
  Scenario own =
      load_scenario(test::scenario_path("tiny"),
                    {{"model.hf_config", test::source_dir() + "/tests/data/hf/llama-2-7b.json"},
                     {"model.layers", "2"},
                     {"model.transformers_version", "4.35.2"}});
  own.model.head_dim = 64;  // 32 heads of 64 on a 4096-wide model
  EXPECT_THROW(build_deepspeed_schedule(own, "0.13.4"), InputError);
  own.model.transformers_version = "auto";
  const Schedule s = build_deepspeed_schedule(own, "0.13.4");
  EXPECT_EQ(s.source.at("transformers"), "4.51.3");
  EXPECT_EQ(units_of(s).second, parameter_count(own.model));
}

// A coalesced gather's torch.cat reads one slice per rank out of the flat buffer: one strided
// access. The checker reads it as one; its report is the one it gives when each slice is a
// plain access of its own, races and stale reads included.
TEST(DeepSpeedBuilder, StridedReadsGiveTheVerdictTheirSlicesGive) {
  int checked = 0;
  for (const char* v : {"0.13.4", "0.13.1", "0.13.5"}) {
    for (const Variant var : {Variant::kStock, Variant::kEventWait}) {
      Scenario sc = unrecorded_llama();
      sc.run.variant = var;
      const Schedule s = build_deepspeed_schedule(sc, v);
      ASSERT_TRUE(has_strided_accesses(s)) << v;
      const check::CheckResult strided = check::check_schedule(s);
      const check::CheckResult sliced = check::check_schedule(unfold_strided(s));
      const check::TextReporter text;
      EXPECT_EQ(text.render_one(strided), text.render_one(sliced)) << v << " " << to_string(var);
      ASSERT_EQ(strided.groups.size(), sliced.groups.size());
      for (std::size_t g = 0; g < strided.groups.size(); ++g) {
        EXPECT_EQ(strided.groups[g].count, sliced.groups[g].count);
        EXPECT_EQ(strided.groups[g].example.offset, sliced.groups[g].example.offset);
        EXPECT_EQ(strided.groups[g].example.bytes, sliced.groups[g].example.bytes);
      }
      EXPECT_LT(strided.stats.accesses, sliced.stats.accesses);
      checked += strided.clean() ? 0 : 1;
    }
  }
  EXPECT_GE(checked, 2);  // stock 0.13.4 races and 0.13.1 reads stale: findings were compared
}

// Every gather's staging buffer goes back to the allocator: the flat buffer and qwZ's int8,
// scales, torch.cat and quantize outputs, each freed once after its last use, on the stream it
// was allocated on (PP:1224-1318 and the handles' lifetimes, PP:640-702).
TEST(DeepSpeedBuilder, EveryGathersStagingBufferIsFreedOnItsStream) {
  const Scenario sc =
      load_scenario(test::scenario_path("llama2-7b"), {{"run.builder", "deepspeed"}});
  ASSERT_TRUE(sc.zero.zero_quantized_weights);
  const Schedule s = build_schedule(sc);
  const RankSchedule& rs = s.ranks[0];
  std::map<BufferId, StreamId> live;
  std::map<std::string, int> freed;
  for (const Op& op : rs.ops) {
    if (op.kind != OpKind::kAlloc && op.kind != OpKind::kFree) continue;
    const std::string& name = rs.buffers[op.buffer].name;
    if (name.rfind("allgather.", 0) != 0 && name != "quantize.out") continue;
    if (op.kind == OpKind::kAlloc) {
      ASSERT_TRUE(live.emplace(op.buffer, op.stream).second) << name << " allocated twice";
    } else {
      const auto it = live.find(op.buffer);
      ASSERT_NE(it, live.end()) << name << " freed while not allocated";
      EXPECT_EQ(it->second, op.stream) << name;
      live.erase(it);
      ++freed[name];
    }
  }
  EXPECT_TRUE(live.empty()) << live.size() << " staging buffers never freed, the first "
                            << rs.buffers[live.begin()->first].name;
  for (const char* name : {"allgather.int8", "allgather.scales", "quantize.out", "allgather.cat",
                           "allgather.dequantized"}) {
    EXPECT_GT(freed[name], 0) << name;
  }
}

// qwZ on bf16 from 0.19.6 (PR 8215, rule qwz-bf16-cast): CUDAQuantizer.quantize casts the shard
// (or the torch.cat of shards) to an fp16 temporary that the kernel reads, freed when quantize
// returns (PP:890 at 0.19.8); a parameter gathered alone is dequantized to fp16 and cast to
// bf16 (PP:727-730, 896-901). 0.19.5 issues neither, and neither does an fp16 run (`.to(half)`
// of an fp16 tensor is no copy); the casts add no race.
TEST(DeepSpeedBuilder, QwzOnBf16CastsAroundTheQuantizerFrom0196) {
  // Allocations or frees of the named buffer on rank 0.
  const auto lifetimes = [](const Schedule& s, const char* buffer, OpKind kind) {
    const RankSchedule& rs = s.ranks[0];
    int n = 0;
    for (const Op& op : rs.ops) {
      n +=
          op.kind == kind && op.buffer != kNoBuffer && rs.buffers[op.buffer].name == buffer ? 1 : 0;
    }
    return n;
  };
  // Copies on rank 0 that write the named buffer (the casts).
  const auto writes = [](const Schedule& s, const char* buffer) {
    const RankSchedule& rs = s.ranks[0];
    int n = 0;
    for (const Op& op : rs.ops) {
      if (op.kind != OpKind::kCopy) continue;
      for (const Access& acc : s.accesses_of(0, op)) {
        n += acc.mode == AccessMode::kWrite && rs.buffers[acc.buffer].name == buffer ? 1 : 0;
      }
    }
    return n;
  };
  Scenario sc = unrecorded_llama();
  sc.zero.zero_quantized_weights = true;
  sc.training.dtype = "bf16";
  const Schedule before = build_deepspeed_schedule(sc, "0.19.5");
  const Schedule after = build_deepspeed_schedule(sc, "0.19.6");
  EXPECT_EQ(lifetimes(before, "quantize.fp16", OpKind::kAlloc), 0);
  EXPECT_EQ(lifetimes(before, "dequantize.fp16", OpKind::kAlloc), 0);
  const int casts_in = writes(after, "quantize.fp16");
  EXPECT_GT(casts_in, 0);
  EXPECT_EQ(lifetimes(after, "quantize.fp16", OpKind::kAlloc), casts_in);
  EXPECT_EQ(lifetimes(after, "quantize.fp16", OpKind::kFree), casts_in);
  // Every quantize kernel reads a cast: one per quantized gather.
  int quantizes = 0;
  for (const Op& op : after.ranks[0].ops) quantizes += op.kind == OpKind::kQuantize ? 1 : 0;
  EXPECT_EQ(quantizes, casts_in);
  EXPECT_GT(lifetimes(after, "dequantize.fp16", OpKind::kAlloc), 0);  // the norms, gathered alone
  EXPECT_EQ(lifetimes(after, "dequantize.fp16", OpKind::kAlloc),
            lifetimes(after, "dequantize.fp16", OpKind::kFree));
  EXPECT_EQ(races(after), 0u);
  sc.training.dtype = "fp16";
  const Schedule half = build_deepspeed_schedule(sc, "0.19.6");
  EXPECT_EQ(lifetimes(half, "quantize.fp16", OpKind::kAlloc), 0);
  EXPECT_EQ(lifetimes(half, "dequantize.fp16", OpKind::kAlloc), 0);
}

// Secondary slices past a parameter's end (scenarios/zero-element-slice.toml: 12-element norms
// on 16 ranks, hpZ 8), by each version's copy bounds in _partition_param_sec: 0.13.4 tests the
// primary slice's bounds and leaves ranks 12 and 13's secondary slices (elements 8 to 11)
// unwritten, which the hpZ gathers read; 0.13.5 raises in narrow() on ranks 7 and 15 (issue
// 5642), and so do 0.14.4 and 0.17.6, whose clamped length still leaves narrow() a start past
// the parameter's end (issue 6659; real DeepSpeed 0.14.4 raised so on rank 7 when the model was
// recorded as every rank). Init reads only a shard's own elements (its padding is never
// written), so 0.13.4 reads no padding.
TEST(DeepSpeedBuilder, SecondarySlicesPastTheEndFollowEachVersionsCopyBounds) {
  const Scenario sc = load_scenario(test::scenario_path("zero-element-slice"));
  const auto check = [&](const char* v) {
    Scenario s = sc;
    s.zero.deepspeed_version = v;
    return check::check_schedule(build_schedule(s));
  };
  const check::CheckResult legacy = check("0.13.4");
  ASSERT_FALSE(legacy.groups.empty());
  for (const check::FindingGroup& g : legacy.groups) {
    EXPECT_EQ(g.example.kind, check::FindingKind::kUninitializedRead);
    EXPECT_EQ(g.example.role, BufferRole::kSecondary);
    EXPECT_EQ(g.ranks, (std::set<Rank>{12, 13}));
  }
  const std::map<std::string, std::string> issue = {
      {"0.13.5", "narrow(): length must be non-negative; issue 5642"},
      {"0.14.4", "narrow(): start out of range; issue 6659"},
      {"0.17.6", "narrow(): start out of range; issue 6659"},
      {"0.19.4", "narrow(): start out of range; issue 6659, fixed by PR 8210 in 0.19.5"}};
  for (const auto& [v, why] : issue) {
    Scenario crash = sc;
    crash.zero.deepspeed_version = v;
    try {
      build_schedule(crash);
      ADD_FAILURE() << v << " built a copy that raises in DeepSpeed";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("zero.deepspeed_version: DeepSpeed " + v + " raises"), std::string::npos)
          << what;
      // Rank 7 is the first to raise: its slice starts at element 14 of 12.
      EXPECT_NE(what.find("on rank 7 (its secondary slice starts at element 14 of the "
                          "parameter's 12"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
    }
  }
  // 0.19.5 (PR 8210, issue 6659's fix) zero-fills each secondary before its copy and copies
  // nothing where the slice starts past the end: it builds, and no gather reads an unwritten
  // byte (padding included) where 0.13.4 read ranks 12-13's unwritten slices.
  Scenario fixed = sc;
  fixed.zero.deepspeed_version = "0.19.5";
  const check::CheckResult r = check::check_schedule(build_schedule(fixed));
  EXPECT_EQ(r.count(check::FindingKind::kUninitializedRead), 0u);
  EXPECT_TRUE(r.clean()) << check::TextReporter().render_one(r);
}

// The IR's accesses cover only meaningful bytes (sim/schedule.hpp): no op reads the padding
// of a shard, whose elements past the parameter's end nothing writes. On the hidden-30 model
// (norms padded from 30 to 32 elements over 16 ranks) every version's reads of primary and
// secondary shards stay within the parameter's own elements, and the checker finds no
// uninitialized read where the version copies every slice (0.14.4, 0.17.6). Before 2026-11-26
// a coalesced gather sent its whole flat slot, padding included: 3 uninitialized reads on
// rank 15 with either version, and on Llama-2-7B over 3 nodes 284 with 0.13.5 and 0.14.4.
TEST(DeepSpeedBuilder, NoOpReadsPadding) {
  const Scenario sc = scenario_of(recording("tiny-h30-0.14.4"));
  for (const char* v : {"0.13.4", "0.14.4", "0.17.6"}) {
    const Schedule s = build_deepspeed_schedule(sc, v);
    std::uint64_t shard_reads = 0;
    for (const RankSchedule& rs : s.ranks) {
      for (const Op& op : rs.ops) {
        for (const Access& a : s.accesses_of(rs.rank, op)) {
          const Buffer& b = rs.buffers[a.buffer];
          if (a.mode != AccessMode::kRead || b.unit == kNoUnit ||
              (b.role != BufferRole::kPrimary && b.role != BufferRole::kSecondary)) {
            continue;
          }
          const ParamUnit& u = s.units[static_cast<std::size_t>(b.unit)];
          const bool primary = b.role == BufferRole::kPrimary;
          const std::uint64_t size = primary ? u.shard_numel : u.secondary_numel;
          const std::uint64_t place =
              static_cast<std::uint64_t>(primary ? rs.rank : rs.rank % s.hpz_size);
          const std::uint64_t own =
              u.numel > place * size ? std::min(size, u.numel - place * size) : 0;
          EXPECT_LE(a.end(), own * static_cast<std::uint64_t>(s.dtype_bytes))
              << v << ", rank " << rs.rank << ": " << to_string(op.kind) << " reads " << b.name;
          ++shard_reads;
        }
      }
    }
    EXPECT_GT(shard_reads, 1000u) << v;
    const auto found = verdict(check::check_schedule(s));
    EXPECT_EQ(found.count(check::FindingKind::kUninitializedRead) > 0, std::string(v) == "0.13.4")
        << v;
  }
}

// What `check --record` prints under a recording's verdict: equal to the builder's schedule of
// the same scenario, or where the builder first differs, with each side's op.
TEST(DeepSpeedBuilder, ComparesARecordingWithTheBuilder) {
  const Schedule rec = recording("tiny-0.13.4");
  const RecordingComparison same =
      compare_recording(rec, build_deepspeed_schedule(scenario_of(rec), "0.13.4"));
  EXPECT_TRUE(same.equal()) << same.divergence;
  EXPECT_EQ(same.ranks, std::vector<Rank>{0});
  EXPECT_GT(same.ops, 1000u);
  EXPECT_EQ(describe(same).rfind("builder: equal to this recording, op for op (", 0), 0u)
      << describe(same);
  // 0.13.5 syncs the host after each secondary copy, which 0.13.4 does not.
  const RecordingComparison other =
      compare_recording(rec, build_deepspeed_schedule(scenario_of(rec), "0.13.5"));
  ASSERT_FALSE(other.equal());
  EXPECT_EQ(other.diverging_rank, 0);
  const std::string line = describe(other);
  EXPECT_EQ(line.rfind("builder: differs from this recording on rank 0, first divergence at "
                       "projected op ",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find("the builder 8 host waits for S0"), std::string::npos) << line;
  EXPECT_EQ(line.find(": DeepSpeed ?"), std::string::npos) << line;
  EXPECT_NE(line.find("please report it"), std::string::npos) << line;
  // A difference the caller knows the reason for says so instead of asking for a report.
  RecordingComparison known = other;
  known.expected_because = "the reason";
  EXPECT_NE(describe(known).find("; expected: the reason)"), std::string::npos) << describe(known);
  EXPECT_EQ(describe(known).find("please report it"), std::string::npos) << describe(known);
  // The ranks DeepSpeed ran as: every rank, or those --rank auto named.
  EXPECT_EQ(recorded_ranks(recording("tiny-h30-0.14.4")).size(), 16u);
  Schedule some = rec;
  some.source["recorded_rank"] = "0,7,15";
  EXPECT_EQ(recorded_ranks(some), (std::vector<Rank>{0, 7, 15}));
  some.source["recorded_rank"] = "x";
  EXPECT_EQ(recorded_ranks(some), std::vector<Rank>{0});
}

// qgZ's groups as _get_local_all_to_all_group makes them (utils/groups.py:356-382 at v0.13.4):
// on several nodes one per node and one per local index across the nodes, on one node only the
// node's (whose gradients are reduce-scattered over the world, not all-to-all'd).
TEST(DeepSpeedBuilder, QgzGroupsAreDeepSpeeds) {
  const auto kinds = [](const std::string& nodes) {
    const Schedule s = build_deepspeed_schedule(
        load_scenario(test::scenario_path("tiny"),
                      {{"cluster.nodes", nodes}, {"zero.zero_quantized_gradients", "true"}}),
        "0.13.4");
    std::map<GroupKind, int> n;
    for (const Group& g : s.groups) ++n[g.kind];
    bool all_to_all = false;
    for (const RankSchedule& r : s.ranks) {
      for (const Op& op : r.ops) all_to_all = all_to_all || op.kind == OpKind::kAllToAll;
    }
    return std::make_tuple(n[GroupKind::kIntraNode], n[GroupKind::kInterNode], all_to_all);
  };
  EXPECT_EQ(kinds("2"), std::make_tuple(2, 2, true));  // tiny.toml: 2 GPUs a node
  // 6 ranks: no matrix of the tiny model divides by 2 x 6, so each falls back to a
  // reduce-scatter (coalesced_collectives.py:46-53, DeepSpeed PR 5056).
  EXPECT_EQ(kinds("3"), std::make_tuple(3, 2, false));
  EXPECT_EQ(kinds("1"), std::make_tuple(1, 0, false));
}

// qgZ before 0.13.2 sends every 2-D gradient to its all-to-all (coalesced_collectives.py:41-46
// at v0.13.1), which cannot split one whose size is not a multiple of 2 x world: DeepSpeed
// raises, and the builder says so in one line. 0.13.2 (PR 5056) reduce-scatters it instead.
// Where every gradient divides, 0.13.1 is built (held to tiny-0.13.1-qgz and tiny-0.10.3-qgz).
TEST(DeepSpeedBuilder, QgzBefore0132RaisesOnAGradientTheAllToAllCannotSplit) {
  Scenario sc = unrecorded_llama();
  sc.zero.zero_quantized_gradients = true;
  EXPECT_NO_THROW(build_deepspeed_schedule(sc, "0.13.1"));
  sc.model.hidden = 100;  // 4 heads of 25
  sc.model.ffn = 250;     // 25,000 elements an MLP matrix, 5,000 k_proj: not multiples of 16
  try {
    build_deepspeed_schedule(sc, "0.13.1");
    ADD_FAILURE() << "0.13.1 built";
  } catch (const ReleaseRefusal& e) {
    // The first of the first bucket by ds_id that does not divide: k_proj, 50 x 100.
    EXPECT_NE(std::string(e.what()).find("DeepSpeed 0.13.1 raises at qgZ's all-to-all of the "
                                         "gradient of model.layers.0.self_attn.k_proj.weight "
                                         "(5000 elements, not a multiple of 2 x world = 16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(build_deepspeed_schedule(sc, "0.13.2"));
}

TEST(DeepSpeedBuilder, UnknownVersionIsRefusedWithTheKnownOnes) {
  Scenario sc;
  try {
    build_deepspeed_schedule(sc, "0.9.5");  // before ZeRO++
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a DeepSpeed release from 0.10.0 to 0.19.8"),
              std::string::npos)
        << e.what();
  }
  // A release the builder does not model for this run names the rule it lacks.
  sc.run.step_stream = "side";
  try {
    build_deepspeed_schedule(sc, "0.17.6");
    FAIL() << "accepted";
  } catch (const ReleaseRefusal& e) {
    EXPECT_NE(std::string(e.what()).find("lacks rule 'accumulate-grad-off-compute-stream'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hpz
