// Loading a scenario: the TOML file and --set (and the flags of the one-command form) into
// settings, the last assignment of each key winning; settings to a Scenario (model source and
// ds_config first, then the explicit keys, the files the user named winning over the scenario's
// keys); then validation.
#include <fmt/format.h>
#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/model_shape.hpp"
#include "sim/scenario.hpp"
#include "sim/scenario/detail.hpp"
#include "sim/text.hpp"

namespace hpz {
namespace scenario_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// From settings to a Scenario.

const Setting* find_setting(const Settings& settings, const std::string& key) {
  const auto it = settings.find(key);
  return it == settings.end() ? nullptr : &it->second;
}

/** The model before its explicit keys: a preset, a Hugging Face config, or nothing (custom). */
void apply_model_source(Scenario& scenario, Settings& settings, Origins& origins) {
  const Setting* preset = find_setting(settings, "model.preset");
  const Setting* hf = find_setting(settings, "model.hf_config");
  if (preset && hf) {
    // A --set of one source replaces the other source given in the file.
    if (from_command_line(*preset) && !from_command_line(*hf)) {
      settings.erase("model.hf_config");
      hf = nullptr;
    } else if (from_command_line(*hf) && !from_command_line(*preset)) {
      settings.erase("model.preset");
      preset = nullptr;
    } else {
      throw InputError(hf->where, "model.hf_config",
                       "give either model.preset or model.hf_config, not both");
    }
  }
  if (preset) {
    scenario.model = model_preset(choice_of(*preset, "model.preset", model_preset_names()));
  } else if (hf) {
    scenario.model = read_hf_config(*hf);
    const ModelConfig& m = scenario.model;
    std::string details = m.tied_embeddings ? ", output layer tied to the embedding" : "";
    if (m.experts > 0) {
      details += fmt::format(
          ", {} experts of width {} ({} a token){}", m.experts, m.expert_ffn, m.experts_per_token,
          m.dense_layers > 0 ? fmt::format(" after {} dense layer(s)", m.dense_layers) : "");
    }
    scenario.notes.push_back(fmt::format(
        "model.hf_config {}: model_type {}, {} layers, hidden {}, {} parameters{}", m.hf_config,
        m.family, m.layers, m.hidden, static_cast<std::uint64_t>(parameter_count(m)), details));
  } else {
    std::vector<std::string> missing;
    for (const char* name : {"layers", "hidden", "ffn", "heads", "vocab"}) {
      if (!find_setting(settings, std::string("model.") + name)) missing.push_back(name);
    }
    if (!missing.empty()) {
      throw InputError(scenario.path, "model." + missing.front(),
                       "missing: " + joined(missing) +
                           " (without model.preset or model.hf_config, all of layers, hidden, "
                           "ffn, heads and vocab are required; presets: " +
                           joined(model_preset_names()) + ")");
    }
    scenario.model.name = "custom";
    const Setting* heads = find_setting(settings, "model.heads");
    if (!find_setting(settings, "model.kv_heads")) {
      scenario.model.kv_heads = int_of(*heads, "model.heads");
      origins["model.kv_heads"] = heads->where;
    }
    return;
  }
  // A value read from an HF config is that file's: its range errors name it, not the scenario
  // that points to it (model.name is the config's path).
  const std::string source = preset ? preset->where : scenario.model.name;
  for (const char* name : {"layers", "hidden", "ffn", "heads", "kv_heads", "vocab"}) {
    origins[std::string("model.") + name] = source;
  }
}

/** The DeepSpeed release whose config rules apply to the ds_config. */
std::string ds_rules_version(const Settings& settings) {
  // The version whose config rules apply: the scenario's or --set's, else the default. An
  // unknown one is reported when its key is applied below; here the default's rules apply.
  std::string version = ZeroConfig{}.deepspeed_version;
  if (const Setting* v = find_setting(settings, "zero.deepspeed_version")) {
    if (const auto* text = std::get_if<std::string>(&v->raw);
        text != nullptr && is_deepspeed_release(canonical_deepspeed_version(*text))) {
      version = canonical_deepspeed_version(*text);
    }
  }
  return version;
}

/** Whether the ds_config's "auto" values are filled as the HF Trainer fills them. */
bool hf_trainer_of(const Settings& settings) {
  // Whether "auto" is filled as the HF Trainer does: the scenario's or the flag's setting.
  bool hf_trainer = false;
  if (const Setting* t = find_setting(settings, "training.hf_trainer")) {
    hf_trainer = bool_of(*t, "training.hf_trainer");
  }
  return hf_trainer;
}

/** The files the user named on the command line, and the keys they set, which win over the
 *  scenario file's keys (build). */
struct UserFiles {
  Origins from_files;           ///< each key the ds_config or HF config set, and that file
  std::set<std::string> names;  ///< the files named on the command line
  bool ds_sets_batch = false;   ///< the user's ds_config sets batch keys (reconcile_batch)
};

UserFiles user_files_of(const Scenario& scenario, const Settings& settings, const Origins& origins,
                        const DsBatch& batch) {
  UserFiles user;
  user.from_files = origins;
  for (const char* key : {"zero.ds_config", "model.hf_config"}) {
    const Setting* file = find_setting(settings, key);
    if (file == nullptr || !from_command_line(*file)) continue;
    user.names.insert(key == std::string("zero.ds_config") ? scenario.zero.ds_config
                                                           : scenario.model.hf_config);
  }
  // The batch keys the ds_config sets are reconciled after build's loop (reconcile_batch).
  user.ds_sets_batch = user.names.count(scenario.zero.ds_config) != 0 &&
                       (batch.train_batch || batch.micro || batch.accum);
  return user;
}

/** Whether the scenario file's `setting` of `spec` gives way to a file the user named (with a
 *  note where the scenario's value differs); notes a ZeRO key the scenario fills in the user's
 *  ds_config. */
bool scenario_key_gives_way(Scenario& scenario, const KeySpec& spec, const Setting& setting,
                            const UserFiles& user, const DsBatch& batch) {
  if (from_command_line(setting)) return false;
  const auto file = user.from_files.find(spec.dotted());
  const bool batch_key =
      spec.dotted() == "training.micro_batch" || spec.dotted() == "training.grad_accum";
  // A ZeRO key the user's ds_config leaves out: the scenario's value fills it, which
  // DeepSpeed running that file would not (its default instead): said once per key.
  const bool zero_key = spec.section == "zero" && spec.dotted() != "zero.ds_config" &&
                        spec.dotted() != "zero.deepspeed_version";
  const bool file_wins = file != user.from_files.end() && user.names.count(file->second) != 0;
  const bool batch_wins = !file_wins && batch_key && user.ds_sets_batch;
  const bool fills =
      !file_wins && !batch_wins && zero_key && user.names.count(scenario.zero.ds_config) != 0;
  if (!file_wins && !batch_wins && !fills) return false;
  // What the scenario's key would make of the scenario: a note only where it differs.
  Scenario probe = scenario;
  spec.apply(probe, setting, spec.dotted());
  const auto gives_way = [&](const std::string& winner) {
    scenario.notes.push_back(fmt::format(
        "{} = {} in {} gives way to {} (your file wins over the scenario's keys; --set {}= "
        "to force it)",
        spec.dotted(), describe(setting.raw), setting.where, winner, spec.dotted()));
  };
  if (file_wins) {
    if (!(probe == scenario)) gives_way(file->second);
    return true;
  }
  if (batch_wins) {
    const std::optional<std::int64_t> given =
        spec.dotted() == "training.micro_batch" ? batch.micro : batch.accum;
    const int mine = spec.dotted() == "training.micro_batch" ? probe.training.micro_batch
                                                             : probe.training.grad_accum;
    if (!given || *given != mine) gives_way(scenario.zero.ds_config + "'s batch keys");
    return true;
  }
  if (!(probe == scenario)) {
    scenario.notes.push_back(fmt::format(
        "{} = {} from {}: your ds_config {} does not set it, so the scenario's value fills "
        "it (DeepSpeed itself would take its default)",
        spec.dotted(), describe(setting.raw), setting.where, scenario.zero.ds_config));
  }
  return false;
}

/** Applies `setting` of `spec`, with a note when it overrides a value a file gave. */
void apply_setting(Scenario& scenario, const KeySpec& spec, const Setting& setting,
                   const Origins& from_files, Origins& origins) {
  spec.apply(scenario, setting, spec.dotted());
  origins[spec.dotted()] = setting.where;
  if (const auto it = from_files.find(spec.dotted()); it != from_files.end()) {
    // A scenario file that names a preset and sets one of its sizes overrides the preset.
    const std::string over =
        it->second == setting.where
            ? fmt::format("model.preset's value ({} names the preset too)", setting.where)
            : fmt::format("the value {} gives", it->second);
    scenario.notes.push_back(
        fmt::format("{} from {} overrides {}", spec.dotted(), setting.where, over));
  }
}

/** hpZ below ZeRO stage 3: off, with a note. */
void hpz_only_at_stage3(Scenario& scenario) {
  ZeroConfig& z = scenario.zero;
  if (z.stage >= 0 && z.stage < 3 && z.zero_hpz_partition_size > 1) {
    // DeepSpeed builds hpZ's secondary partitions in zero.Init, which only stage 3 uses.
    scenario.notes.push_back(fmt::format(
        "zero.stage = {}: DeepSpeed uses hpZ (zero_hpz_partition_size = {}) only at ZeRO stage "
        "3; hpzlab models stage 3 only and uses stage 3 without hpZ in its place",
        z.stage, z.zero_hpz_partition_size));
    z.zero_hpz_partition_size = 1;
  }
}

Scenario build(const std::string& path, Settings& settings, Origins& origins) {
  Scenario scenario;
  scenario.path = path;
  scenario.cluster.gpu = gpu_preset("a100-80g");
  apply_model_source(scenario, settings, origins);
  DsBatch batch;
  if (const Setting* ds = find_setting(settings, "zero.ds_config")) {
    const std::string version = ds_rules_version(settings);
    const bool hf_trainer = hf_trainer_of(settings);
    apply_ds_config(scenario, *ds, origins, batch, version, hf_trainer);
  }
  // The user's ds_config and HF config set some keys above. A key given with --set (or a flag)
  // overrides them, and says so (issue 17: nothing overridden silently). A scenario file's key
  // overrides a file the scenario itself names; a file the user named on the command line
  // (--ds-config, --hf-config, --set zero.ds_config=...) wins over the scenario file's keys,
  // which fill only what it leaves (issue 35), with a note for each key that gave way.
  const UserFiles user = user_files_of(scenario, settings, origins, batch);
  for (const KeySpec& spec : key_specs()) {
    const Setting* setting = find_setting(settings, spec.dotted());
    if (!setting || !spec.apply) continue;
    if (scenario_key_gives_way(scenario, spec, *setting, user, batch)) continue;
    apply_setting(scenario, spec, *setting, user.from_files, origins);
  }
  if (!batch.file.empty()) reconcile_batch(scenario, batch, origins);
  hpz_only_at_stage3(scenario);
  return scenario;
}

/** A TOML value as a Raw; nullopt for tables, arrays and dates. */
std::optional<Raw> raw_of(const toml::node& node) {
  if (const auto* b = node.as_boolean()) return Raw{b->get()};
  if (const auto* i = node.as_integer()) return Raw{i->get()};
  if (const auto* d = node.as_floating_point()) return Raw{d->get()};
  if (const auto* text = node.as_string()) return Raw{text->get()};
  return std::nullopt;
}

const char* node_kind(const toml::node& node) {
  if (node.is_table()) return "a table";
  if (node.is_array()) return "an array";
  return "a date or time";
}

/** The key assigned on line `line` (1-based) of a TOML text and its kind, when that line is
 *  `name = ...` under a `[section]` of the format: a value toml++ cannot read (1e400, 2^63)
 *  fails before the key is known to it. */
const KeySpec* key_on_line(const std::string& text, std::size_t line) {
  std::istringstream in(text);
  std::string row, section;
  for (std::size_t n = 1; std::getline(in, row) && n <= line; ++n) {
    const std::size_t first = row.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    if (row[first] == '[') {
      const std::size_t close = row.find(']', first);
      if (close != std::string::npos) section = row.substr(first + 1, close - first - 1);
      continue;
    }
    if (n < line) continue;
    const std::size_t equals = row.find('=', first);
    if (equals == std::string::npos) return nullptr;
    const std::size_t last = row.find_last_not_of(" \t", equals - 1);
    return find_spec(section + "." + row.substr(first, last - first + 1));
  }
  return nullptr;
}

toml::table parse_toml(const std::string& path) {
  const std::string text = read_input_file(path, path, "", "cannot read the scenario file");
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const std::string where =
        fmt::format("line {}, column {}: malformed TOML: {}", e.source().begin.line,
                    e.source().begin.column, e.description());
    const KeySpec* spec = key_on_line(text, e.source().begin.line);
    if (spec == nullptr) throw InputError(path, "", where);
    // A number toml++ cannot hold: say what it can.
    const bool number = e.description().find("floating-point") != std::string_view::npos ||
                        e.description().find("integer") != std::string_view::npos;
    const char* allowed_text = !number                        ? ""
                               : spec->kind == Kind::kInteger ? " (allowed: an integer of at most "
                                                                "2^63 - 1)"
                               : spec->kind == Kind::kNumber
                                   ? " (allowed: a number a double can hold, about 1.8e308 at most)"
                                   : "";
    throw InputError(path, spec->dotted(), where + allowed_text);
  }
}

void collect_file(const std::string& path, Settings& settings) {
  const toml::table root = parse_toml(path);
  const fs::path base_dir = fs::path(path).parent_path();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table* table = section_node.as_table();
    if (!table) unknown_key(path, "", section);
    for (const auto& [name_key, node] : *table) {
      const std::string name(name_key.str());
      const KeySpec* spec = find_spec(section + "." + name);
      if (!spec) unknown_key(path, section, name);
      std::optional<Raw> raw = raw_of(node);
      if (!raw) {
        throw InputError(
            path, spec->dotted(),
            fmt::format("expected {}, got {}", expected_of(spec->kind), node_kind(node)));
      }
      settings[spec->dotted()] = Setting{*raw, path, base_dir};
    }
  }
}

/** A --set value read as the key's type; what cannot be read stays text and fails conversion. */
Raw raw_of_text(const std::string& text, Kind kind) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (kind == Kind::kBool && (text == "true" || text == "false")) return Raw{text == "true"};
  if (kind == Kind::kInteger) {
    std::int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc() && ptr == end) return Raw{value};
  }
  if (kind == Kind::kInteger || kind == Kind::kNumber) {
    double value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc() && ptr == end && !text.empty()) return Raw{value};
    if (ec == std::errc::result_out_of_range && ptr == end) {
      // Too small for a double (1e-400): 0, as the TOML parser reads it; too large stays text
      // and is refused, as the TOML parser refuses it.
      const double rounded = std::strtod(text.c_str(), nullptr);
      if (std::isfinite(rounded) && std::fabs(rounded) < 1) return Raw{rounded};
    }
  }
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    return Raw{text.substr(1, text.size() - 2)};
  }
  return Raw{text};
}

void collect_override(const Override& override, Settings& settings,
                      const std::string& where = kSetWhere) {
  const auto& [key, value] = override;
  const KeySpec* spec = find_spec(key);
  if (!spec) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) unknown_key(where, "", key);
    unknown_key(where, key.substr(0, dot), key.substr(dot + 1));
  }
  settings[key] = Setting{raw_of_text(value, spec->kind), where, {}};
}

}  // namespace
}  // namespace scenario_detail

using scenario_detail::build;
using scenario_detail::check_scenario;
using scenario_detail::collect_file;
using scenario_detail::collect_override;
using scenario_detail::describe;
using scenario_detail::find_setting;
using scenario_detail::Origins;
using scenario_detail::Setting;
using scenario_detail::Settings;

Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides) {
  return load_scenario(path, overrides, {});
}

Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides,
                       const std::vector<FlagSetting>& flags) {
  Settings settings;
  if (!path.empty()) collect_file(path, settings);
  for (const FlagSetting& f : flags) collect_override({f.key, f.value}, settings, f.flag);
  std::string name = path;
  if (path.empty()) {
    // The one-command form: the user's own files on the documented defaults.
    const Setting* hf = find_setting(settings, "model.hf_config");
    const Setting* ds = find_setting(settings, "zero.ds_config");
    if (hf == nullptr || ds == nullptr) {
      throw InputError("", hf == nullptr ? "--hf-config" : "--ds-config",
                       "is required without a scenario file (give a scenario, or both "
                       "--hf-config FILE and --ds-config FILE)");
    }
    const auto text = [](const Setting& s) {
      const auto* t = std::get_if<std::string>(&s.raw);
      return t != nullptr ? *t : describe(s.raw);
    };
    name = text(*ds) + " + " + text(*hf);
  }
  for (const Override& override : overrides) collect_override(override, settings);
  // The one-command form fine-tunes: the Hugging Face model's weights loaded after zero.Init as
  // from_pretrained loads them, unless a flag (--from-config) or --set names run.load.
  bool fine_tune = false;
  if (path.empty() && find_setting(settings, "run.load") == nullptr) {
    collect_override({"run.load", "pretrained"}, settings, "--hf-config");
    fine_tune = true;
  }
  Origins origins;
  Scenario scenario = build(name, settings, origins);
  check_scenario(scenario, [&](const std::string& key) {
    const auto it = origins.find(key);
    return it == origins.end() ? name : it->second;
  });
  if (fine_tune) {
    scenario.notes.push_back(
        "run.load = pretrained: the weights loaded after zero.Init as from_pretrained loads "
        "them (fine-tuning); --from-config for a model trained from its config");
  }
  const ModelConfig& m = scenario.model;
  const std::string walked = transformers_version_of(m, scenario.run.torch_version);
  if (m.transformers_version == "auto" && walked.starts_with("5.")) {
    scenario.notes.push_back(fmt::format(
        "run.torch_version {}: the model walked as transformers {} builds and checkpoints it, the "
        "transformers the recorder's torch 2.10 environment runs (model.transformers_version = "
        "\"4.51.3\" for transformers 4's)",
        scenario.run.torch_version, walked));
  }
  return scenario;
}

}  // namespace hpz
