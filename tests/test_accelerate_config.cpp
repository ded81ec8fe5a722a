// accelerate's config YAML (sim/accelerate_config.hpp): the YAML types, the ds_config accelerate
// builds from a file or from its inline keys, the cluster, the refusals, and `--ds-config
// FILE.yaml` through load_scenario.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "sim/accelerate_config.hpp"
#include "sim/error.hpp"
#include "sim/scenario.hpp"
#include "tests/input_error.hpp"
#include "tests/paths.hpp"
#include "tests/temp_dir.hpp"

namespace hpz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kSourceDir = test::source_dir();
const fs::path kData = kSourceDir / "tests" / "data" / "accelerate";
const std::string kTinyModel = (kSourceDir / "tools/recorder/tests/data/llama-tiny.json").string();

using test::error_of;

/** Whether one of `notes` contains `part`. */
bool noted(const std::vector<std::string>& notes, const std::string& part) {
  for (const std::string& n : notes) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

std::string all(const std::vector<std::string>& notes) {
  std::string text;
  for (const std::string& n : notes) text += n + "\n";
  return text;
}

/** The one-command form's flags: `yaml` as --ds-config, a tiny Llama as --hf-config. */
std::vector<FlagSetting> one_command(const fs::path& yaml) {
  return {{"--ds-config", "zero.ds_config", yaml.string()},
          {"--hf-config", "model.hf_config", kTinyModel}};
}

/** Runs in the repository root, as ctest does (accelerate opens deepspeed_config_file from the
 *  directory it launches in), and goes back after. */
class InSourceDir {
 public:
  InSourceDir() : before_(fs::current_path()) { fs::current_path(kSourceDir); }
  ~InSourceDir() { fs::current_path(before_); }
  InSourceDir(const InSourceDir&) = delete;
  InSourceDir& operator=(const InSourceDir&) = delete;

 private:
  fs::path before_;
};

/** Each test writes its files into a directory of its own. */
class AccelerateFile : public test::TempDirTest {
 protected:
  /** A DeepSpeed accelerate config on one machine of 8 with `deepspeed_config` (indented
   *  lines) and `extra` top-level lines. */
  std::string config(const std::string& deepspeed_config, const std::string& extra = "") {
    return write(
        "acc.yaml",
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
        "num_machines: 1\nnum_processes: 8\n" +
            (deepspeed_config.empty() ? std::string() : "deepspeed_config:\n" + deepspeed_config) +
            extra);
  }

  std::string read_error(const std::string& path) {
    return error_of([&] { read_accelerate_config(path); });
  }
};

// --- YAML as PyYAML's safe_load types it ------------------------------------------------------

TEST(Yaml, TypesPlainScalarsAsYaml11) {
  const json v = parse_yaml_input(
      "a: yes\nb: Off\nc: ~\nd:\ne: 0x1F\nf: 0755\ng: 1_000\nh: 1:30\ni: 1e5\nj: 1.0e+5\n"
      "k: '3'\nl: \"true\"\nm: -0\nn: .5\no: +.5\np: 0b101\nq: 2024-01-31\nr: 08\ns: none\n"
      "t: 1:30.5\nu: 1.\nv: -1_0.2_5\nw: 1.5e5\n",
      "t.yaml");
  EXPECT_EQ(v["a"], true);
  EXPECT_EQ(v["b"], false);
  EXPECT_TRUE(v["c"].is_null());
  EXPECT_TRUE(v["d"].is_null());
  EXPECT_EQ(v["e"], 31);
  EXPECT_EQ(v["f"], 493);  // octal, as YAML 1.1
  EXPECT_EQ(v["g"], 1000);
  EXPECT_EQ(v["h"], 90);     // sexagesimal
  EXPECT_EQ(v["i"], "1e5");  // PyYAML's floats need a '.'
  EXPECT_EQ(v["j"], 100000.0);
  EXPECT_EQ(v["k"], "3");  // quoted: a string
  EXPECT_EQ(v["l"], "true");
  EXPECT_EQ(v["m"], 0);
  EXPECT_EQ(v["n"], 0.5);
  EXPECT_EQ(v["o"], "+.5");  // PyYAML's pattern has no sign before a leading '.'
  EXPECT_EQ(v["p"], 5);
  EXPECT_EQ(v["q"], "2024-01-31");
  EXPECT_EQ(v["r"], "08");  // not octal, not decimal
  EXPECT_EQ(v["s"], "none");
  EXPECT_EQ(v["t"], 90.5);
  EXPECT_EQ(v["u"], 1.0);
  EXPECT_EQ(v["v"], -10.25);
  EXPECT_EQ(v["w"], "1.5e5");  // the exponent needs its sign
  EXPECT_TRUE(v["d"].is_null());
}

TEST(Yaml, NestedAndTagged) {
  const json v =
      parse_yaml_input("x:\n  - 1\n  - {a: [b, 2.5]}\ny: !!str 12\nz: !!float 3\n", "t.yaml");
  EXPECT_EQ(v["x"][0], 1);
  EXPECT_EQ(v["x"][1]["a"][0], "b");
  EXPECT_EQ(v["x"][1]["a"][1], 2.5);
  EXPECT_EQ(v["y"], "12");
  EXPECT_EQ(v["z"], 3.0);
}

TEST(Yaml, SyntaxErrorNamesLineAndColumn) {
  const std::string error =
      error_of([] { parse_yaml_input("a: 1\nb:\n  c: 2\n   d: 3\n", "bad.yaml"); });
  EXPECT_HAS(error, "bad.yaml: YAML syntax error at line 4, column ");
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(Yaml, RefusesWhatSafeLoadWouldReadDifferently) {
  EXPECT_HAS(error_of([] { parse_yaml_input("a: &x 1\nb: *x\n", "t.yaml"); }),
             "t.yaml: line 1, column 4: an anchor (&x): anchors and aliases are not supported");
  EXPECT_HAS(error_of([] { parse_yaml_input("a: 1\na: 2\n", "t.yaml"); }),
             "t.yaml: line 2, column 1: 'a' is given twice in one mapping (allowed: once)");
  EXPECT_HAS(error_of([] { parse_yaml_input("a: 1\n---\nb: 2\n", "t.yaml"); }),
             "a second YAML document");
  EXPECT_HAS(error_of([] { parse_yaml_input("<<: {a: 1}\n", "t.yaml"); }), "merge key");
  EXPECT_HAS(error_of([] { parse_yaml_input("? [a]\n: 1\n", "t.yaml"); }),
             "a mapping or list as a key");
  EXPECT_HAS(error_of([] { parse_yaml_input("a: 99999999999999999999\n", "t.yaml"); }),
             "is not an integer from");
  EXPECT_HAS(error_of([] { parse_yaml_input("a: .inf\n", "t.yaml"); }), "not a finite number");
  EXPECT_HAS(error_of([] { parse_yaml_input("a: !!python/object x\n", "t.yaml"); }),
             "the tag 'tag:yaml.org,2002:python/object' is not supported");
  EXPECT_HAS(error_of([] { parse_yaml_input("a: \"\x01\"\n", "t.yaml"); }),
             "YAML syntax error at line 1, column 5: control characters are not allowed");
  EXPECT_HAS(error_of([] { parse_yaml_input(std::string(70, '[') + "1", "t.yaml"); }),
             "nested more than 64 levels");
}

// --- what accelerate builds -------------------------------------------------------------------

TEST(AccelerateConfig, TrlZero3InlineKeys) {
  const AccelerateConfig c = read_accelerate_config((kData / "trl-deepspeed_zero3.yaml").string());
  // DeepSpeedPlugin.__post_init__'s dict from the inline keys, then set_mixed_precision("bf16").
  const json expected = json::parse(R"({
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "none", "nvme_path": null},
      "offload_param": {"device": "none", "nvme_path": null},
      "stage3_gather_16bit_weights_on_model_save": true
    },
    "bf16": {"enabled": true},
    "fp16": {"enabled": false}
  })");
  EXPECT_EQ(c.ds_config, expected) << c.ds_config.dump(2);
  EXPECT_EQ(c.ds_config_file, "");
  EXPECT_EQ(c.num_machines, 1);
  EXPECT_EQ(c.num_processes, 8);
  EXPECT_EQ(c.mixed_precision, "bf16");
  EXPECT_TRUE(c.zero3_init);
  EXPECT_TRUE(noted(c.notes, "cluster.nodes 1 and cluster.gpus_per_node 8")) << all(c.notes);
  EXPECT_TRUE(noted(c.notes, "ignored (hpzlab does not model them): debug, downcast_bf16"))
      << all(c.notes);
  for (const std::string& n : c.notes) EXPECT_EQ(n.find('\n'), std::string::npos) << n;
}

TEST(AccelerateConfig, ConfigFileFromTheLaunchDirectory) {
  const InSourceDir here;
  const AccelerateConfig c = read_accelerate_config("tests/data/accelerate/ds-file.yaml");
  EXPECT_EQ(c.ds_config_file, "tests/data/accelerate/ds-hpz8-auto.json");
  EXPECT_EQ(c.ds_config["zero_optimization"]["zero_hpz_partition_size"], 8);
  // accelerate launches with mixed_precision 'no': it adds fp16 off, keeps the file's bf16 on.
  EXPECT_EQ(c.ds_config["bf16"]["enabled"], true);
  EXPECT_EQ(c.ds_config["fp16"]["enabled"], false);
  EXPECT_EQ(c.ds_config["train_micro_batch_size_per_gpu"], "auto");  // Accelerator.prepare's
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.num_processes, 16);
  EXPECT_TRUE(c.zero3_init);
  EXPECT_TRUE(noted(c.notes,
                    "the ds_config is deepspeed_config_file "
                    "tests/data/accelerate/ds-hpz8-auto.json"))
      << all(c.notes);
  EXPECT_TRUE(noted(c.notes, "hpzlab fills these as with --hf-trainer")) << all(c.notes);
}

TEST_F(AccelerateFile, ConfigFileAutoFilledAsAccelerateFillsIt) {
  const std::string ds = write("ds.json", R"({"bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": "auto", "offload_param": {"device": "auto"}}})");
  const AccelerateConfig c =
      read_accelerate_config(config("  deepspeed_config_file: " + ds + "\n"));
  EXPECT_EQ(c.ds_config["gradient_accumulation_steps"], 1);  // absent: 1
  EXPECT_EQ(c.ds_config["zero_optimization"]["stage"], 2);   // the plugin's default
  EXPECT_EQ(c.ds_config["zero_optimization"]["offload_param"]["device"], "none");
  EXPECT_EQ(c.ds_config["bf16"]["enabled"], false);  // mixed_precision 'no'
  EXPECT_FALSE(c.zero3_init);
  EXPECT_TRUE(noted(c.notes, "zero_optimization.stage 2 for \"auto\"")) << all(c.notes);
}

TEST_F(AccelerateFile, ConfigFileRefusesInlineKeysBesideIt) {
  const std::string ds = write("ds.json", R"({"zero_optimization": {"stage": 3}})");
  EXPECT_HAS(read_error(config("  deepspeed_config_file: " + ds + "\n  zero_stage: 3\n")),
             "acc.yaml: deepspeed_config.zero_stage: given with deepspeed_config_file: "
             "accelerate refuses it");
  EXPECT_HAS(read_error(config("  deepspeed_config_file: " + ds + "\n", "mixed_precision: bf16\n")),
             "acc.yaml: mixed_precision: given with deepspeed_config.deepspeed_config_file");
  const std::string no_zero = write("no-zero.json", R"({"bf16": {"enabled": true}})");
  EXPECT_HAS(read_error(config("  deepspeed_config_file: " + no_zero + "\n")),
             "no-zero.json: zero_optimization: missing: accelerate refuses it");
  EXPECT_HAS(read_error(config("  deepspeed_config_file: missing/ds.json\n")),
             "acc.yaml: deepspeed_config.deepspeed_config_file: cannot read 'missing/ds.json': no "
             "such file in the current directory");
}

TEST(AccelerateConfig, InlineKeysWithOffload) {
  const AccelerateConfig c = read_accelerate_config((kData / "offload.yaml").string());
  const json& zero = c.ds_config["zero_optimization"];
  EXPECT_EQ(zero["stage"], 3);
  EXPECT_EQ(zero["offload_param"]["device"], "cpu");
  EXPECT_EQ(zero["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(c.ds_config["gradient_accumulation_steps"], 4);
  EXPECT_EQ(c.ds_config["gradient_clipping"], 1.0);
  EXPECT_EQ(c.ds_config["fp16"], json::parse(R"({"enabled": true, "auto_cast": true})"));
  EXPECT_EQ(c.ds_config["bf16"]["enabled"], false);
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.num_processes, 16);
}

TEST_F(AccelerateFile, InlineDefaultsAreAcceleratesWithANote) {
  const AccelerateConfig c = read_accelerate_config(config(""));
  EXPECT_EQ(c.ds_config["zero_optimization"]["stage"], 2);  // ACCELERATE_DEEPSPEED_ZERO_STAGE
  EXPECT_EQ(c.ds_config["gradient_accumulation_steps"], "auto");
  EXPECT_EQ(c.ds_config["gradient_clipping"], "auto");
  EXPECT_EQ(c.mixed_precision, "no");
  EXPECT_FALSE(c.zero3_init);
  EXPECT_TRUE(noted(c.notes,
                    "accelerate's defaults for what deepspeed_config leaves out: "
                    "zero_stage 2"))
      << all(c.notes);
  EXPECT_TRUE(noted(c.notes, "no mixed_precision: accelerate launches with 'no'")) << all(c.notes);
}

TEST_F(AccelerateFile, InlineValuesAsAccelerateConvertsThem) {
  // str(value) through the launch's environment and back: a quoted stage, an upper-case
  // device, a truth word; clipping 0 leaves the key out.
  const AccelerateConfig c = read_accelerate_config(
      config("  zero_stage: '3'\n  offload_param_device: CPU\n  zero3_init_flag: 'off'\n"
             "  gradient_clipping: 0\n  gradient_accumulation_steps: '2'\n"));
  EXPECT_EQ(c.ds_config["zero_optimization"]["stage"], 3);
  EXPECT_EQ(c.ds_config["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(c.ds_config["gradient_accumulation_steps"], 2);
  EXPECT_FALSE(c.ds_config.contains("gradient_clipping"));
  EXPECT_FALSE(c.zero3_init);
  EXPECT_TRUE(noted(c.notes, "zero3_init_flag is off")) << all(c.notes);
}

TEST_F(AccelerateFile, WithoutNumProcessesTheClusterIsLeftAsItIs) {
  // num_processes -1 is ClusterConfig's "give --num_processes", as absent.
  for (const char* processes : {"", "num_processes: -1\n"}) {
    const AccelerateConfig c = read_accelerate_config(write(
        "acc.yaml", std::string("distributed_type: DEEPSPEED\nnum_machines: 2\n") + processes));
    EXPECT_FALSE(c.num_processes);
    EXPECT_TRUE(noted(c.notes, "num_processes is not given")) << all(c.notes);
    const Scenario sc = load_scenario("", {}, one_command(dir_ / "acc.yaml"));
    EXPECT_EQ(sc.cluster.nodes, Scenario{}.cluster.nodes);
    EXPECT_EQ(sc.cluster.gpus_per_node, Scenario{}.cluster.gpus_per_node);
  }
}

TEST_F(AccelerateFile, UnknownDeepSpeedKeyIsNotedAsAccelerateIgnoresIt) {
  const AccelerateConfig c = read_accelerate_config(config("  zero_stag: 3\n"));
  EXPECT_EQ(c.ds_config["zero_optimization"]["stage"], 2);
  EXPECT_TRUE(noted(c.notes,
                    "deepspeed_config.zero_stag is not a key accelerate reads (it "
                    "ignores it); did you mean 'zero_stage'?"))
      << all(c.notes);
}

// --- refusals ---------------------------------------------------------------------------------

TEST(AccelerateConfig, BadSyntax) {
  const std::string error =
      error_of([] { read_accelerate_config((kData / "bad-syntax.yaml").string()); });
  EXPECT_HAS(
      error,
      "bad-syntax.yaml: YAML syntax error at line 4, column 24: mapping values are not allowed");
}

TEST(AccelerateConfig, NotDeepSpeed) {
  EXPECT_HAS(error_of([] { read_accelerate_config((kData / "multi-gpu.yaml").string()); }),
             "multi-gpu.yaml: distributed_type: 'MULTI_GPU' is not DeepSpeed (allowed: DEEPSPEED)");
}

TEST(AccelerateConfig, ProcessesNotAMultipleOfMachines) {
  EXPECT_HAS(error_of([] { read_accelerate_config((kData / "uneven.yaml").string()); }),
             "uneven.yaml: num_processes: 12 is not a multiple of num_machines 5 (accelerate "
             "launches num_processes // num_machines = 2 a machine, 10 in all; allowed: a "
             "multiple of num_machines)");
}

TEST_F(AccelerateFile, RefusesWhatAccelerateRefusesOrHpzlabDoesNotModel) {
  EXPECT_HAS(read_error(config("", "num_proceses: 8\n")),
             "acc.yaml: num_proceses: unknown key: accelerate refuses it (from_yaml_file: 'had "
             "unknown keys'); did you mean 'num_processes'?");
  EXPECT_HAS(read_error(config("", "mixed_precision: no\n")),
             "acc.yaml: mixed_precision: false is not a precision accelerate knows (YAML reads an "
             "unquoted no as false: write 'no') (allowed: no, fp16, bf16, fp8)");
  EXPECT_HAS(read_error(config("", "mixed_precision: fp8\n")),
             "acc.yaml: mixed_precision: 'fp8': accelerate runs DeepSpeed in bf16");
  EXPECT_HAS(read_error(config("  zero_stage: 4\n")),
             "acc.yaml: deepspeed_config.zero_stage: 4 is not a ZeRO stage (allowed: 0, 1, 2, 3)");
  EXPECT_HAS(read_error(config("  offload_param_device: true\n")),
             "deepspeed_config.offload_param_device: true is not an offload device DeepSpeed knows "
             "(allowed: none, cpu, nvme)");
  EXPECT_HAS(read_error(config("  zero3_init_flag: maybe\n")),
             "deepspeed_config.zero3_init_flag: 'maybe' is not a truth value accelerate reads");
  EXPECT_HAS(read_error(config("  deepspeed_moe_layer_cls_names: MixtralSparseMoeBlock\n")),
             "ZeRO-3 leaf modules");
  EXPECT_HAS(read_error(config("", "parallelism_config:\n  parallelism_config_sp_size: 2\n")),
             "acc.yaml: parallelism_config.parallelism_config_sp_size: 2: tensor, context and "
             "sequence parallelism are not modelled");
  EXPECT_HAS(read_error(write("sm.yaml",
                              "compute_environment: AMAZON_SAGEMAKER\n"
                              "distributed_type: DEEPSPEED\n")),
             "sm.yaml: compute_environment: 'AMAZON_SAGEMAKER' is not a local cluster");
  EXPECT_HAS(read_error(write("none.yaml", "num_processes: 8\n")),
             "none.yaml: distributed_type: missing");
  EXPECT_HAS(read_error(write("empty.yaml", "")),
             "empty.yaml: expected a mapping of accelerate's "
             "keys (yaml.safe_load of it gives a dict to "
             "accelerate), got an empty document");
  EXPECT_HAS(read_error(write("list.yaml", "- a\n")), "got [\"a\"]");
  EXPECT_HAS(error_of([&] { read_accelerate_config((dir_ / "absent.yaml").string()); }),
             "cannot read");
}

// --- through load_scenario (--ds-config FILE.yaml) --------------------------------------------

TEST(AccelerateScenario, DsConfigFlagTakesTheYaml) {
  const std::string yaml = (kData / "offload.yaml").string();
  const Scenario sc = load_scenario("", {}, one_command(yaml));
  EXPECT_EQ(sc.zero.ds_config, yaml);  // the user's file, not the JSON accelerate made
  EXPECT_EQ(sc.zero.stage, 3);
  EXPECT_TRUE(sc.zero.offload_param);
  EXPECT_EQ(sc.training.dtype, "fp16");
  EXPECT_EQ(sc.training.grad_accum, 4);
  EXPECT_EQ(sc.training.gradient_clipping, 1.0);
  EXPECT_EQ(sc.cluster.nodes, 2);
  EXPECT_EQ(sc.cluster.gpus_per_node, 8);
  EXPECT_TRUE(noted(sc.notes, "accelerate config " + yaml + ": num_processes 16")) << all(sc.notes);
}

TEST(AccelerateScenario, FlagsOverrideTheYamlsClusterWithANote) {
  std::vector<FlagSetting> flags = one_command((kData / "offload.yaml").string());
  flags.push_back({"--nodes", "cluster.nodes", "1"});
  flags.push_back({"--gpus-per-node", "cluster.gpus_per_node", "4"});
  const Scenario sc = load_scenario("", {}, flags);
  EXPECT_EQ(sc.cluster.nodes, 1);
  EXPECT_EQ(sc.cluster.gpus_per_node, 4);
  EXPECT_TRUE(noted(sc.notes, "cluster.nodes from --nodes overrides the value")) << all(sc.notes);
}

TEST_F(AccelerateFile, ScenarioClusterGivesWayToTheUsersYaml) {
  const std::string yaml = (kData / "offload.yaml").string();
  const std::string toml = write("s.toml",
                                 "[model]\npreset = \"tiny\"\n[cluster]\nnodes = 4\n"
                                 "gpus_per_node = 2\n");
  const Scenario sc = load_scenario(toml, {}, {{"--ds-config", "zero.ds_config", yaml}});
  EXPECT_EQ(sc.cluster.nodes, 2);
  EXPECT_EQ(sc.cluster.gpus_per_node, 8);
  EXPECT_TRUE(noted(sc.notes, "cluster.nodes = 4 in " + toml + " gives way to " + yaml))
      << all(sc.notes);
}

TEST(AccelerateScenario, AutoFilledAsAccelerateFillsItWithoutHfTrainer) {
  const InSourceDir here;
  const Scenario sc = load_scenario("", {}, one_command("tests/data/accelerate/ds-file.yaml"));
  // Accelerator.prepare: reduce_bucket_size = hidden^2 (llama-tiny: hidden 64).
  EXPECT_EQ(sc.zero.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(sc.zero.zero_hpz_partition_size, 8);
  EXPECT_EQ(sc.training.dtype, "bf16");
  EXPECT_EQ(sc.cluster.world_size(), 16);
}

TEST(AccelerateScenario, ErrorsNameTheYaml) {
  EXPECT_HAS(error_of([] { load_scenario("", {}, one_command((kData / "uneven.yaml").string())); }),
             "uneven.yaml: num_processes: 12 is not a multiple of num_machines 5");
  EXPECT_HAS(error_of([] { load_scenario("", {}, one_command("no/such.yaml")); }),
             "--ds-config: zero.ds_config: cannot read 'no/such.yaml'");
}

}  // namespace
}  // namespace hpz
