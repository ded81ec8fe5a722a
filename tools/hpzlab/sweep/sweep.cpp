#include "tools/hpzlab/sweep/sweep.hpp"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "sim/error.hpp"
#include "tools/hpzlab/sweep/runner.hpp"

namespace hpz::sweep {
namespace fs = std::filesystem;
namespace {

std::string plan_path(const RunSettings& settings) {
  return settings.out + "/sweep.json";
}

std::string work_dir(const RunSettings& settings) {
  return settings.out + "/work";
}

bool non_empty_dir(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir, ec) && !fs::is_empty(dir, ec);
}

void check_same_plan(const Plan& plan, const RunSettings& settings) {
  const std::string path = plan_path(settings);
  const nlohmann::json before = read_sweep_json(path);
  if (before.is_null()) {
    throw InputError(settings.out, "--resume",
                     "no readable sweep.json here: not a sweep's directory (allowed: the --out of "
                     "an earlier sweep, or a new or empty directory)");
  }
  if (before != plan.to_json()) {
    throw InputError(path, "--resume",
                     "this directory holds a different sweep (scenario, --set, --vary, "
                     "--variants or --runs differ; allowed: the same arguments as the sweep "
                     "that wrote it, or a new --out)");
  }
}

/** The rows of one finished child: from its JSON, or a failed row with its error. */
std::vector<Row> rows_of(const Plan& plan, SimKey key, const std::string& json_path,
                         const std::string& err_path, const Outcome& outcome) {
  // `hpzlab sim` exits 1 when the simulated job hangs, with its JSON written all the same.
  if (outcome.exit_code == kExitOk || outcome.exit_code == kExitFindings) {
    const nlohmann::json sim = read_sweep_json(json_path);
    if (sim.is_object() && sim.contains("runs")) {
      try {
        return rows_from_sim(plan, key, sim, json_path);
      } catch (const InputError& e) {
        // Not what `hpzlab sim` writes: a failed row that says which field (issue 34), not the
        // sweep stopped halfway.
        return failed_rows(plan, key, e.what());
      }
    }
  }
  std::string error = last_error_line(err_path);
  const std::string how = outcome.signal != 0 ? fmt::format("killed by signal {}", outcome.signal)
                                              : fmt::format("exit code {}", outcome.exit_code);
  return failed_rows(plan, key, error.empty() ? how : how + ": " + error);
}

std::string stem(const SimKey& key) {
  return fmt::format("p{}-v{}", key.first, key.second);
}

/** A job's id is its simulation's index in (point, variant) order. */
SimKey key_of(const Plan& plan, std::size_t id) {
  return {id / plan.variants.size(), id % plan.variants.size()};
}

std::size_t simulations(const Plan& plan) {
  return plan.points() * plan.variants.size();
}

/** A --repro job's id: after every simulation's, one per point. */
bool is_repro_job(const Plan& plan, std::size_t id) {
  return id >= simulations(plan);
}

std::string repro_stem(std::size_t point) {
  return fmt::format("p{}-repro", point);
}

/** The simulations not done yet, in table order; with --repro, after each point's simulations
 *  the point's `hpzlab repro`. */
std::vector<Job> pending_jobs(const Plan& plan, const RunSettings& settings,
                              const std::set<SimKey>& done) {
  std::vector<Job> jobs;
  for (std::size_t point = 0; point < plan.points(); ++point) {
    bool pending = false;
    for (std::size_t v = 0; v < plan.variants.size(); ++v) {
      const SimKey key{point, v};
      if (done.count(key)) continue;
      pending = true;
      const std::string base = work_dir(settings) + "/" + stem(key);
      jobs.push_back({point * plan.variants.size() + v, plan.sim_args(point, v, base + ".json"),
                      base + ".err"});
    }
    if (!plan.repro || !pending) continue;
    const std::string base = work_dir(settings) + "/" + repro_stem(point);
    jobs.push_back(
        {simulations(plan) + point, plan.repro_args(point, base + ".json"), base + ".err"});
  }
  return jobs;
}

/** What `hpzlab repro` gave for a point: its JSON, or why there is none. */
struct ReproOutcome {
  nlohmann::json json;
  std::string error;
};

ReproOutcome repro_outcome(const std::string& json_path, const std::string& err_path,
                           const Outcome& outcome) {
  // `hpzlab repro` exits 1 when a fix does not match hpZ off or a variant hangs: results.
  if (outcome.exit_code == kExitOk || outcome.exit_code == kExitFindings) {
    nlohmann::json j = read_sweep_json(json_path);
    if (j.is_object() && j.contains("variants")) return {std::move(j), ""};
  }
  const std::string error = last_error_line(err_path);
  const std::string how = outcome.signal != 0 ? fmt::format("killed by signal {}", outcome.signal)
                                              : fmt::format("exit code {}", outcome.exit_code);
  return {nlohmann::json(), "hpzlab repro failed: " + (error.empty() ? how : how + ": " + error)};
}

/** The final table and its rows by status. */
Summary tally(std::vector<Row> table) {
  Summary summary;
  for (const Row& row : table) {
    const std::string status = row.value("status", "");
    summary.ok += status == "ok";
    summary.hung += status == "hung";
    summary.failed += status == "failed";
  }
  summary.rows = table.size();
  summary.table = std::move(table);
  return summary;
}

}  // namespace

void prepare_dir(const Plan& plan, const RunSettings& settings) {
  if (non_empty_dir(settings.out)) {
    if (!settings.resume) {
      throw InputError(settings.out, "--out",
                       "exists and is not empty (allowed: a new or empty directory, or "
                       "--resume to finish the sweep in it)");
    }
    check_same_plan(plan, settings);
  }
  std::error_code ec;
  fs::create_directories(work_dir(settings), ec);
  if (ec) throw InputError(settings.out, "--out", "cannot create this directory: " + ec.message());
  lock_dir(settings.out, settings.resume ? "--resume" : "--out");
  std::ofstream(plan_path(settings)) << plan.to_json().dump(2) << "\n";
}

Summary run(const Plan& plan, const RunSettings& settings,
            const std::function<void(const Progress&)>& progress) {
  Table table(plan, settings.out);
  std::set<SimKey> done;
  if (settings.resume) {
    done = table.resume();
  } else {
    table.start();
  }
  const std::vector<Job> jobs = pending_jobs(plan, settings, done);
  // With --repro a simulation's rows wait for its point's repro (held), then are appended.
  std::map<std::size_t, ReproOutcome> repro_of;
  std::map<std::size_t, std::vector<std::vector<Row>>> held;
  Progress now;
  now.total = jobs.size();
  now.repro = plan.repro;
  const auto start = std::chrono::steady_clock::now();
  const auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::size_t sims_ran = 0, replays_failed = 0;
  const auto append = [&](std::vector<Row> rows, std::size_t point) {
    const auto it = repro_of.find(point);
    if (it == repro_of.end()) {
      held[point].push_back(std::move(rows));
      return;
    }
    try {
      fill_repro(rows, it->second.json, it->second.error,
                 work_dir(settings) + "/" + repro_stem(point) + ".json");
    } catch (const InputError& e) {
      fill_repro(rows, nullptr, e.what());  // a field of repro's JSON not as repro writes it
    }
    table.append(rows);
  };
  run_jobs(settings.program, jobs, settings.jobs, [&](const Job& job, const Outcome& outcome) {
    std::error_code ec;
    if (is_repro_job(plan, job.id)) {
      const std::size_t point = job.id - simulations(plan);
      const std::string json_path = work_dir(settings) + "/" + repro_stem(point) + ".json";
      ReproOutcome r = repro_outcome(json_path, job.stderr_path, outcome);
      now.failed += !r.error.empty();
      replays_failed += !r.error.empty();
      repro_of[point] = std::move(r);
      for (std::vector<Row>& rows : held[point]) append(std::move(rows), point);
      held.erase(point);
      fs::remove(json_path, ec);
    } else {
      const SimKey key = key_of(plan, job.id);
      const std::string json_path = work_dir(settings) + "/" + stem(key) + ".json";
      std::vector<Row> rows = rows_of(plan, key, json_path, job.stderr_path, outcome);
      now.failed += rows.front()["status"] == "failed";
      ++sims_ran;
      if (plan.repro) {
        append(std::move(rows), key.first);
      } else {
        table.append(rows);
      }
      fs::remove(json_path, ec);
    }
    fs::remove(job.stderr_path, ec);
    ++now.done;
    now.elapsed_s = seconds_since_start();
    progress(now);
  });
  std::error_code ec;
  fs::remove(work_dir(settings), ec);  // only when empty
  Summary summary = tally(table.finish());
  summary.ran = sims_ran;
  summary.skipped = done.size();
  summary.replays = jobs.size() - sims_ran;
  summary.replays_failed = replays_failed;
  summary.elapsed_s = seconds_since_start();
  return summary;
}

}  // namespace hpz::sweep
