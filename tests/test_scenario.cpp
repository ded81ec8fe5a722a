// Scenario loading: shipped files, presets, hf_config / ds_config, --set, and every error path.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/model_shape.hpp"
#include "sim/record_inputs.hpp"
#include "sim/scenario.hpp"
#include "tests/input_error.hpp"
#include "tests/paths.hpp"
#include "tests/temp_dir.hpp"

namespace hpz {
namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = test::source_dir();
const fs::path kScenarios = kSourceDir / "scenarios";
const fs::path kData = kSourceDir / "tests" / "data";

using test::error_of;

/** Each test writes its scenarios into a directory of its own. */
class ScenarioFile : public test::TempDirTest {
 protected:
  /** The error of loading a file made of `text` (a tiny model unless text has a [model]). */
  std::string load_error(const std::string& text, const std::vector<Override>& overrides = {}) {
    const std::string path = write("s.toml", with_model(text));
    return error_of([&] { load_scenario(path, overrides); });
  }

  Scenario load(const std::string& text, const std::vector<Override>& overrides = {}) {
    return load_scenario(write("s.toml", with_model(text)), overrides);
  }

  /** hpzlab's parameter count of the Hugging Face config whose keys are `keys` (JSON members). */
  std::uint64_t hf_count(const std::string& keys) {
    write("hf.json", "{" + keys + "}");
    return static_cast<std::uint64_t>(parameter_count(
        load_scenario(write("s.toml", "[model]\nhf_config = \"hf.json\"\n")).model));
  }

  static std::string with_model(const std::string& text) {
    return text.find("[model]") == std::string::npos ? "[model]\npreset = \"tiny\"\n" + text : text;
  }
};

// --- shipped scenarios ------------------------------------------------------------------------

TEST(ShippedScenarios, EveryFileLoads) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(kScenarios)) {
    if (entry.path().extension() != ".toml") continue;
    names.push_back(entry.path().stem().string());
    EXPECT_NO_THROW({
      const Scenario s = load_scenario(entry.path().string());
      EXPECT_EQ(s.path, entry.path().string());
    }) << entry.path();
  }
  for (const char* expected :
       {"llama2-7b", "llama2-13b", "llama2-70b", "falcon-40b", "tiny", "stale-after-step",
        "stale-after-load", "zero-element-slice", "mismatched-collectives"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
}

TEST(ShippedScenarios, DefaultIsTheStudysCluster) {
  const Scenario s = load_scenario((kScenarios / "llama2-7b.toml").string());
  EXPECT_EQ(s.cluster.nodes, 2);
  EXPECT_EQ(s.cluster.gpus_per_node, 8);
  EXPECT_EQ(s.cluster.world_size(), 16);
  EXPECT_EQ(s.cluster.gpu.name, "a100-80g");
  EXPECT_DOUBLE_EQ(s.cluster.nvlink_gbytes_per_s, 600);
  EXPECT_DOUBLE_EQ(s.cluster.nic_gbps, 12.5);
  EXPECT_EQ(s.cluster.nics_per_node, 1);
  EXPECT_EQ(s.model.name, "llama2-7b");
  EXPECT_EQ(s.zero.zero_hpz_partition_size, 8);
  EXPECT_TRUE(s.zero.zero_quantized_gradients);
  EXPECT_TRUE(s.zero.zero_quantized_weights);
  EXPECT_TRUE(s.zero.overlap_comm);
  EXPECT_EQ(s.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(s.training.dtype, "bf16");
  EXPECT_EQ(s.training.seq_len, 2048);
  EXPECT_TRUE(s.training.grad_checkpointing);
  EXPECT_EQ(s.run.variant, Variant::kStock);
  EXPECT_EQ(s.run.fill, Fill::kNan);
  EXPECT_EQ(s.run.steps, 2);
  EXPECT_EQ(s.run.spin_before_copy_us, 0);  // the default scenario is timed as it is
  EXPECT_EQ(s.zero.deepspeed_version, "0.13.4");
  EXPECT_TRUE(s.notes.empty());
}

TEST(ShippedScenarios, TinyAndBugClasses) {
  const Scenario tiny = load_scenario((kScenarios / "tiny.toml").string());
  EXPECT_EQ(tiny.cluster.world_size(), 4);
  EXPECT_EQ(tiny.zero.zero_hpz_partition_size, 2);
  EXPECT_EQ(tiny.zero.stage3_param_persistence_threshold, 0);
  EXPECT_EQ(tiny.training.dtype, "fp32");
  EXPECT_EQ(tiny.training.dtype_bytes(), 4);
  EXPECT_EQ(tiny.training.seq_len, 32);
  EXPECT_EQ(tiny.run.steps, 4);
  EXPECT_EQ(tiny.run.spin_before_copy_us, 200);

  const auto bug = [](const char* name) {
    const Scenario s = load_scenario((kScenarios / name).string());
    EXPECT_EQ(s.run.variant, Variant::kEventWait) << name;
    EXPECT_EQ(s.cluster.world_size(), 16) << name;
    EXPECT_EQ(s.zero.zero_hpz_partition_size, 8) << name;
    EXPECT_EQ(s.zero.stage3_param_persistence_threshold, 0) << name;
    return s;
  };
  // Issue 4851 is DeepSpeed 0.13.1's own behaviour, the copy bounds 0.13.4's and the load
  // run.load's; the mismatch is a [bugs] key the DeepSpeed builder applies.
  const Scenario step = bug("stale-after-step.toml");
  EXPECT_EQ(step.zero.deepspeed_version, "0.13.1");
  EXPECT_EQ(step.run.steps, 3);
  const Scenario load = bug("stale-after-load.toml");
  EXPECT_EQ(load.run.load, "checkpoint");
  const Scenario slice = bug("zero-element-slice.toml");  // DeepSpeed 0.13.4's copy bounds
  EXPECT_EQ(slice.zero.deepspeed_version, "0.13.4");
  EXPECT_EQ(slice.model.name, "custom");
  EXPECT_EQ(slice.model.hidden, 12);
  EXPECT_EQ(slice.model.heads, 2);
  EXPECT_EQ(slice.model.kv_heads, 2);
  EXPECT_EQ(slice.model.ffn, 32);
  EXPECT_EQ(slice.model.vocab, 64);
  const Scenario mismatch = bug("mismatched-collectives.toml");
  EXPECT_EQ(mismatch.bugs.secondary_mismatch_rank, 3);
}

// --- presets ----------------------------------------------------------------------------------

TEST(Presets, Models) {
  struct Expected {
    const char* name;
    int layers, hidden, ffn, heads, kv_heads, vocab;
    bool gated;
  };
  for (const Expected& e : {Expected{"llama2-7b", 32, 4096, 11008, 32, 32, 32000, true},
                            Expected{"llama2-13b", 40, 5120, 13824, 40, 40, 32000, true},
                            Expected{"llama2-70b", 80, 8192, 28672, 64, 8, 32000, true},
                            Expected{"falcon-40b", 60, 8192, 32768, 128, 8, 65024, false},
                            Expected{"tiny", 2, 64, 128, 4, 4, 256, true}}) {
    const ModelConfig m = model_preset(e.name);
    EXPECT_EQ(m.name, e.name);
    EXPECT_EQ(m.layers, e.layers) << e.name;
    EXPECT_EQ(m.hidden, e.hidden) << e.name;
    EXPECT_EQ(m.ffn, e.ffn) << e.name;
    EXPECT_EQ(m.heads, e.heads) << e.name;
    EXPECT_EQ(m.kv_heads, e.kv_heads) << e.name;
    EXPECT_EQ(m.vocab, e.vocab) << e.name;
    EXPECT_EQ(m.gated_mlp, e.gated) << e.name;
  }
  EXPECT_EQ(model_preset_names().size(), 5u);
}

TEST(Presets, Gpus) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  EXPECT_DOUBLE_EQ(gpu_preset("a100-80g").peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(gpu_preset("a100-80g").hbm_bytes_per_s, 2.039e12);
  EXPECT_DOUBLE_EQ(gpu_preset("a100-80g").memory_bytes, 80 * gib);
  EXPECT_DOUBLE_EQ(gpu_preset("h100-sxm").peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h100-sxm").hbm_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h100-sxm").memory_bytes, 80 * gib);
  EXPECT_DOUBLE_EQ(gpu_preset("h200").peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h200").hbm_bytes_per_s, 4.8e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h200").memory_bytes, 141e9);
  EXPECT_EQ(gpu_preset("h200").name, "h200");
}

TEST(Presets, UnknownNamesListTheAllowedOnes) {
  const std::string model = error_of([] { model_preset("llama3"); });
  EXPECT_HAS(model, "model.preset");
  EXPECT_HAS(model, "llama2-7b, llama2-13b, llama2-70b, falcon-40b, tiny");
  const std::string gpu = error_of([] { gpu_preset("v100"); });
  EXPECT_HAS(gpu, "cluster.gpu");
  EXPECT_HAS(gpu, "a100-80g, h100-sxm, h200");
}

TEST_F(ScenarioFile, DefaultsWhenSectionsAreLeftOut) {
  const Scenario s = load("");
  EXPECT_EQ(s.cluster.world_size(), 16);
  EXPECT_EQ(s.cluster.gpu.name, "a100-80g");
  EXPECT_EQ(s.zero.zero_hpz_partition_size, 1);
  EXPECT_FALSE(s.zero.zero_quantized_weights);
  EXPECT_EQ(s.zero.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(s.run.seed, 1u);
  EXPECT_EQ(s.bugs.secondary_mismatch_rank, -1);
}

TEST_F(ScenarioFile, ExplicitKeysOverrideThePreset) {
  const Scenario s = load(
      "[model]\npreset = \"llama2-7b\"\nlayers = 4\nkv_heads = 8\n"
      "[cluster]\ngpu = \"h200\"\n");
  EXPECT_EQ(s.model.name, "llama2-7b");
  EXPECT_EQ(s.model.layers, 4);
  EXPECT_EQ(s.model.kv_heads, 8);
  EXPECT_EQ(s.model.hidden, 4096);
  EXPECT_EQ(s.model.ffn, 11008);
  EXPECT_DOUBLE_EQ(s.cluster.gpu.hbm_bytes_per_s, 4.8e12);
}

TEST_F(ScenarioFile, CustomModelDefaults) {
  const Scenario s = load("[model]\nlayers = 3\nhidden = 96\nffn = 256\nheads = 6\nvocab = 100\n");
  EXPECT_EQ(s.model.name, "custom");
  EXPECT_EQ(s.model.kv_heads, 6);
  EXPECT_TRUE(s.model.gated_mlp);
  EXPECT_EQ(s.model.layers, 3);
}

TEST_F(ScenarioFile, IntegralFloatsAreIntegers) {
  const Scenario s = load(
      "[zero]\nstage3_prefetch_bucket_size = 5e7\nstage3_max_live_parameters "
      "= 3e8\n[cluster]\nnic_gbps = 25\n");
  EXPECT_EQ(s.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(s.zero.stage3_max_live_parameters, 300'000'000);
  EXPECT_DOUBLE_EQ(s.cluster.nic_gbps, 25);
}

// --- hf_config and ds_config --------------------------------------------------------------------

TEST(ModelFiles, HuggingFaceLlamaConfig) {
  const Scenario s = load_scenario((kData / "with_hf_config.toml").string());
  EXPECT_HAS(s.model.name, "hf_llama/config.json");
  EXPECT_EQ(s.model.layers, 4);  // the TOML's layers overrides num_hidden_layers = 80
  EXPECT_EQ(s.model.hidden, 8192);
  EXPECT_EQ(s.model.ffn, 28672);
  EXPECT_EQ(s.model.heads, 64);
  EXPECT_EQ(s.model.kv_heads, 8);
  EXPECT_EQ(s.model.vocab, 32000);
  EXPECT_TRUE(s.model.gated_mlp);
}

TEST(ModelFiles, HuggingFaceFalconConfig) {
  const Scenario s = load_scenario((kData / "with_falcon_config.toml").string());
  EXPECT_EQ(s.model.layers, 60);
  EXPECT_EQ(s.model.ffn, 4 * 8192);
  EXPECT_EQ(s.model.heads, 128);
  EXPECT_EQ(s.model.kv_heads, 8);
  EXPECT_EQ(s.model.vocab, 65024);
  EXPECT_FALSE(s.model.gated_mlp);
}

TEST(ModelFiles, DeepSpeedConfig) {
  const Scenario s = load_scenario((kData / "with_ds_config.toml").string());
  EXPECT_EQ(s.zero.zero_hpz_partition_size, 4);
  EXPECT_TRUE(s.zero.zero_quantized_weights);
  EXPECT_TRUE(s.zero.zero_quantized_gradients);
  EXPECT_FALSE(s.zero.overlap_comm);
  EXPECT_TRUE(s.zero.offload_param);                             // {"device": "cpu"}
  EXPECT_EQ(s.zero.stage3_prefetch_bucket_size, 1000);           // the TOML wins over the ds_config
  EXPECT_EQ(s.zero.stage3_param_persistence_threshold, 10'000);  // 1e4 in JSON
  EXPECT_EQ(s.zero.stage3_max_live_parameters, 300'000'000);
  EXPECT_EQ(s.zero.stage3_max_reuse_distance, 1'000'000'000);  // "auto" keeps the default

  const auto count = [&](const std::string& part) {
    return std::count_if(s.notes.begin(), s.notes.end(), [&](const std::string& note) {
      return note.find(part) != std::string::npos;
    });
  };
  ASSERT_EQ(count("ignored"), 1);
  const std::string ignored =
      *std::find_if(s.notes.begin(), s.notes.end(),
                    [](const std::string& n) { return n.find("ignored") != std::string::npos; });
  EXPECT_HAS(ignored, "zero_optimization.contiguous_gradients");
  // Read, not ignored (issue 17): the stage, the batch keys, the precision, the reduce bucket.
  for (const char* key : {"overlap_comm", "train_micro_batch_size_per_gpu", "reduce_bucket_size",
                          "gradient_accumulation_steps", "bf16", "zero_optimization.stage,"}) {
    EXPECT_EQ(ignored.find(key), std::string::npos) << key << ": " << ignored;
  }
  EXPECT_EQ(s.zero.stage, 3);
  EXPECT_EQ(s.training.micro_batch, 1);
  EXPECT_EQ(s.training.grad_accum, 1);
  EXPECT_EQ(s.training.dtype, "bf16");
  EXPECT_EQ(count("stage3_max_reuse_distance is \"auto\""), 1);
}

TEST(ModelFiles, SetOverridesTheDeepSpeedConfig) {
  const Scenario s =
      load_scenario((kData / "with_ds_config.toml").string(),
                    {{"zero.overlap_comm", "true"}, {"zero.offload_param", "false"}});
  EXPECT_TRUE(s.zero.overlap_comm);
  EXPECT_FALSE(s.zero.offload_param);
}

// Issue 35: a ds_config the user names on the command line wins over the scenario file's keys,
// which fill only what it leaves, a note for each; --set beats both; a ds_config the scenario
// itself names is overridden by the scenario's keys, as before.
TEST_F(ScenarioFile, TheUsersDeepSpeedConfigWinsOverTheScenariosKeys) {
  const std::string ds =
      write("ds.json",
            R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3,
          "overlap_comm": false, "zero_hpz_partition_size": 2}})");
  const std::string scenario = write("s.toml", with_model(R"([training]
micro_batch = 4
[zero]
overlap_comm = true
zero_quantized_weights = true
)"));
  const Scenario s = load_scenario(scenario, {{"zero.ds_config", ds}});
  EXPECT_FALSE(s.zero.overlap_comm);
  EXPECT_EQ(s.training.micro_batch, 2);
  EXPECT_TRUE(s.zero.zero_quantized_weights);  // the file leaves it: the scenario fills it
  auto noted = [&](const Scenario& sc, const std::string& part) {
    return std::any_of(sc.notes.begin(), sc.notes.end(),
                       [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  EXPECT_TRUE(noted(s, "zero.overlap_comm = true in " + scenario + " gives way to " + ds));
  EXPECT_TRUE(noted(s, "training.micro_batch = 4 in " + scenario + " gives way to " + ds));
  EXPECT_TRUE(noted(s, "zero.zero_quantized_weights = true from " + scenario + ": your ds_config " +
                           ds + " does not set it"));
  // --set beats the file.
  EXPECT_TRUE(load_scenario(scenario, {{"zero.ds_config", ds}, {"zero.overlap_comm", "true"}})
                  .zero.overlap_comm);
  // Named by the scenario itself, the file is overridden by the scenario's keys.
  const std::string own = write("own.toml", with_model("[zero]\nds_config = \"ds.json\"\n"
                                                       "overlap_comm = true\n"));
  EXPECT_TRUE(load_scenario(own, {}).zero.overlap_comm);
}

TEST_F(ScenarioFile, MalformedAndMissingJsonNameTheFile) {
  fs::copy_file(kData / "malformed.json", dir_ / "ds.json");
  const std::string malformed = load_error("[zero]\nds_config = \"ds.json\"\n");
  EXPECT_HAS(malformed, "ds.json");
  EXPECT_HAS(malformed, "malformed JSON");
  EXPECT_HAS(malformed, "line 5");

  const std::string missing = load_error("[model]\nhf_config = \"nowhere/config.json\"\n");
  EXPECT_HAS(missing, "s.toml: model.hf_config: cannot read");
  EXPECT_HAS(missing, "nowhere/config.json");

  write("hf.json",
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
        "\"vocab_size\": 10}");
  const std::string incomplete = load_error("[model]\nhf_config = \"hf.json\"\n");
  EXPECT_HAS(incomplete, "hf.json: num_hidden_layers: missing");

  write("hf2.json",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": \"two\", \"hidden_size\": 64}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf2.json\"\n"),
             "hf2.json: num_hidden_layers: expected an integer, got 'two'");

  write("ds2.json", "{\"zero_optimization\": {\"overlap_comm\": 1, \"offload_param\": {}}}");
  EXPECT_HAS(load_error("[zero]\nds_config = \"ds2.json\"\n"),
             "ds2.json: zero_optimization.overlap_comm: expected a boolean (true or false), got 1");
  write("ds3.json", "{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}");
  const std::string device = load_error("[zero]\nds_config = \"ds3.json\"\n");
  EXPECT_HAS(device, "ds3.json: zero_optimization.offload_param.device: unknown value 'gpu'");
  EXPECT_HAS(device, "(allowed: none, cpu, nvme)");
  write("ds4.json", "{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": 5.5e0}}");
  EXPECT_HAS(load_error("[zero]\nds_config = \"ds4.json\"\n"),
             "ds4.json: zero_optimization.stage3_prefetch_bucket_size: expected an integer");
  write("ds5.json", "{\"zero_optimization\": {\"stage\": 3, \"zero_hpz_partition_size\": 3}}");
  EXPECT_HAS(load_error("[zero]\nds_config = \"ds5.json\"\n"),
             "ds5.json: zero.zero_hpz_partition_size: 3 does not divide the world size 16");
}

// --- hostile input (issue 20): one line, exit 2, never a crash ----------------------------------

TEST_F(ScenarioFile, DeeplyNestedJsonIsRefusedNotDumped) {
  // 5,000 levels where a number is expected: dumping the value in the message recursed once per
  // level and overflowed the stack.
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  write("ds.json", "{\"zero_optimization\": {\"overlap_comm\": " + deep + "}}");
  const std::string error = load_error("[zero]\nds_config = \"ds.json\"\n");
  EXPECT_HAS(error, "ds.json: malformed JSON read for zero.ds_config: nested more than 64 levels");
  EXPECT_EQ(error.find('\n'), std::string::npos);
  // Shallow enough to read, a structured value is shown cut short.
  write("hf.json", "{\"model_type\": \"llama\", \"num_hidden_layers\": " + std::string(50, '[') +
                       std::string(50, ']') +
                       ", \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 10}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf.json\"\n"),
             "hf.json: num_hidden_layers: expected an integer, got [[[[...]]]]");
}

TEST_F(ScenarioFile, JsonNumberBeyondADoubleIsOneLine) {
  // nlohmann throws out_of_range, not parse_error, for 1e999: it became "internal error".
  write("hf.json", "{\"num_hidden_layers\": 2, \"rope_theta\": 1e999}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf.json\"\n"),
             "hf.json: malformed JSON read for model.hf_config (number overflow parsing '1e999')");
}

TEST_F(ScenarioFile, DuplicateJsonKeysAndNulBytesAreRefused) {
  write("ds.json", "{\"zero_optimization\": {\"overlap_comm\": true, \"overlap_comm\": false}}");
  EXPECT_HAS(load_error("[zero]\nds_config = \"ds.json\"\n"),
             "ds.json: overlap_comm: malformed JSON read for zero.ds_config: this key is given "
             "twice in one object");
  write("nul.json", std::string("{\"zero_optimization\": {}}\0garbage", 33));
  EXPECT_HAS(load_error("[zero]\nds_config = \"nul.json\"\n"), "a NUL byte at offset 25");
}

TEST_F(ScenarioFile, ADeepSpeedAliasNextToItsStage3NameIsRefused) {
  // One of the two was dropped by key order, an invalid one never reported.
  write("ds.json",
        "{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": 5, "
        "\"prefetch_bucket_size\": -1}}");
  EXPECT_HAS(load_error("[zero]\nds_config = \"ds.json\"\n"),
             "ds.json: zero_optimization.stage3_prefetch_bucket_size: given together with its "
             "alias zero_optimization.prefetch_bucket_size (allowed: one of the two)");
}

TEST_F(ScenarioFile, ValuesTomlCannotHoldNameTheirKey) {
  // toml++ refuses 1e400 and 2^63 before it knows the key: the line and column were all.
  EXPECT_HAS(load_error("[cluster]\nnodes = 9223372036854775808\n"),
             "s.toml: cluster.nodes: line 4, column 28: malformed TOML");
  EXPECT_HAS(load_error("[cluster]\nnodes = 9223372036854775808\n"),
             "line 4, column 28: malformed TOML: Error while parsing decimal integer: "
             "'9223372036854775808' is not representable in 64 bits (allowed: an integer of at "
             "most 2^63 - 1)");
  EXPECT_HAS(load_error("[sim]\n  jitter  = 1e400\n"),
             "s.toml: sim.jitter: line 4, column 18: malformed TOML");
  // --set reads a number too small for a double as 0, as the TOML parser does.
  EXPECT_EQ(load("[sim]\njitter = 1e-400\n").sim.jitter, 0);
  EXPECT_EQ(load("", {{"sim.jitter", "1e-400"}}).sim.jitter, 0);
  EXPECT_HAS(load_error("", {{"sim.jitter", "1e400"}}), "--set: sim.jitter: expected a number");
}

TEST_F(ScenarioFile, HuggingFaceDimensionsAreCheckedWhereTheyAreWritten) {
  // 4 x hidden_size overflowed int (the model was accepted as "ffn 4"), and a 0 was reported as
  // the scenario's model.layers, a key the user never wrote.
  write("hf.json",
        "{\"model_type\": \"falcon\", \"num_hidden_layers\": 2, \"hidden_size\": 1073741824, "
        "\"num_attention_heads\": 4, \"vocab_size\": 10}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf.json\"\n"),
             "hf.json: hidden_size: 1073741824 is too large: the MLP is 4 x hidden_size = "
             "4294967296 wide");
  // A Llama needs intermediate_size (LlamaConfig's default, 11008, is no rule of the model's).
  write("hf4.json",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
        "\"num_attention_heads\": 4, \"vocab_size\": 10}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf4.json\"\n"),
             "hf4.json: intermediate_size: missing");
  write("hf3.json",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_attention_heads\": 3, \"vocab_size\": 10}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf3.json\"\n"),
             "hf3.json: num_attention_heads: 3 heads do not divide hidden_size = 64");
  write("hf5.json",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_attention_heads\": 4, \"num_key_value_heads\": 3, "
        "\"vocab_size\": 10}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf5.json\"\n"),
             "hf5.json: num_key_value_heads: 3 key/value heads do not divide "
             "num_attention_heads = 4");
  write("hf0.json",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 0, \"hidden_size\": 64, "
        "\"num_attention_heads\": 4, \"vocab_size\": 10}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf0.json\"\n"),
             "hf0.json: num_hidden_layers: must be at least 1, got 0");
}

TEST_F(ScenarioFile, InputFilesAreRegularAndCapped) {
  EXPECT_HAS(error_of([] { load_scenario("/dev/zero"); }),
             "/dev/zero: cannot read the scenario file: is not a regular file");
  const std::string big = (dir_ / "big.toml").string();
  fs::resize_file(write("big.toml", ""), (std::uintmax_t{64} << 20) + 1);
  EXPECT_HAS(error_of([&] { load_scenario(big); }), "is 67108865 bytes (allowed: at most 64 MiB)");
}

TEST_F(ScenarioFile, ValuesInMessagesAreEscapedAndCut) {
  // A newline in a value split the one-line message (and could forge a second error line); a
  // 200 KB value gave a 200 KB message.
  const std::string forged = load_error("[run]\nvariant = \"x\\nhpzlab: error: forged\"\n");
  EXPECT_EQ(forged.find('\n'), std::string::npos) << forged;
  EXPECT_HAS(forged, "unknown value 'x\\nhpzlab: error: forged'");
  const std::string long_key = load_error("[run]\n" + std::string(20000, 'k') + " = 1\n");
  EXPECT_LT(long_key.size(), 1000u);
  EXPECT_HAS(long_key, "... (20004 bytes)");
  EXPECT_EQ(shown(std::string("a\tb\x01") + std::string(100, 'c')),
            "a\\tb\\x01" + std::string(72, 'c') + "... (104 bytes)");
}

// --- --set --------------------------------------------------------------------------------------

TEST(Overrides, ParseOverride) {
  EXPECT_EQ(parse_override("zero.overlap_comm=false"), Override("zero.overlap_comm", "false"));
  EXPECT_EQ(parse_override("model.hf_config=a=b.json"), Override("model.hf_config", "a=b.json"));
  const std::string error = error_of([] { parse_override("zero.overlap_comm"); });
  EXPECT_HAS(error, "--set: zero.overlap_comm: expected section.key=value");
  EXPECT_HAS(error_of([] { parse_override("=3"); }), "missing key");
}

TEST(Overrides, EveryTypeOfKey) {
  const Scenario s = load_scenario((kScenarios / "llama2-7b.toml").string(),
                                   {{"zero.overlap_comm", "false"},
                                    {"cluster.nodes", "4"},
                                    {"cluster.nic_gbps", "100"},
                                    {"cluster.internode_latency_us", "2.5"},
                                    {"zero.stage3_prefetch_bucket_size", "1e6"},
                                    {"run.variant", "event-wait"},
                                    {"run.fill", "\"zero\""},
                                    {"cluster.gpu", "h100-sxm"},
                                    {"run.steps", "3"},
                                    {"run.steps", "5"}});  // the last one wins
  EXPECT_FALSE(s.zero.overlap_comm);
  EXPECT_EQ(s.cluster.world_size(), 32);
  EXPECT_DOUBLE_EQ(s.cluster.nic_gbps, 100);
  EXPECT_DOUBLE_EQ(s.cluster.internode_latency_us, 2.5);
  EXPECT_EQ(s.zero.stage3_prefetch_bucket_size, 1'000'000);
  EXPECT_EQ(s.run.variant, Variant::kEventWait);
  EXPECT_EQ(s.run.fill, Fill::kZero);
  EXPECT_EQ(s.cluster.gpu.name, "h100-sxm");
  EXPECT_EQ(s.run.steps, 5);
}

TEST(Overrides, ModelSourceReplacesTheFilesSource) {
  const Scenario preset =
      load_scenario((kData / "with_hf_config.toml").string(), {{"model.preset", "llama2-13b"}});
  EXPECT_EQ(preset.model.name, "llama2-13b");
  EXPECT_EQ(preset.model.hidden, 5120);
  EXPECT_EQ(preset.model.layers, 4);  // the file's explicit key still applies
}

TEST_F(ScenarioFile, OverrideErrorsSayDashDashSet) {
  const std::string key = load_error("", {{"zero.overlap_com", "false"}});
  EXPECT_HAS(key, "--set: zero.overlap_com: unknown key");
  EXPECT_HAS(key, "did you mean 'zero.overlap_comm'?");
  EXPECT_HAS(load_error("", {{"zero.overlap_comm", "yes"}}),
             "--set: zero.overlap_comm: expected a boolean (true or false), got 'yes'");
  EXPECT_HAS(load_error("", {{"cluster.nodes", "two"}}),
             "--set: cluster.nodes: expected an integer, got 'two'");
  EXPECT_HAS(load_error("", {{"cluster.nic_gbps", "fast"}}),
             "--set: cluster.nic_gbps: expected a number, got 'fast'");
  const std::string variant = load_error("", {{"run.variant", "eventwait"}});
  EXPECT_HAS(variant, "--set: run.variant: unknown value 'eventwait'; did you mean 'event-wait'?");
  EXPECT_HAS(variant, "(allowed: stock, host-sync, event-wait)");
  EXPECT_HAS(load_error("", {{"zero.zero_hpz_partition_size", "3"}}),
             "--set: zero.zero_hpz_partition_size: 3 does not divide the world size 16");
  EXPECT_HAS(load_error("", {{"nodes", "3"}}),
             "--set: nodes: a key must belong to a section; "
             "did you mean 'cluster.nodes'?");
}

// --- errors in files ----------------------------------------------------------------------------

TEST_F(ScenarioFile, UnreadableAndMalformedFiles) {
  const std::string missing = (dir_ / "missing.toml").string();
  const std::string unreadable = error_of([&] { load_scenario(missing); });
  EXPECT_HAS(unreadable, missing + ": cannot read the scenario file: No such file or directory");
  EXPECT_HAS(error_of([&] { load_scenario(dir_.string()); }), "is a directory");

  const std::string bad = write("bad.toml", "[zero]\noverlap_comm = true\nstage = = 3\n");
  const std::string malformed = error_of([&] { load_scenario(bad); });
  EXPECT_HAS(malformed, "bad.toml: zero.stage: line 3");
  EXPECT_HAS(malformed, "malformed TOML");
  const std::string twice = write("twice.toml", "[zero]\noverlap_comm = true\noverlap_comm = 1\n");
  // The key on the line is named too (issue 20).
  EXPECT_HAS(error_of([&] { load_scenario(twice); }), "twice.toml: zero.overlap_comm: line 3");
}

TEST_F(ScenarioFile, UnknownSectionsAndKeys) {
  const std::string key = load_error("[zero]\noverlap_com = false\n");
  EXPECT_HAS(key, "s.toml: zero.overlap_com: unknown key; did you mean 'zero.overlap_comm'?");
  EXPECT_HAS(key, "allowed in [zero]: ds_config, stage, zero_hpz_partition_size,");
  const std::string section = load_error("[zeroo]\noverlap_comm = false\n");
  EXPECT_HAS(section,
             "s.toml: zeroo.overlap_comm: unknown section 'zeroo'; did you mean "
             "'zero.overlap_comm'?");
  EXPECT_HAS(section, "(allowed: cluster, model, training, zero, run, bugs, sim)");
  EXPECT_HAS(load_error("[cluster]\nseq_len = 4\n"), "did you mean 'training.seq_len'?");
  const std::string top = write("top.toml", "nodes = 2\n[model]\npreset = \"tiny\"\n");
  EXPECT_HAS(error_of([&] { load_scenario(top); }),
             "top.toml: nodes: a key must belong to a section; did you mean 'cluster.nodes'?");
  const std::string far = load_error("[run]\ncolour = 1\n");
  EXPECT_HAS(far,
             "run.colour: unknown key (allowed in [run]: variant, builder, fill, seed, steps, "
             "spin_before_copy_us, torch_version, load, step_stream, skipped_steps)");
}

TEST_F(ScenarioFile, WrongTypes) {
  EXPECT_HAS(load_error("[zero]\noverlap_comm = \"yes\"\n"),
             "s.toml: zero.overlap_comm: expected a boolean (true or false), got 'yes'");
  EXPECT_HAS(load_error("[zero]\noverlap_comm = 1\n"), "expected a boolean (true or false), got 1");
  EXPECT_HAS(load_error("[cluster]\nnodes = 2.5\n"),
             "s.toml: cluster.nodes: expected an integer (a whole number), got 2.5");
  EXPECT_HAS(load_error("[cluster]\nnodes = \"2\"\n"), "cluster.nodes: expected an integer");
  EXPECT_HAS(load_error("[cluster]\nnic_gbps = \"fast\"\n"), "cluster.nic_gbps: expected a number");
  EXPECT_HAS(load_error("[run]\nvariant = 2\n"), "run.variant: expected a string, got 2");
  EXPECT_HAS(load_error("[zero.offload_param]\ndevice = \"cpu\"\n"),
             "zero.offload_param: expected a boolean (true or false), got a table");
  EXPECT_HAS(load_error("[cluster]\nnodes = [2]\n"), "expected an integer, got an array");
  EXPECT_HAS(load_error("[cluster]\nnodes = 3000000000\n"), "out of range");
  EXPECT_HAS(load_error("[run]\nseed = -1\n"), "run.seed: must be a non-negative integer");
}

TEST_F(ScenarioFile, SizesAndWorld) {
  EXPECT_HAS(load_error("[zero]\nzero_hpz_partition_size = 3\n"),
             "zero.zero_hpz_partition_size: 3 does not divide the world size 16 (nodes x "
             "gpus_per_node) (allowed: 1, 2, 4, 8, 16)");
  EXPECT_HAS(load_error("[zero]\nzero_hpz_partition_size = 32\n"),
             "zero.zero_hpz_partition_size: 32 is larger than the world size 16");
  EXPECT_HAS(load_error("[zero]\nzero_hpz_partition_size = 0\n"), "must be at least 1, got 0");
  EXPECT_HAS(load_error("[cluster]\nnodes = 0\n"), "s.toml: cluster.nodes: must be at least 1");
  EXPECT_HAS(load_error("[cluster]\ngpus_per_node = -8\n"), "cluster.gpus_per_node: must be");
  EXPECT_HAS(load_error("[cluster]\nnic_gbps = 0\n"),
             "cluster.nic_gbps: must be a positive number of Gbit/s, got 0");
  EXPECT_HAS(load_error("[cluster]\nnvlink_gbytes_per_s = -600\n"), "cluster.nvlink_gbytes_per_s");
  EXPECT_HAS(load_error("[cluster]\nnvlink_gbytes_per_s = inf\n"), "must be a positive number");
  EXPECT_HAS(load_error("[cluster]\ninternode_latency_us = -1\n"), "must be a non-negative");
  EXPECT_HAS(load_error("[cluster]\nnics_per_node = 0\n"), "cluster.nics_per_node");
  EXPECT_HAS(load_error("[training]\nseq_len = 0\n"), "training.seq_len: must be at least 1");
  EXPECT_HAS(load_error("[run]\nsteps = 0\n"), "run.steps: must be at least 1, got 0");
  EXPECT_HAS(load_error("[zero]\nstage3_prefetch_bucket_size = -1\n"), "must be at least 0");
}

TEST_F(ScenarioFile, PresetsAndEnums) {
  const std::string gpu = load_error("[cluster]\ngpu = \"h100\"\n");
  EXPECT_HAS(gpu, "s.toml: cluster.gpu: unknown value 'h100'; did you mean 'h100-sxm'?");
  EXPECT_HAS(gpu, "(allowed: a100-80g, h100-sxm, h200)");
  const std::string model = load_error("[model]\npreset = \"llama-7b\"\n");
  EXPECT_HAS(model, "model.preset: unknown value 'llama-7b'; did you mean 'llama2-7b'?");
  EXPECT_HAS(model, "(allowed: llama2-7b, llama2-13b, llama2-70b, falcon-40b, tiny)");
  EXPECT_HAS(load_error("[training]\ndtype = \"int8\"\n"),
             "training.dtype: unknown value 'int8' (allowed: bf16, fp16, fp32)");
  EXPECT_HAS(load_error("[run]\nfill = \"nans\"\n"),
             "run.fill: unknown value 'nans'; did you mean 'nan'? (allowed: nan, stale, zero)");
  EXPECT_HAS(load_error("[model]\npreset = \"tiny\"\nhf_config = \"x.json\"\n"),
             "give either model.preset or model.hf_config, not both");
}

TEST_F(ScenarioFile, ModelShape) {
  EXPECT_HAS(load_error("[model]\npreset = \"tiny\"\nheads = 5\n"),
             "model.heads: 5 heads do not divide hidden = 64");
  EXPECT_HAS(load_error("[model]\npreset = \"tiny\"\nkv_heads = 3\n"),
             "model.kv_heads: 3 key/value heads do not divide heads = 4");
  EXPECT_HAS(load_error("[model]\npreset = \"tiny\"\nlayers = 0\n"),
             "model.layers: must be at least 1");
  const std::string missing = load_error("[model]\nlayers = 2\nhidden = 64\nheads = 4\n");
  EXPECT_HAS(missing, "s.toml: model.ffn: missing: ffn, vocab");
  EXPECT_HAS(missing, "presets: llama2-7b,");
  EXPECT_HAS(load_error("[cluster]\nnodes = 1\n[model]\n"), "model.layers: missing");
}

TEST_F(ScenarioFile, BugsInRange) {
  EXPECT_HAS(load_error("[bugs]\nsecondary_mismatch_rank = 16\n"),
             "bugs.secondary_mismatch_rank: 16 is out of range (allowed: -1 for none, or a rank 0 "
             "to 15");
  EXPECT_NO_THROW(load("[bugs]\nsecondary_mismatch_rank = 15\n"));
}

// The coarse builder was retired (issue 31): run.builder takes "deepspeed" alone, and the
// [bugs] keys it alone applied name what replaces them, whatever their value.
TEST_F(ScenarioFile, TheCoarseBuilderAndItsBugKeysAreRetired) {
  EXPECT_NO_THROW(load("[run]\nbuilder = \"deepspeed\"\n"));
  EXPECT_HAS(load_error("[run]\nbuilder = \"coarse\"\n"),
             "run.builder: the coarse builder was retired: every schedule is DeepSpeed's "
             "(allowed: \"deepspeed\"");
  EXPECT_HAS(load_error("[run]\nbuilder = \"exact\"\n"), "run.builder: unknown value 'exact'");
  EXPECT_HAS(load_error("[bugs]\nskip_secondary_invalidation = false\n"),
             "bugs.skip_secondary_invalidation: retired with the coarse builder: DeepSpeed issue "
             "4851 is 0.13.1's own (remove it and set zero.deepspeed_version = \"0.13.1\")");
  EXPECT_HAS(load_error("[bugs]\ncheckpoint_load_at_step = 0\n"),
             "bugs.checkpoint_load_at_step: retired with the coarse builder: issue 7606's load is "
             "run.load (remove it and set run.load = \"checkpoint\")");
  EXPECT_HAS(load_error("[bugs]\nlegacy_copy_bounds = true\n"),
             "bugs.legacy_copy_bounds: retired with the coarse builder: the copy bounds before PR "
             "5216 are DeepSpeed 0.13.4's own (remove it and set zero.deepspeed_version = "
             "\"0.13.4\")");
}

TEST(Validate, ScenariosBuiltInCode) {
  Scenario s;
  s.model = model_preset("tiny");
  s.cluster.gpu = gpu_preset("h100-sxm");
  EXPECT_NO_THROW(validate(s));
  s.zero.zero_hpz_partition_size = 5;
  EXPECT_HAS(error_of([&] { validate(s); }), "zero.zero_hpz_partition_size: 5 does not divide");
  s.zero.zero_hpz_partition_size = 8;
  s.training.dtype = "bf8";
  EXPECT_HAS(error_of([&] { validate(s); }), "training.dtype: unknown value 'bf8'");
}

TEST(Names, ToString) {
  EXPECT_STREQ(to_string(Variant::kStock), "stock");
  EXPECT_STREQ(to_string(Variant::kHostSync), "host-sync");
  EXPECT_STREQ(to_string(Variant::kEventWait), "event-wait");
  EXPECT_STREQ(to_string(Fill::kNan), "nan");
  EXPECT_STREQ(to_string(Fill::kStale), "stale");
  EXPECT_STREQ(to_string(Fill::kZero), "zero");
}

TEST_F(ScenarioFile, SimSectionDefaultsAndKeys) {
  const Scenario defaults = load("");
  EXPECT_DOUBLE_EQ(defaults.sim.compute_efficiency, 0.6);
  EXPECT_EQ(defaults.sim.collective_model, "fine");
  EXPECT_EQ(defaults.sim.network_model, "CM02");
  const Scenario s = load(
      "[sim]\ncompute_efficiency = 0.5\nmemory_efficiency = 0.7\nlaunch_overhead_us = 4\n"
      "kernel_latency_us = 1\npcie_gbytes_per_s = 32\njitter = 0\ncollective_model = "
      "\"coarse\"\nnetwork_model = \"LV08\"\nbandwidth_factor = 1\nlatency_factor = 13.01\n",
      {{"sim.jitter", "0.1"}});
  EXPECT_DOUBLE_EQ(s.sim.compute_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(s.sim.memory_efficiency, 0.7);
  EXPECT_DOUBLE_EQ(s.sim.launch_overhead_us, 4);
  EXPECT_DOUBLE_EQ(s.sim.kernel_latency_us, 1);
  EXPECT_DOUBLE_EQ(s.sim.pcie_gbytes_per_s, 32);
  EXPECT_DOUBLE_EQ(s.sim.jitter, 0.1);
  EXPECT_EQ(s.sim.collective_model, "coarse");
  EXPECT_EQ(s.sim.network_model, "LV08");
  EXPECT_DOUBLE_EQ(s.sim.bandwidth_factor, 1);
  EXPECT_DOUBLE_EQ(s.sim.latency_factor, 13.01);
}

TEST_F(ScenarioFile, SimSectionErrors) {
  EXPECT_HAS(load_error("[sim]\ncompute_efficiency = 1.5\n"),
             "sim.compute_efficiency: 1.5 is out of range");
  EXPECT_HAS(load_error("[sim]\ncollective_model = \"corse\"\n"), "did you mean 'coarse'");
  EXPECT_HAS(load_error("[sim]\nnetwork_model = \"ns3\"\n"), "CM02");
  EXPECT_HAS(load_error("[sim]\njiter = 0.1\n"), "did you mean 'sim.jitter'");
  EXPECT_HAS(load_error("", {{"sim.jitter", "-1"}}), "sim.jitter");
  EXPECT_HAS(load_error("[sim]\npcie_gbytes_per_s = 0\n"), "sim.pcie_gbytes_per_s");
}

// --- the ds_config's batch and precision keys, as DeepSpeed reads them (issue 17) -------------

TEST_F(ScenarioFile, DeepSpeedBatchRule) {
  // 2 nodes x 2 GPUs = world 4 (runtime/config.py, _set_batch_related_parameters).
  const std::string head = "[cluster]\nnodes = 2\ngpus_per_node = 2\n[model]\npreset = \"tiny\"\n";
  auto load_ds = [&](const std::string& json, const std::string& extra = "") {
    write("ds.json", json);
    return load_scenario(write("s.toml", head + extra + "[zero]\nds_config = \"ds.json\"\n"));
  };
  Scenario s = load_ds(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_EQ(s.training.micro_batch, 4);
  EXPECT_EQ(s.training.grad_accum, 2);  // 32 / 4 / 4
  s = load_ds(R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})");
  EXPECT_EQ(s.training.micro_batch, 2);  // 32 / 4 / 4
  s = load_ds(R"({"train_batch_size": 8})");
  EXPECT_EQ(s.training.micro_batch, 2);
  EXPECT_EQ(s.training.grad_accum, 1);
  s = load_ds(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})");
  EXPECT_EQ(s.training.micro_batch, 3);
  EXPECT_EQ(s.training.grad_accum, 5);
  // The three disagree: DeepSpeed's assertion, one line.
  EXPECT_HAS(error_of([&] {
               load_ds(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                           "gradient_accumulation_steps": 2})");
             }),
             "ds.json: train_batch_size: 30 != train_micro_batch_size_per_gpu 4 x "
             "gradient_accumulation_steps 2 x world size 4");
  // A scenario key wins over the file, with a note.
  s = load_ds(R"({"train_micro_batch_size_per_gpu": 4})", "[training]\nmicro_batch = 2\n");
  EXPECT_EQ(s.training.micro_batch, 2);
  EXPECT_TRUE(std::any_of(s.notes.begin(), s.notes.end(), [](const std::string& n) {
    return n.find("training.micro_batch = 2 from") != std::string::npos &&
           n.find("train_micro_batch_size_per_gpu 4") != std::string::npos;
  }));
  // "auto" (the HF Trainer's) keeps hpzlab's value, with a note.
  s = load_ds(R"({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"})");
  EXPECT_EQ(s.training.micro_batch, 1);
}

TEST_F(ScenarioFile, DeepSpeedPrecision) {
  const std::string toml = "[model]\npreset = \"tiny\"\n[zero]\nds_config = \"ds.json\"\n";
  auto dtype = [&](const std::string& json) {
    write("ds.json", json);
    return load_scenario(write("s.toml", toml)).training.dtype;
  };
  EXPECT_EQ(dtype(R"({"bf16": {"enabled": true}})"), "bf16");
  EXPECT_EQ(dtype(R"({"bfloat16": {"enabled": true}})"), "bf16");  // DeepSpeed's old name
  EXPECT_EQ(dtype(R"({"fp16": {"enabled": true}, "bf16": {"enabled": false}})"), "fp16");
  EXPECT_EQ(dtype(R"({"fp16": {"loss_scale": 0}})"), "fp32");  // enabled defaults to false
  EXPECT_EQ(dtype("{}"), "fp32");
  write("ds.json", R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_HAS(error_of([&] { load_scenario(write("s.toml", toml)); }),
             "ds.json: bf16: and fp16 are both enabled");
}

TEST_F(ScenarioFile, DeepSpeedPrecisionAutoKeepsTheScenarios) {
  // "auto" is the HF Trainer's (its --bf16 / --fp16): the scenario's dtype stays, not fp32.
  const std::string toml = "[model]\npreset = \"tiny\"\n[zero]\nds_config = \"ds.json\"\n";
  write("ds.json", R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}})");
  Scenario s = load_scenario(write("s.toml", toml));
  EXPECT_EQ(s.training.dtype, "bf16");
  EXPECT_TRUE(std::any_of(s.notes.begin(), s.notes.end(), [](const std::string& n) {
    return n.find("bf16.enabled is \"auto\"") != std::string::npos;
  }));
  s = load_scenario(write("s.toml", toml + "[training]\ndtype = \"fp16\"\n"));
  EXPECT_EQ(s.training.dtype, "fp16");
  write("ds.json", R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": true}})");
  EXPECT_EQ(load_scenario(write("s.toml", toml)).training.dtype, "fp16");
}

TEST_F(ScenarioFile, BatchAutoKeepsTheScenarios) {
  // Accumulation "auto" is the Trainer's argument: the scenario's value stands, and no note
  // claims the batch keys are missing.
  write("ds.json", R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                       "gradient_accumulation_steps": "auto"})");
  const Scenario s = load_scenario(write(
      "s.toml",
      "[model]\npreset = \"tiny\"\n[zero]\nds_config = \"ds.json\"\n[training]\ngrad_accum = 4\n"
      "micro_batch = 2\n"));
  EXPECT_EQ(s.training.grad_accum, 4);
  EXPECT_EQ(s.training.micro_batch, 2);
  for (const std::string& n : s.notes)
    EXPECT_EQ(n.find("DeepSpeed asserts"), std::string::npos) << n;
  EXPECT_EQ(std::count_if(s.notes.begin(), s.notes.end(),
                          [](const std::string& n) {
                            return n.find("gradient_accumulation_steps are \"auto\"") !=
                                   std::string::npos;
                          }),
            1);
}

// The HF Trainer's fill (transformers 4.35.2 integrations/deepspeed.py, trainer_config_finalize;
// the same values in accelerate, axolotl and LLaMA-Factory): from the hidden size h,
// reduce_bucket_size h^2, stage3_prefetch_bucket_size 0.9 h^2 and
// stage3_param_persistence_threshold 10 h.
TEST_F(ScenarioFile, AutoFilledAsTheHfTrainerDoesOnlyWhenAsked) {
  write("ds.json", R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto",
                       "stage3_param_persistence_threshold": "auto", "reduce_bucket_size": "auto"}})");
  const std::string toml = "[model]\npreset = \"llama2-7b\"\n[zero]\nds_config = \"ds.json\"\n";
  const Scenario plain = load_scenario(write("s.toml", toml));
  EXPECT_EQ(plain.zero.stage3_prefetch_bucket_size, 50'000'000);  // DeepSpeed's defaults
  EXPECT_EQ(plain.zero.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(plain.zero.reduce_bucket_size, 500'000'000);
  EXPECT_TRUE(std::any_of(plain.notes.begin(), plain.notes.end(), [](const std::string& n) {
    return n.find("the HF Trainer would fill 15099494") != std::string::npos;
  }));
  const std::string path = write("s.toml", toml);
  for (const Scenario& s :
       {load_scenario(path, {{"training.hf_trainer", "true"}}),
        load_scenario(path, {}, {{"--hf-trainer", "training.hf_trainer", "true"}})}) {
    EXPECT_EQ(s.zero.stage3_prefetch_bucket_size, 15'099'494);  // int(0.9 x 4096^2)
    EXPECT_EQ(s.zero.stage3_param_persistence_threshold, 40'960);
    EXPECT_EQ(s.zero.reduce_bucket_size, 4096 * 4096);
    EXPECT_TRUE(std::any_of(s.notes.begin(), s.notes.end(), [](const std::string& n) {
      return n.find("40960 as the HF Trainer fills it") != std::string::npos;
    }));
  }
}

TEST_F(ScenarioFile, MicsIsRefused) {
  write("ds.json", R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})");
  const std::string toml = "[model]\npreset = \"tiny\"\n[zero]\nds_config = \"ds.json\"\n";
  EXPECT_HAS(error_of([&] { load_scenario(write("s.toml", toml)); }),
             "ds.json: zero_optimization.mics_shard_size: 8: MiCS is not modelled");
  write("ds.json", R"({"zero_optimization": {"stage": 3, "mics_shard_size": -1}})");
  EXPECT_NO_THROW(load_scenario(write("s.toml", toml)));  // DeepSpeed's default: MiCS off
}

// Issue 17's one-command form: the user's files on the defaults, no scenario file.
TEST_F(ScenarioFile, OneCommandFormReadsTheUsersFilesOnTheDefaults) {
  const std::string ds = write("ds.json", R"({"train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4, "overlap_comm": false}})");
  const std::string hf = (kData / "hf_llama" / "config.json").string();
  const Scenario s = load_scenario("", {},
                                   {{"--hf-config", "model.hf_config", hf},
                                    {"--ds-config", "zero.ds_config", ds},
                                    {"--nodes", "cluster.nodes", "4"}});
  EXPECT_EQ(s.path, ds + " + " + hf);
  EXPECT_EQ(s.model.hidden, 8192);
  EXPECT_EQ(s.cluster.nodes, 4);
  EXPECT_EQ(s.cluster.gpus_per_node, 8);  // the documented default
  EXPECT_EQ(s.cluster.nic_gbps, 12.5);
  EXPECT_EQ(s.zero.zero_hpz_partition_size, 4);
  EXPECT_FALSE(s.zero.overlap_comm);
  EXPECT_EQ(s.training.micro_batch, 2);
  // Fine-tuning by default (with a note), unless a flag or --set says otherwise.
  EXPECT_EQ(s.run.load, "pretrained");
  EXPECT_NE(
      std::find_if(s.notes.begin(), s.notes.end(),
                   [](const std::string& n) { return n.rfind("run.load = pretrained", 0) == 0; }),
      s.notes.end());
  EXPECT_EQ(load_scenario("", {},
                          {{"--hf-config", "model.hf_config", hf},
                           {"--ds-config", "zero.ds_config", ds},
                           {"--from-config", "run.load", "none"}})
                .run.load,
            "none");
  // Both files are needed without a scenario; a flag's bad value names the flag.
  EXPECT_HAS(error_of([&] {
               load_scenario("", {}, {{"--hf-config", "model.hf_config", hf}});
             }),
             "--ds-config: is required without a scenario file");
  EXPECT_HAS(error_of([&] {
               load_scenario("", {},
                             {{"--hf-config", "model.hf_config", hf},
                              {"--ds-config", "zero.ds_config", ds},
                              {"--nodes", "cluster.nodes", "0"}});
             }),
             "--nodes: cluster.nodes: must be at least 1");
}

TEST_F(ScenarioFile, PrecedenceScenarioKeysThenFilesThenSet) {
  // The flags' files win over the scenario's own keys (with a note; issue 35, until 2026-11-27
  // the other way round); --set wins over both.
  const std::string ds = write("ds.json", R"({"zero_optimization": {"stage": 3,
      "overlap_comm": false, "zero_hpz_partition_size": 2}})");
  const std::string path = write(
      "s.toml", "[model]\npreset = \"tiny\"\n[zero]\noverlap_comm = true\n[cluster]\nnodes = 3\n");
  const std::vector<FlagSetting> flags = {{"--ds-config", "zero.ds_config", ds},
                                          {"--nodes", "cluster.nodes", "2"}};
  Scenario s = load_scenario(path, {}, flags);
  EXPECT_FALSE(s.zero.overlap_comm);             // the user's file over the scenario's key
  EXPECT_EQ(s.zero.zero_hpz_partition_size, 2);  // the file's, the scenario is silent
  EXPECT_EQ(s.cluster.nodes, 2);                 // the flag, given on the command line
  EXPECT_TRUE(std::any_of(s.notes.begin(), s.notes.end(), [&](const std::string& n) {
    return n.find("zero.overlap_comm = true in " + path + " gives way to " + ds) !=
           std::string::npos;
  }));
  s = load_scenario(path, {{"zero.overlap_comm", "false"}, {"cluster.nodes", "1"}}, flags);
  EXPECT_FALSE(s.zero.overlap_comm);
  EXPECT_EQ(s.cluster.nodes, 1);
  // A model file given as a flag replaces the scenario's preset, as --set does.
  s = load_scenario(
      path, {},
      {{"--hf-config", "model.hf_config", (kData / "hf_llama" / "config.json").string()}});
  EXPECT_EQ(s.model.hidden, 8192);
}

// What `check --record` gives real DeepSpeed (sim/record_inputs.hpp): the user's files with
// every key hpzlab resolved.
TEST_F(ScenarioFile, RecorderInputsSayWhatTheScenarioSays) {
  write("ds.json", R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": 1e-8}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
      "gradient_clipping": "auto", "train_batch_size": "auto", "bfloat16": {"enabled": true},
      "zero_optimization": {"stage": 3, "prefetch_bucket_size": 7, "reduce_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto", "sub_group_size": 1e9}})");
  write("config.json", R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
      "tie_word_embeddings": true})");
  const Scenario sc = load_scenario(
      write("s.toml",
            "[model]\nhf_config = \"config.json\"\nlayers = 3\n[zero]\nds_config = \"ds.json\"\n"
            "zero_hpz_partition_size = 8\n[training]\nmicro_batch = 2\ndtype = \"fp16\"\n"),
      {{"training.hf_trainer", "true"}});
  const nlohmann::json ds = recorder_ds_config(sc);
  const nlohmann::json& zero = ds["zero_optimization"];
  EXPECT_EQ(zero["stage3_prefetch_bucket_size"], 7);  // from its alias, under the stage3_ name
  EXPECT_FALSE(zero.contains("prefetch_bucket_size"));
  EXPECT_EQ(zero["zero_hpz_partition_size"], 8);
  EXPECT_EQ(zero["stage3_param_persistence_threshold"], 640);  // the Trainer's 10 h
  EXPECT_EQ(zero["reduce_bucket_size"], 64 * 64);              // and its h^2
  EXPECT_EQ(zero["sub_group_size"], 1e9);                      // not modelled: passed on
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], 2);
  EXPECT_FALSE(ds.contains("train_batch_size"));  // DeepSpeed derives it
  EXPECT_EQ(ds["fp16"]["enabled"], true);
  EXPECT_EQ(ds["bf16"]["enabled"], false);
  EXPECT_FALSE(ds.contains("bfloat16"));
  EXPECT_EQ(ds["gradient_clipping"], 1.0);
  EXPECT_FALSE(ds["optimizer"]["params"].contains("lr"));  // "auto": the Trainer's only
  EXPECT_EQ(ds["optimizer"]["params"]["eps"], 1e-8);
  const nlohmann::json hf = recorder_hf_config(sc);
  EXPECT_EQ(hf["num_hidden_layers"], 3);  // the scenario's key over the file's
  EXPECT_EQ(hf["tie_word_embeddings"], true);
  EXPECT_FALSE(hf.contains("num_key_value_heads"));  // the file's own default stands
  // A preset Llama is written as one; a preset that is not a Llama needs its config file.
  const Scenario tiny = load_scenario(write("t.toml", "[model]\npreset = \"tiny\"\n"));
  EXPECT_EQ(recorder_hf_config(tiny)["model_type"], "llama");
  EXPECT_EQ(recorder_hf_config(tiny)["hidden_size"], tiny.model.hidden);
  const Scenario falcon = load_scenario(write("f.toml", "[model]\npreset = \"falcon-40b\"\n"));
  EXPECT_HAS(error_of([&] { recorder_hf_config(falcon); }), "not a Llama");
}

// Issue 17: every Hugging Face family hpzlab reads is counted as transformers builds it
// (tests/data/hf/counts.txt, from tools/count-hf-params), and the coarse builder's parameter
// units hold exactly those parameters (a tied output layer once more: gathered again at lm_head).
TEST(HuggingFaceFamilies, ParameterCountsAreTransformers) {
  std::ifstream counts(kData / "hf" / "counts.txt");
  std::string name, version;
  std::uint64_t expected = 0;
  int n = 0;
  while (counts >> name >> expected >> version) {
    ++n;
    const Scenario s = load_scenario(
        "", {},
        {{"--hf-config", "model.hf_config", (kData / "hf" / (name + ".json")).string()},
         {"--ds-config", "zero.ds_config", (kData / "ds_config.json").string()}});
    const ModelConfig& m = s.model;
    EXPECT_EQ(static_cast<std::uint64_t>(parameter_count(m)), expected) << name;
    double units =
        embedding_params(m) + final_norm_params(m) + static_cast<double>(m.vocab) * m.hidden;
    for (int l = 0; l < m.layers; ++l) {
      const LayerShape ls = layer_shape(m, l);
      units += ls.input_norm + ls.attn + ls.post_norm + ls.mlp + ls.expert * ls.experts;
    }
    EXPECT_EQ(units - (m.tied_embeddings ? static_cast<double>(m.vocab) * m.hidden : 0),
              parameter_count(m))
        << name;
    EXPECT_TRUE(std::any_of(s.notes.begin(), s.notes.end(), [&](const std::string& note) {
      return note.find(fmt::format("{} parameters", expected)) != std::string::npos;
    })) << name;
  }
  EXPECT_EQ(n, 21);
}

// Falcon's first configs (RefinedWeb, RefinedWebModel) count as transformers' conversion of them
// does: Falcon-40B's n_head_kv means the new decoder layout (ln_attn and ln_mlp in every layer,
// 983,040 parameters that were missing), Falcon-7B's multi-query layout stays one layernorm.
TEST(HuggingFaceFamilies, RefinedWebConfigsCountAsTheirConversion) {
  const auto count = [](const fs::path& config) {
    return parameter_count(
        load_scenario("", {},
                      {{"--hf-config", "model.hf_config", config.string()},
                       {"--ds-config", "zero.ds_config", (kData / "ds_config.json").string()}})
            .model);
  };
  EXPECT_EQ(count(kData / "hf" / "legacy" / "falcon-40b-refinedweb.json"),
            count(kData / "hf" / "falcon-40b.json"));
  EXPECT_EQ(count(kData / "hf" / "falcon-40b.json"), 41303293952.0);  // counts.txt
  EXPECT_EQ(count(kData / "hf" / "legacy" / "falcon-7b-refinedwebmodel.json"),
            count(kData / "hf" / "falcon-7b.json"));
}

// A config saved from a head other than the causal LM is refused by name, not counted as one.
TEST(HuggingFaceFamilies, AHeadOtherThanTheCausalLMIsRefusedByName) {
  const std::string file = (kData / "hf" / "legacy" / "gpt2-sequence-classification.json").string();
  const std::string message = error_of([&] {
    load_scenario("", {},
                  {{"--hf-config", "model.hf_config", file},
                   {"--ds-config", "zero.ds_config", (kData / "ds_config.json").string()}});
  });
  EXPECT_NE(message.find(file + ": architectures: 'GPT2ForSequenceClassification' is a head"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("allowed: a causal-LM head"), std::string::npos) << message;
}

TEST(HuggingFaceFamilies, ExpertsAreUnitsOfTheirOwn) {
  const auto hf = [](const std::string& name) {
    return load_scenario(
               "", {},
               {{"--hf-config", "model.hf_config", (kData / "hf" / (name + ".json")).string()},
                {"--ds-config", "zero.ds_config", (kData / "ds_config.json").string()}})
        .model;
  };
  const ModelConfig mixtral = hf("mixtral-8x7b");
  EXPECT_EQ(mixtral.experts, 8);
  EXPECT_EQ(layer_shape(mixtral, 0).experts, 8);
  EXPECT_EQ(layer_shape(mixtral, 0).expert, 3.0 * 4096 * 14336);
  EXPECT_EQ(layer_shape(mixtral, 0).mlp, 4096.0 * 8);  // the router
  const ModelConfig deepseek = hf("deepseek-v2-lite");
  EXPECT_EQ(layer_shape(deepseek, 0).experts, 0);  // first_k_dense_replace = 1
  EXPECT_EQ(layer_shape(deepseek, 1).experts, 64);
  const ModelConfig gpt2 = hf("gpt2");
  EXPECT_TRUE(gpt2.tied_embeddings);
  EXPECT_EQ(gpt2.learned_positions, 1024);
  EXPECT_FALSE(gpt2.gated_mlp);
  const ModelConfig pythia = hf("pythia-1.4b");
  EXPECT_FALSE(pythia.gated_mlp);  // GPT-NeoX's MLP: dense_h_to_4h, dense_4h_to_h
  EXPECT_EQ(hf("gemma-7b").head_dim, 256);
  EXPECT_TRUE(hf("llama-3.2-1b").tied_embeddings);
  EXPECT_FALSE(hf("llama-2-7b").tied_embeddings);
  EXPECT_EQ(hf("falcon-7b").norms_per_layer, 1);
  EXPECT_EQ(hf("falcon-40b").norms_per_layer, 2);
  // Only a Llama-2-shaped model is what the DeepSpeed builder and the numeric replay walk.
  EXPECT_TRUE(llama_shaped(hf("llama-2-7b")));
  EXPECT_TRUE(llama_shaped(hf("mistral-7b")));
  for (const char* other : {"llama-3.2-1b", "qwen2-7b", "gemma-7b", "mixtral-8x7b", "gpt2"}) {
    EXPECT_FALSE(llama_shaped(hf(other))) << other;
  }
}

// Llama's attention_bias puts a bias on all four attention projections (o_proj too) and mlp_bias
// on the three MLP ones; Mistral has none whatever its config says. The counts are
// transformers 4.55.4's (tools/count-hf-params on these three configs).
TEST_F(ScenarioFile, LlamaBiasesAreCountedAsTransformersBuildsThem) {
  const std::string base = R"("hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
      "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000)";
  const auto count = [&](const std::string& extra) { return hf_count(base + ", " + extra); };
  EXPECT_EQ(count(R"("model_type": "llama", "attention_bias": true)"), 2186880u);
  EXPECT_EQ(count(R"("model_type": "llama", "mlp_bias": true)"), 2188800u);
  EXPECT_EQ(count(R"("model_type": "mistral", "attention_bias": true)"), 2184960u);
  EXPECT_EQ(count(R"("model_type": "llama")"), 2184960u);
}

// DeepSeek-V2 as transformers 4.57.1 builds it: attention_bias on q_a_proj, kv_a_proj_with_mqa
// and o_proj, mlp_bias on every DeepseekV2MLP (experts and shared experts too), and its config
// class's defaults where a key is absent (q_lora_rank 1536, n_shared_experts 2) or null (no
// q_a_proj, no shared experts). The counts are transformers 4.57.1's (`sum(p.numel())` of the
// model it builds from each config on the meta device, 2026-11-26).
TEST_F(ScenarioFile, DeepSeekV2IsCountedAsTransformers4571BuildsIt) {
  const std::string base = R"("model_type": "deepseek_v2", "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 8,
      "vocab_size": 1000, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "n_routed_experts": 4, "first_k_dense_replace": 1, "kv_lora_rank": 32,
      "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16)";
  const auto count = [&](const std::string& extra) {
    return hf_count(base + (extra.empty() ? "" : ", ") + extra);
  };
  EXPECT_EQ(count(R"("q_lora_rank": null, "n_shared_experts": 1)"), 1701728u);
  EXPECT_EQ(count(R"("q_lora_rank": 48, "n_shared_experts": 1, "attention_bias": true)"), 1619960u);
  EXPECT_EQ(count(R"("q_lora_rank": null, "n_shared_experts": 1, "mlp_bias": true)"), 1706848u);
  EXPECT_EQ(count(""), 3721568u);
  EXPECT_EQ(count(R"("n_shared_experts": null, "q_lora_rank": null)"), 1603424u);
  const std::string four = R"("n_routed_experts": 4)";
  std::string null_experts = base;
  null_experts.replace(null_experts.find(four), four.size(), R"("n_routed_experts": null)");
  write("hf.json", "{" + null_experts + "}");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf.json\"\n"),
             "hf.json: n_routed_experts: null builds no expert list");
}

// A config without head_dim: Qwen3Config defaults it to 128, Qwen3MoeConfig (transformers 4.51.3)
// to nothing, so Qwen3-MoE's attention takes hidden / heads. The counts are transformers 4.51.3's
// (tools/count-hf-params on these two configs, 2026-11-28).
TEST_F(ScenarioFile, Qwen3HeadsAre128WideUnlessTheConfigSaysQwen3MoeHeadsHiddenOverHeads) {
  const std::string base = R"("hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000)";
  const auto count = [&](const std::string& extra) { return hf_count(base + ", " + extra); };
  EXPECT_EQ(count(R"("model_type": "qwen3")"), 2086656u);
  EXPECT_EQ(count(R"("model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 64)"),
            1302016u);
}

TEST_F(ScenarioFile, AnArchitectureNotUnderstoodIsRefusedNotReadAsALlama) {
  write("hf.json", R"({"model_type": "t5", "num_hidden_layers": 2, "hidden_size": 64,
                       "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 10})");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf.json\"\n"),
             "hf.json: model_type: 't5' is an architecture hpzlab does not model (allowed: llama");
  write("hf.json", R"({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                       "num_attention_heads": 4, "vocab_size": 10})");
  EXPECT_HAS(load_error("[model]\nhf_config = \"hf.json\"\n"), "hf.json: model_type: missing");
}

}  // namespace
}  // namespace hpz
