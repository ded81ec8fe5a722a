#include "tools/hpzlab/sweep/emit.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "sim/error.hpp"
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
  nlohmann::json j = read_sweep_json(base + ".json");
  if (j.is_object() && j.contains("variants")) return {std::move(j), ""};
  if (fs::exists(base + ".err")) {
    ++c.replays_failed;
    const std::string error = last_error_line(base + ".err");
    return {nullptr, "hpzlab repro failed: " + (error.empty() ? "no JSON written" : error)};
  }
  ++c.replays_missing;
  return {nullptr, "hpzlab repro has not run yet"};
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

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw InputError(path.string(), "--emit", "cannot write this file");
}

}  // namespace

std::size_t emit(const Plan& plan, const std::string& dir, const std::string& program) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    throw InputError(dir, "--emit", "exists and is not empty (allowed: a new or empty directory)");
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
  std::string commands;
  std::size_t n = 0;
  const auto add = [&](const std::vector<std::string>& args, const std::string& out) {
    // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false positive) on
    // "literal" + std::string.
    commands += "\"${HPZLAB:-";
    commands += program;
    commands += "}\"";
    for (const std::string& arg : args) {
      commands += ' ';
      commands += shell_word(arg);
    }
    commands += " >/dev/null 2>";
    commands += shell_word(out + ".err");
    commands += '\n';
    ++n;
  };
  for (std::size_t point = 0; point < emitted.points(); ++point) {
    for (std::size_t v = 0; v < emitted.variants.size(); ++v) {
      const std::string out = (root / "out" / stem(point, v)).string();
      add(emitted.sim_args(point, v, out + ".json"), out);
    }
    if (emitted.repro) {
      const std::string out = (root / "out" / repro_stem(point)).string();
      add(emitted.repro_args(point, out + ".json"), out);
    }
  }
  write_text(root / "commands.txt", commands);
  write_text(root / "sweep.json", emitted.to_json().dump(2) + "\n");
  return n;
}

Plan read_plan(const std::string& dir) {
  const std::string path = dir + "/sweep.json";
  const nlohmann::json j = read_sweep_json(path);
  if (!j.is_object()) {
    throw InputError(dir, "--collect",
                     "no readable sweep.json here (allowed: a directory `hpzlab sweep --emit` "
                     "wrote)");
  }
  return plan_from_json(j);
}

Collected collect(const std::string& dir) {
  const Plan plan = read_plan(dir);
  lock_dir(dir, "--collect");
  Table table(plan, dir);
  table.start();
  Collected c;
  for (std::size_t point = 0; point < plan.points(); ++point) {
    std::pair<nlohmann::json, std::string> repro;
    if (plan.repro) repro = collected_repro(dir, point, c);
    for (std::size_t v = 0; v < plan.variants.size(); ++v) {
      ++c.simulations;
      const std::string base = dir + "/out/" + stem(point, v);
      const nlohmann::json sim = read_sweep_json(base + ".json");
      std::vector<Row> rows;
      if (sim.is_object() && sim.contains("runs")) {
        rows = rows_from_sim(plan, {point, v}, sim);
      } else if (fs::exists(base + ".err")) {
        const std::string error = last_error_line(base + ".err");
        rows = failed_rows(plan, {point, v}, error.empty() ? "no JSON written" : error);
      } else {
        ++c.missing;
        continue;
      }
      if (plan.repro) fill_repro(rows, repro.first, repro.second);
      table.append(rows);
    }
  }
  c.table = table.finish();
  return c;
}

}  // namespace hpz::sweep
