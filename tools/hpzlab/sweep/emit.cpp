#include "tools/hpzlab/sweep/emit.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "tools/hpzlab/sweep/fields.hpp"
#include "tools/hpzlab/sweep/runner.hpp"

namespace hpz::sweep {
namespace fs = std::filesystem;
namespace {

/** A word for sh: single-quoted unless it is plainly safe. */
std::string shell_word(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "_-+=.,/:@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string stem(std::size_t point, std::size_t variant) {
  return fmt::format("p{}-v{}", point, variant);
}

std::string repro_stem(std::size_t point) {
  return fmt::format("p{}-repro", point);
}

/** What the repro command of a point left in DIR/out: its JSON, or why there is none. */
std::pair<nlohmann::json, std::string> collected_repro(const std::string& dir, std::size_t point,
                                                       Collected& c) {
  ++c.replays;
  const std::string base = dir + "/out/" + repro_stem(point);
  const std::string json_path = base + ".json";
  const std::optional<std::string> text = read_command_output(json_path, "a command's JSON");
  const std::optional<std::string> err =
      read_command_output(base + ".err", "a command's error output");
  if (text) {
    nlohmann::json j;
    try {
      j = parse_json_input(*text, json_path, "not JSON");
    } catch (const InputError& e) {
      ++c.replays_failed;  // not what `hpzlab repro` writes (it writes its outputs whole)
      return {nullptr, "hpzlab repro's JSON is unreadable: " + std::string(e.what())};
    }
    Field(j, json_path).at("variants").object();
    return {std::move(j), ""};
  }
  if (err) {
    ++c.replays_failed;
    const std::string error = error_line_of(*err);
    return {nullptr, "hpzlab repro failed: " + (error.empty() ? "no JSON written" : error)};
  }
  ++c.replays_missing;
  return {nullptr, "hpzlab repro has not run yet"};
}

/** The rows of what one simulation command left in DIR/out (`base` without .json/.err): from
 *  its JSON, failed rows from its standard error, nothing when it has not run. */
std::optional<std::vector<Row>> collected_sim(const Plan& plan, SimKey key,
                                              const std::string& base) {
  const std::string json_path = base + ".json";
  const std::optional<std::string> text = read_command_output(json_path, "a command's JSON");
  const std::optional<std::string> err =
      read_command_output(base + ".err", "a command's error output");
  if (text) {
    nlohmann::json sim;
    try {
      sim = parse_json_input(*text, json_path, "not JSON");
    } catch (const InputError& e) {
      // Not what `hpzlab sim` writes (it writes its outputs whole): a failed row that says so.
      return failed_rows(plan, key, std::string("its JSON is unreadable: ") + e.what());
    }
    return rows_from_sim(plan, key, sim, json_path);
  }
  if (err) {
    const std::string error = error_line_of(*err);
    return failed_rows(plan, key, error.empty() ? "no JSON written" : error);
  }
  return std::nullopt;
}

/** DIR/scenario.toml when the scenario loads from there, else the original's absolute path. */
std::string scenario_for_commands(const Plan& plan, const fs::path& dir) {
  if (plan.scenario.empty()) return "";  // the one-command form: the flags name the files
  const fs::path copy = dir / "scenario.toml";
  std::error_code ec;
  fs::copy_file(plan.scenario, copy, fs::copy_options::overwrite_existing, ec);
  if (!ec) {
    try {
      std::vector<Override> sets;
      for (const std::string& s : plan.sets) sets.push_back(parse_override(s));
      load_scenario(copy.string(), sets, plan.flags);
      return copy.string();
    } catch (const InputError&) {
      // It names a file (hf_config, ds_config) by a path relative to where it was.
    }
    fs::remove(copy, ec);
  }
  return fs::absolute(plan.scenario).lexically_normal().string();
}

/** Writes PATH.tmp, then renames it over PATH: a kill leaves no half file at PATH. */
class FileOut {
 public:
  explicit FileOut(fs::path path) : path_(std::move(path)), tmp_(path_.string() + ".tmp") {
    std::error_code ec;
    fs::remove(tmp_, ec);  // one a killed --emit left (a link is removed, never followed)
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!out_) throw InputError(tmp_, "--emit", "cannot create this file");
  }
  std::ofstream& stream() { return out_; }
  void commit() {
    out_.close();
    std::error_code ec;
    if (!out_) {
      fs::remove(tmp_, ec);
      throw InputError(path_.string(), "--emit", "cannot write this file");
    }
    fs::rename(tmp_, path_, ec);
    if (ec) throw InputError(path_.string(), "--emit", "cannot write this file: " + ec.message());
  }

 private:
  fs::path path_;
  std::string tmp_;
  std::ofstream out_;
};

/** What an --emit killed before it wrote sweep.json leaves (issue 34, item 13): out/ still
 *  empty, commands.txt (or its .tmp) and the scenario's copy. */
bool interrupted_emit(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir / "sweep.json", ec))) return false;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "out") {
      if (!e.is_directory(ec) || e.is_symlink(ec) || !fs::is_empty(e.path(), ec)) return false;
    } else if (name != "commands.txt" && name != "commands.txt.tmp" && name != "scenario.toml" &&
               name != "sweep.json.tmp") {
      return false;
    }
  }
  return !ec;
}

}  // namespace

std::size_t emit(const Plan& plan, const std::string& dir, const std::string& program) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec) && !interrupted_emit(dir)) {
    throw InputError(dir, "--emit",
                     "exists and is not empty (allowed: a new or empty directory, or one an "
                     "interrupted --emit left)");
  }
  const fs::path root = fs::absolute(dir).lexically_normal();
  fs::create_directories(root / "out", ec);
  if (ec) throw InputError(dir, "--emit", "cannot create this directory: " + ec.message());
  Plan emitted = plan;
  emitted.scenario = scenario_for_commands(plan, root);
  // The files the flags name, by absolute path: the commands may run anywhere.
  for (std::size_t i = 0; i + 1 < emitted.flag_args.size(); ++i) {
    const std::string& flag = emitted.flag_args[i];
    if (flag == "--ds-config" || flag == "--hf-config") {
      emitted.flag_args[i + 1] = fs::absolute(emitted.flag_args[i + 1]).lexically_normal().string();
    }
  }
  // Streamed line by line: 1e7 simulations are gigabytes of commands (issue 34, item 13).
  FileOut commands(root / "commands.txt");
  std::ofstream& out = commands.stream();
  std::size_t n = 0;
  const auto add = [&](const std::vector<std::string>& args, const std::string& base) {
    out << "\"${HPZLAB:-" << program << "}\"";
    for (const std::string& arg : args) out << ' ' << shell_word(arg);
    out << " >/dev/null 2>" << shell_word(base + ".err") << '\n';
    ++n;
  };
  for (std::size_t point = 0; point < emitted.points(); ++point) {
    for (std::size_t v = 0; v < emitted.variants.size(); ++v) {
      const std::string base = (root / "out" / stem(point, v)).string();
      add(emitted.sim_args(point, v, base + ".json"), base);
    }
    if (emitted.repro) {
      const std::string base = (root / "out" / repro_stem(point)).string();
      add(emitted.repro_args(point, base + ".json"), base);
    }
  }
  commands.commit();
  // Last: a directory with sweep.json is a finished --emit.
  FileOut sweep_json(root / "sweep.json");
  sweep_json.stream() << emitted.to_json().dump(2) << "\n";
  sweep_json.commit();
  return n;
}

Plan read_plan(const std::string& dir) {
  const std::string path = dir + "/sweep.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    throw InputError(dir, "--collect",
                     "no readable sweep.json here (allowed: a directory `hpzlab sweep --emit` "
                     "wrote)");
  }
  // The guarded reader, then every field through Field and the command line's limits
  // (issue 34: "runs": 2000000000 built 2e9 rows, "runs": -5 gave an empty table, exit 0).
  return plan_from_json(
      parse_json_input(read_input_file(path, path, "", "cannot read the sweep's plan"), path,
                       "not JSON"),
      path);
}

Collected collect(const std::string& dir) {
  const Plan plan = read_plan(dir);
  lock_dir(dir, "--collect");
  // Everything is read and checked before the table is written: a file that is not what the
  // commands write stops --collect with one line (exit 2), the table as it was.
  Collected c;
  std::vector<std::vector<Row>> all;  // a simulation's rows each
  for (std::size_t point = 0; point < plan.points(); ++point) {
    std::pair<nlohmann::json, std::string> repro;
    if (plan.repro) repro = collected_repro(dir, point, c);
    for (std::size_t v = 0; v < plan.variants.size(); ++v) {
      ++c.simulations;
      const std::string base = dir + "/out/" + stem(point, v);
      std::optional<std::vector<Row>> rows = collected_sim(plan, {point, v}, base);
      if (!rows) {
        ++c.missing;
        continue;
      }
      if (plan.repro) {
        fill_repro(*rows, repro.first, repro.second, dir + "/out/" + repro_stem(point) + ".json");
      }
      all.push_back(std::move(*rows));
    }
  }
  Table table(plan, dir);
  table.start();
  for (const std::vector<Row>& rows : all) table.append(rows);
  c.table = table.finish();
  return c;
}

}  // namespace hpz::sweep
