// The recordings of real DeepSpeed the tests replay and run (traces/deepspeed/), and the run they
// were made of.
#pragma once

#include <string>

#include "sim/ir/schedule_json.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz::test {

/** The run the tiny recordings were made of (traces/deepspeed/README.md): the tiny Llama of
 *  tools/recorder/tests/data/llama-tiny.json on 2 x 8 ranks, ds-hpz8.json, from its config, 3
 *  steps. */
inline Scenario recorded_tiny(const std::string& version) {
  const std::string data = source_dir() + "/tools/recorder/tests/data/";
  return load_scenario(
      "", {{"zero.deepspeed_version", version}, {"training.seq_len", "32"}, {"run.steps", "3"}},
      {{"--hf-config", "model.hf_config", data + "llama-tiny.json"},
       {"--from-config", "run.load", "none"},
       {"--ds-config", "zero.ds_config", data + "ds-hpz8.json"},
       {"--nodes", "cluster.nodes", "2"},
       {"--gpus-per-node", "cluster.gpus_per_node", "8"}});
}

/** traces/deepspeed/NAME.json.gz. */
inline Schedule recording(const std::string& name) {
  return read_schedule_file(source_dir() + "/traces/deepspeed/" + name + ".json.gz");
}

}  // namespace hpz::test
