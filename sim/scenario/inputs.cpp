// What each engine reads of a scenario (scenario.hpp): the one place a Scenario becomes an
// engine's inputs, so that the engines below depend on plain data, not on the scenario layer.
#include "sim/model_shape.hpp"
#include "sim/scenario.hpp"

namespace hpz {

TimingInputs timing_inputs_of(const Scenario& scenario) {
  TimingInputs in;
  in.cluster = scenario.cluster;
  in.sim = scenario.sim;
  in.steps = scenario.run.steps;
  in.seed = scenario.run.seed;
  in.spin_before_copy_us = scenario.run.spin_before_copy_us;
  in.seq_len = scenario.training.seq_len;
  in.micro_batch = scenario.training.micro_batch;
  in.grad_accum = scenario.training.grad_accum;
  return in;
}

ReplayInputs replay_inputs_of(const Scenario& scenario) {
  const ModelConfig& m = scenario.model;
  ReplayInputs in;
  in.path = scenario.path;
  in.family = m.family;
  in.llama_shaped = llama_shaped(m);
  in.layers = m.layers;
  in.hidden = m.hidden;
  in.ffn = m.ffn;
  in.heads = m.heads;
  in.kv_heads = m.kv_heads;
  in.vocab = m.vocab;
  in.world_size = scenario.cluster.world_size();
  in.seq_len = scenario.training.seq_len;
  in.micro_batch = scenario.training.micro_batch;
  in.grad_accum = scenario.training.grad_accum;
  in.steps = scenario.run.steps;
  in.seed = scenario.run.seed;
  return in;
}

}  // namespace hpz
