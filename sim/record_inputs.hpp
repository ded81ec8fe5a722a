// What `hpzlab record` (tools/record: real DeepSpeed on the CPU) is given to record a scenario:
// the model's Hugging Face config and a ds_config that say what the scenario says. Used by
// `hpzlab check --deepspeed V1,V2 --record`, the version matrix over recordings (issue 19).
//
// Each file starts from the user's own (model.hf_config, zero.ds_config), so that what hpzlab
// does not model (rope scaling, tied embeddings, optimizer settings, ...) reaches DeepSpeed as the
// user wrote it, and then takes every key hpzlab resolved (the scenario's keys, --set, the HF
// Trainer's "auto" fill): DeepSpeed records the scenario hpzlab would have built.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/scenario.hpp"

namespace hpz {

/** The model's config.json: the user's (when the model came from one) with hpzlab's
 *  dimensions; else a Llama (LlamaForCausalLM) of the scenario's dimensions. A model that is not
 *  a Llama and came from no config file (the falcon-40b preset) is refused (InputError). */
nlohmann::json recorder_hf_config(const Scenario& scenario);

/** The ds_config: the user's (if any) with zero_optimization's modelled keys, the batch keys and
 *  bf16/fp16 set from the scenario; the other "auto" values, which only the HF Trainer fills and
 *  which do not change the schedule (optimizer and scheduler parameters), are dropped. */
nlohmann::json recorder_ds_config(const Scenario& scenario);

/** The arguments for tools/record besides --hf-config, --ds-config and --out: the cluster, the
 *  DeepSpeed and transformers versions (the one the DeepSpeed builder walks), steps,
 *  micro-batch, sequence length and gradient checkpointing of the scenario. */
std::vector<std::string> recorder_args(const Scenario& scenario);

}  // namespace hpz
