// `hpzlab real SCENARIO [--runs N] [--timeout S] [--json FILE] [--trace FILE] [--backend B]
// [--distributed]`: runs the schedule on a GPU with CUDA streams, events and device copies, op
// for op, once serialized (the reference) and N times for real, and reports how many runs
// corrupted the gathered parameters or the weights, and the measured step time. With
// --distributed, each process started by a launcher runs one rank (NCCL on its own GPU) and
// rank 0 reports for all. Exit 0; 1 when a run corrupted data or hung; 2 on bad input; 3
// without a CUDA device.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "real/backend.hpp"
#include "real/device.hpp"
#include "real/run.hpp"
#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/time/report.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

struct RealCliOptions {
  ScenarioOptions scenario;
  TraceOptions trace;  ///< --trace FILE, --trace-ranks, --trace-steps: the first timed run's
  int runs = 5;
  double timeout_s = 60;
  std::string backend = "cuda";
  bool distributed = false;
  std::string compute = "spin";
};

void progress(int done, int total) {
  progress_bar(done, total,
               fmt::format("{}/{} runs (the first is the serialized reference)", done, total));
}

std::string losses_line(const std::vector<double>& loss) {
  std::string s;
  for (double l : loss) s += fmt::format(" {:>9.5f}", l);
  return s;
}

/** The model math's loss per step: the reference, the numeric replay on the CPU, each run. */
std::string render_losses(const real::RealResult& r) {
  std::string s = "loss per training step (mean over ranks and micro-steps):\n";
  s += fmt::format("  {:<22}{}\n", "reference", losses_line(r.reference_loss));
  s += fmt::format("  {:<22}{}\n", "numeric replay (CPU)", losses_line(r.replay_loss));
  double worst = 0;
  for (std::size_t k = 0; k < r.reference_loss.size() && k < r.replay_loss.size(); ++k) {
    const double a = r.reference_loss[k], b = r.replay_loss[k];
    worst = std::max(worst, std::isnan(a) || std::isnan(b)
                                ? (std::isnan(a) == std::isnan(b) ? 0.0 : INFINITY)
                                : std::abs(a - b) / std::max(1.0, std::abs(b)));
  }
  s += fmt::format("  reference vs replay: largest relative difference {:.2e}\n", worst);
  for (std::size_t k = 0; k < r.runs.size(); ++k) {
    if (r.runs[k].hung) continue;
    s += fmt::format("  {:<22}{}\n", fmt::format("run {}", k + 1), losses_line(r.runs[k].loss));
  }
  return s;
}

std::string render_text(const Schedule& schedule, const real::RealResult& r) {
  std::string s = fmt::format("hpzlab real: {} ({}), variant {}, {}\n", schedule.scenario, r.device,
                              schedule_label(schedule.variant, schedule.source), r.mode);
  if (r.reference_hung) {
    return s + fmt::format("reference run: {}\n", r.reference_hang);
  }
  s += fmt::format("{:>4}  {:>12}  {:>10}  {:>12}  {:>10}  {}\n", "run", "step time", "bad gathers",
                   "bad weights", "NaN weights", "first bad read");
  for (std::size_t k = 0; k < r.runs.size(); ++k) {
    const real::RealRun& run = r.runs[k];
    if (run.hung) {
      s += fmt::format("{:>4}  {}\n", k + 1, run.hang);
      continue;
    }
    const real::Corruption& c = run.corruption;
    std::string first = "-";
    if (c.has_first) {
      const Op& op = schedule.ranks[c.first_rank].ops[c.first_op];
      first = fmt::format("rank {} op {} ({} {} of {}) at {:.3f} ms", c.first_rank, c.first_op,
                          to_string(op.kind), to_string(op.purpose),
                          op.unit == kNoUnit ? "-" : schedule.units[op.unit].name,
                          c.first_start_s * 1e3);
    }
    s += fmt::format("{:>4}  {:>10.3f} ms  {:>6}/{:<4}  {:>12}  {:>10}  {}\n", k + 1,
                     r.timing.runs[k].step_time_s * 1e3, c.bad_probes, r.probes,
                     c.corrupted_elements, c.nan_elements, first);
  }
  s += fmt::format(
      "corrupted in {} of {} runs; mean step time {:.3f} ms; races manifested "
      "{} (summed over runs); reference weights hash {:016x}\n",
      r.corrupted_runs, r.runs.size(), r.timing.mean.step_time_s * 1e3,
      r.timing.mean.races_manifested, r.reference_weights_hash);
  s += time::render_races(r.timing);
  if (r.model) s += render_losses(r);
  return s;
}

std::string render_json(const Schedule& schedule, const real::RealResult& r) {
  nlohmann::json j = time::to_json(schedule, r.timing, true);
  j["source"] = "real";
  j["backend"] = r.backend;
  j["mode"] = r.mode;
  j["device"] = r.device;
  j["ranks"] = r.ranks;
  j["processes"] = r.processes;
  j["gather_probes_per_run"] = r.probes;
  j["corrupted_runs"] = r.corrupted_runs;
  j["reference_hung"] = r.reference_hung;
  j["reference_weights_hash"] = fmt::format("{:016x}", r.reference_weights_hash);
  nlohmann::json runs = nlohmann::json::array();
  for (const real::RealRun& run : r.runs) {
    const real::Corruption& c = run.corruption;
    nlohmann::json x = {{"hung", run.hung},
                        {"corrupted", c.corrupted()},
                        {"bad_gathers", c.bad_probes},
                        {"gathered_nan_elements", c.probe_nans},
                        {"corrupted_weight_elements", c.corrupted_elements},
                        {"nan_weight_elements", c.nan_elements}};
    if (c.has_first) {
      x["first_bad_read"] = {
          {"rank", c.first_rank}, {"op", c.first_op}, {"start_s", c.first_start_s}};
    } else {
      x["first_bad_read"] = nullptr;
    }
    if (run.hung) x["hang"] = run.hang;
    runs.push_back(x);
  }
  j["corruption"] = runs;
  if (r.model) {
    nlohmann::json per_run = nlohmann::json::array();
    for (const real::RealRun& run : r.runs) per_run.push_back(run.loss);
    j["loss"] = {{"reference", r.reference_loss}, {"replay", r.replay_loss}, {"runs", per_run}};
  }
  return j.dump(2) + "\n";
}

/** The longest --timeout, in seconds (a week). */
constexpr double kMaxTimeoutS = 7 * 24 * 3600;

void run_real(const RealCliOptions& opts, int& exit_code) {
  require_at_least("--runs", opts.runs, 1);
  // A week: std::chrono's deadline (nanoseconds in 64 bits) overflows past about 9.2e9 s.
  require_within("--timeout", opts.timeout_s, 0, kMaxTimeoutS);
  check_outputs({{opts.scenario.json, "--json"}, {opts.trace.file, "--trace"}},
                inputs_of(opts.scenario));
  Scenario sc = load(opts.scenario);
  real::RealOptions ro;
  if (opts.distributed) {
    ro.launch = real::detect_launch();
    if (!ro.launch) {
      throw InputError("", "--distributed",
                       "no launcher variables found (HPZLAB_RANK and HPZLAB_WORLD_SIZE, "
                       "OMPI_COMM_WORLD_*, PMI_*, SLURM_*, or RANK and WORLD_SIZE): start it "
                       "with tools/launch-local, mpirun, srun or torchrun");
    }
  }
  if (opts.backend == "cuda") {
    const real::DeviceInfo dev = real::probe_devices();
    if (dev.count == 0) {
      fmt::print(stderr, "hpzlab: no CUDA device found ({})\n", dev.problem);
      exit_code = kExitNoDevice;
      return;
    }
  }
  const Schedule schedule = schedule_for(sc, opts.scenario.schedule);
  const time::TraceFilter filter = trace_filter(opts.trace, schedule);
  ro.runs = opts.runs;
  ro.timeout_s = opts.timeout_s;
  ro.backend = opts.backend;
  ro.compute = opts.compute;
  if (!ro.launch || ro.launch->rank == 0) ro.progress = progress;
  real::RealResult result;
  try {
    result = real::run_real(sc, schedule, ro);
  } catch (const real::HangError& e) {
    // Before any run could start (rank 0's store unreachable, a peer that never came): the
    // job hangs, exit 1, in one line like every hang.
    fmt::print(stderr, "hpzlab real: {}\n", e.what());
    exit_code = kExitFindings;
    return;
  }
  const bool hung = result.reference_hung || result.timing.mean.hung;
  exit_code = hung || result.corrupted_runs > 0 ? kExitFindings : kExitOk;
  if (!result.reports) return;  // rank 0 reports for every process
  if (!opts.scenario.json.empty())
    write_output(opts.scenario.json, render_json(schedule, result), "--json");
  if (!opts.trace.file.empty()) {
    write_trace(opts.trace, time::TraceReporter(filter).render(schedule, result.timing));
  }
  if (opts.scenario.json != "-") {
    const std::string text = render_text(schedule, result);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
}

}  // namespace

void setup_real(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<RealCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "real",
      "Run the schedule on a GPU (CUDA streams, events, device copies; ranks emulated on one "
      "GPU, or one process per GPU with NCCL: --distributed), serialized once as the reference and "
      "--runs times for real; report corrupted runs "
      "and measured timings. Exit 1 when a run corrupted data or hung, 3 without a CUDA device");
  add_scenario_options(*sub, opts->scenario);
  add_schedule_option(*sub, opts->scenario.schedule);
  sub->add_option("--runs", opts->runs, "Timed runs after the reference (default 5)");
  sub->add_option("--timeout", opts->timeout_s,
                  "Seconds any host wait may take before the run is reported as a hang "
                  "(default 60, at most 604800: a week)");
  add_trace_options(*sub, opts->trace, "of the first timed run");
  sub->add_option("--backend", opts->backend,
                  "cuda (default: ranks emulated on GPU 0) | host (CPU, every op at issue: no "
                  "race can show) | host-lazy (CPU, stream work deferred until the host waits, "
                  "the compute stream last: every race the schedule allows bites)")
      ->check(CLI::IsMember({"cuda", "host", "host-lazy"}));
  sub->add_option("--compute", opts->compute,
                  "spin (default: every kernel holds its stream for the cost model's time) | "
                  "real (a model the numeric replay holds, in fp32, such as tiny.toml: its real "
                  "math, forward, loss, backward and Adam, on any backend; a bigger model: "
                  "layer kernels as cuBLAS GEMMs of the layer's shapes, cuda only)")
      ->check(CLI::IsMember({"spin", "real"}));
  sub->add_flag("--distributed", opts->distributed,
                "One process per rank, started by a launcher (tools/launch-local, mpirun, srun, "
                "torchrun) that sets the rank and world size; rank 0's store at MASTER_ADDR:"
                "MASTER_PORT (default 127.0.0.1:29517). cuda: NCCL, GPU = local rank; host: "
                "collectives through the store. Rank 0 prints and writes the report");
  sub->callback([opts, &exit_code] { run_real(*opts, exit_code); });
}

}  // namespace hpz::cli
