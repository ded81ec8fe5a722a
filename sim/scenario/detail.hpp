// What the parts of the scenario loader share (private to sim/scenario/; sim/scenario.hpp is the
// public face). Loading a scenario: TOML file -> settings (last assignment of each key wins, --set
// after the file) -> Scenario (model source and ds_config first, then explicit keys) ->
// validate(). The parts, by responsibility:
//   names.cpp      "did you mean", parse_step_list, parse_override, to_string
//   values.cpp     a value as written (TOML, JSON, --set) converted to a key's type; JSON files
//   keys.cpp       the key table, the single source of the names a scenario accepts
//   hf_config.cpp  model.hf_config: a Hugging Face config.json as transformers builds it
//   ds_config.cpp  zero.ds_config: DeepSpeed's keys, "auto" values, the batch-size rule
//   load.cpp       the TOML file and --set, settings to a Scenario, load_scenario
//   validate.cpp   every cross-key and range check, validate()
//   presets.cpp    the model and GPU presets
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sim/scenario.hpp"

namespace hpz::scenario_detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

/** Where a --set value comes from, in errors and notes. */
constexpr const char* kSetWhere = "--set";

// ---------------------------------------------------------------------------------------------
// Names, allowed lists and "did you mean" (names.cpp).

/** " (allowed: a, b, c)" for an error message. */
std::string allowed(const std::vector<std::string>& names);

/** The known name closest to `name`, if it is close enough to be a plausible typo. */
std::optional<std::string> closest(const std::string& name, const std::vector<std::string>& known);

/** "; did you mean 'x'?", or "" without a suggestion. */
std::string did_you_mean(const std::optional<std::string>& suggestion);

// ---------------------------------------------------------------------------------------------
// Values and where they came from (values.cpp).

/** A value as written: TOML, JSON and --set values all become one of these. */
using Raw = std::variant<bool, std::int64_t, double, std::string>;

/** One assignment of a key. */
struct Setting {
  Raw raw;
  std::string where;  ///< the file it was read from, "--set", or the flag that set it
  fs::path base_dir;  ///< relative paths in the value are resolved against it
};

/** Whether a setting came from the command line (--set or a flag of its own, all "--..."),
 *  which wins over the scenario file. */
bool from_command_line(const Setting& s);

/** A value for a message: true, 42, 1.5 or 'text'. */
std::string describe(const Raw& raw);

/** The setting as the key's type; each throws InputError naming the key and what it expected. */
bool bool_of(const Setting& s, const std::string& key);
std::int64_t int64_of(const Setting& s, const std::string& key);
int int_of(const Setting& s, const std::string& key);
double double_of(const Setting& s, const std::string& key);
std::string string_of(const Setting& s, const std::string& key);
std::string choice_of(const Setting& s, const std::string& key,
                      const std::vector<std::string>& choices);

/** Each key's settings, by dotted name. */
using Settings = std::map<std::string, Setting>;

/** Which file (or --set) last gave each key its value, for validation messages. */
using Origins = std::map<std::string, std::string>;

/** The file path setting `s` of `key` names, resolved against the file that names it. */
fs::path resolve(const Setting& s, const std::string& key);

/** Reads the JSON file named by setting `s` of `key`; errors name the file. */
json read_json(const Setting& s, const std::string& key, const fs::path& path);

/** A JSON value as a setting of `file`, so that JSON keys convert like TOML and --set ones;
 *  throws InputError naming `expected` for an object, array or null. */
Setting json_setting(const json& value, const std::string& file, const std::string& key,
                     const char* expected);

// ---------------------------------------------------------------------------------------------
// The keys (keys.cpp).

/** training.dtype's values. */
extern const std::vector<std::string> kDtypeNames;

/** How a --set value is read, and what a wrong-typed value is reported as. */
enum class Kind { kBool, kInteger, kNumber, kText };

using Apply = void (*)(Scenario&, const Setting&, const std::string& key);

/** One key of the format; `apply` is null for the keys that select a source (preset, files). */
struct KeySpec {
  std::string section;
  std::string name;
  Kind kind;
  Apply apply;

  std::string dotted() const { return section + "." + name; }
};

/** Every key of the format, in the order they are applied and documented. */
const std::vector<KeySpec>& key_specs();

/** The key named `dotted` ("zero.stage"), or null. */
const KeySpec* find_spec(const std::string& dotted);

/** Throws InputError for an unknown `section.name`, with a likely intended key. */
[[noreturn]] void unknown_key(const std::string& where, const std::string& section,
                              const std::string& name);

/** What a value of `kind` is called in messages ("an integer"). */
const char* expected_of(Kind kind);

// ---------------------------------------------------------------------------------------------
// The files a scenario names (hf_config.cpp, ds_config.cpp).

/** A model from the Hugging Face config.json setting `s` names. */
ModelConfig read_hf_config(const Setting& s);

/** A ds_config's batch keys, reconciled once the world size is known (reconcile_batch). */
struct DsBatch {
  std::string file;
  std::optional<std::int64_t> train_batch;  ///< train_batch_size
  std::optional<std::int64_t> micro;        ///< train_micro_batch_size_per_gpu
  std::optional<std::int64_t> accum;        ///< gradient_accumulation_steps
  std::vector<std::string> auto_keys;       ///< those of the three given as "auto"
};

/** Applies the ds_config (or accelerate config) setting `s` names to `scenario` under the rules
 *  of DeepSpeed `version`, its batch keys into `batch`; "auto" values filled as the HF Trainer
 *  fills them when `hf_trainer`. */
void apply_ds_config(Scenario& scenario, const Setting& s, Origins& origins, DsBatch& batch,
                     const std::string& version, bool hf_trainer);

/** Sets training.micro_batch and grad_accum from the ds_config's batch keys, as DeepSpeed derives
 *  them, unless the scenario or --set gave them. */
void reconcile_batch(Scenario& sc, const DsBatch& b, const Origins& origins);

// ---------------------------------------------------------------------------------------------
// Validation (validate.cpp).

/** The file (or flag) to name in an error about `key`. */
using WhereOf = std::function<std::string(const std::string& key)>;

/** Every cross-key and range check; throws InputError naming where_of(key). */
void check_scenario(const Scenario& s, const WhereOf& where_of);

}  // namespace hpz::scenario_detail
