// `hpzlab check`'s recordings: --record's run of tools/record (real DeepSpeed on this CPU) and its
// comparison with the DeepSpeed builder, and --schedule FILE, a schedule read from a file (a
// recording, say) checked with the known defects of the release it recorded.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sim/builder.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/ir/projection.hpp"
#include "sim/record_inputs.hpp"
#include "tools/hpzlab/check_internal.hpp"

namespace hpz::cli {
namespace {

/** Runs tools/record (real DeepSpeed on this CPU) with `args`; returns its exit status. Its
 *  progress and errors go to this process's standard error. */
int run_recorder(const std::vector<std::string>& args) {
  const std::string script = recorder_script("--record");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(script.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = 0;
  if (const int err = ::posix_spawn(&pid, script.c_str(), nullptr, nullptr, argv.data(), environ);
      err != 0) {
    throw InputError(script, "--record", std::string("cannot run it: ") + std::strerror(err));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid on the recorder failed");
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/** The known DeepSpeed defects of a recording's run (known_defects), from what `hpzlab record`
 *  writes into its source: the release, torch, the dtype and the ds_config it used. None for a
 *  schedule without them (a built one, or a recording of a release hpzlab does not know), and
 *  none read from a ds_config_used that is not a JSON object of the expected types. */
std::vector<const ReleaseRule*> recorded_defects(const Schedule& s) {
  const auto at = [&](const char* key) {
    const auto it = s.source.find(key);
    return it == s.source.end() ? std::string() : it->second;
  };
  const std::string version = at("deepspeed");
  if (!is_deepspeed_release(version)) return {};
  const nlohmann::json ds = nlohmann::json::parse(at("ds_config_used"), nullptr, false);
  if (!ds.is_object()) return {};
  const auto flag = [](const nlohmann::json& object, const char* key) {
    const auto it = object.find(key);
    return it != object.end() && it->is_boolean() && it->get<bool>();
  };
  const auto zero_it = ds.find("zero_optimization");
  const nlohmann::json zero =
      zero_it != ds.end() && zero_it->is_object() ? *zero_it : nlohmann::json::object();
  RunTraits t;
  const std::string torch = at("torch");
  t.torch = torch.substr(0, torch.find('+'));  // "2.1.2+cu121": the release
  if (const auto accum = ds.find("gradient_accumulation_steps");
      accum != ds.end() && accum->is_number_integer()) {
    t.grad_accum =
        static_cast<int>(std::clamp<std::int64_t>(accum->get<std::int64_t>(), 1, 1 << 20));
  }
  t.qwz_non_fp16 = flag(zero, "zero_quantized_weights") && at("dtype") != "float16";
  t.qgz = flag(zero, "zero_quantized_gradients");
  return known_defects(version, t);
}

}  // namespace

/** --record: the recording against the DeepSpeed builder's schedule of the same scenario
 *  (sim/projection.hpp); the builder's refusal is the comparison's error. */
RecordingComparison compare_with_builder(const Scenario& sc, const Schedule& rec) {
  Schedule built;
  try {
    Scenario as_recorded = sc;
    as_recorded.run.as_recorded = true;  // the recorder's AdamW and its logged .item()
    // The steps DeepSpeed skipped as it ran (fp16's overflow, 0.19.8's invalid norm): data the
    // builder takes from the recording.
    if (const auto skipped = rec.source.find("skipped_steps"); skipped != rec.source.end()) {
      as_recorded.run.skipped_steps =
          parse_step_list(skipped->second, rec.scenario, "skipped_steps");
    }
    built = build_schedule(as_recorded);
  } catch (const InputError& e) {
    RecordingComparison out;
    out.ranks = recorded_ranks(rec);
    out.error = e.what();
    return out;
  }
  RecordingComparison c = compare_recording(rec, built);
  const ModelConfig& m = sc.model;
  // The builder runs every routed expert; DeepseekV2MoE.moe skips one without tokens, and the
  // recorder's constant weights send every token to the same experts. Only a first difference
  // at a routed expert's op (on either side) is that one; any other is a defect to report.
  const auto at_expert = [](const std::string& op) {
    return op.find(".mlp.experts.") != std::string::npos;
  };
  if (!c.equal() && m.family == "deepseek_v2" && m.experts_per_token < m.experts &&
      (at_expert(c.recorded_op) || at_expert(c.built_op))) {
    c.expected_because = fmt::format(
        "DeepSeek-V2's MoE runs only the experts that received tokens, and the recorder's "
        "constant weights route every token to the same {} of the {}, where the builder takes "
        "every expert to receive tokens (docs/deepspeed-builder.md)",
        m.experts_per_token, m.experts);
  }
  return c;
}

/** --record: the schedule real DeepSpeed issues for `sc` (its version, cluster, model and
 *  ds_config: sim/record_inputs.hpp), recorded by tools/record into `dir`. */
Schedule record_schedule(const Scenario& sc, const std::filesystem::path& dir) {
  if (sc.run.variant != Variant::kStock) {
    throw InputError(sc.path, "run.variant",
                     fmt::format("{} cannot be recorded: --record runs DeepSpeed as it ships "
                                 "(allowed: stock; host-sync and event-wait are the builder's "
                                 "what-ifs)",
                                 to_string(sc.run.variant)));
  }
  if (sc.zero.stage == 0) {
    throw InputError(sc.path, "zero.stage",
                     "0 cannot be recorded: the recorder runs DeepSpeed's ZeRO optimizers, and "
                     "stage 0 has none (allowed: 1, 2, 3)");
  }
  if (sc.zero.offload_param) {
    // The recorder refuses it too (hpzrec/cli.py): said here before anything is written.
    throw InputError(sc.path, "zero.offload_param",
                     "true cannot be recorded: the recorder runs DeepSpeed on a CPU, where the "
                     "host memory it offloads to and the GPU's memory are one (allowed: false)");
  }
  if (sc.run.load == "checkpoint") {
    throw InputError(sc.path, "run.load",
                     "checkpoint cannot be recorded yet: the recorder loads weights as "
                     "from_pretrained does, not a ZeRO checkpoint (allowed: none, pretrained)");
  }
  if (sc.run.step_stream != "default") {
    throw InputError(sc.path, "run.step_stream",
                     sc.run.step_stream +
                         " cannot be recorded: the recorder runs DeepSpeed on a CPU, which has "
                         "no streams to issue the step from (allowed: default)");
  }
  const std::string v = sc.zero.deepspeed_version;
  const std::string hf = (dir / (v + "-config.json")).string();
  const std::string ds = (dir / (v + "-ds_config.json")).string();
  const std::string out = (dir / (v + "-schedule.json")).string();
  write_output(hf, recorder_hf_config(sc).dump(2) + "\n", "--record-dir");
  write_output(ds, recorder_ds_config(sc).dump(2) + "\n", "--record-dir");
  std::vector<std::string> args = {"--hf-config", hf, "--ds-config", ds, "--out", out};
  for (std::string& a : recorder_args(sc)) args.push_back(std::move(a));
  end_progress_line();
  std::fprintf(stderr, "hpzlab check --record: recording DeepSpeed %s (%s)\n", v.c_str(),
               sc.path.c_str());
  if (const int rc = run_recorder(args); rc != 0) {
    if (rc == kExitBadInput) {
      throw InputError(sc.path, "--record",
                       fmt::format("DeepSpeed {} refused this configuration (the recorder's "
                                   "error above; its inputs are in {})",
                                   v, dir.string()));
    }
    if (rc == 1) {
      // An exception in the run: DeepSpeed's own on this configuration (0.14.4's narrow() on a
      // secondary slice past a parameter's end, as the builder refuses it too) or, where the
      // traceback ends in tools/recorder, the recorder's.
      throw InputError(sc.path, "--record",
                       fmt::format("DeepSpeed {} raised while it ran this configuration (the "
                                   "traceback above says where; inputs in {})",
                                   v, dir.string()));
    }
    throw std::runtime_error(fmt::format(
        "recording DeepSpeed {} failed with exit code {} (inputs in {})", v, rc, dir.string()));
  }
  Schedule s = read_schedule(out);
  s.scenario = sc.path;
  return s;
}

/** --schedule FILE: one schedule; a scenario, if given, only has to agree on the world size. */
Checked check_file(const CheckOptions& opts) {
  if (opts.scenarios.size() > 1) {
    throw InputError("", "--schedule", "checks one schedule: give at most one scenario");
  }
  if (opts.scenarios.empty() && !opts.sets.empty() && !has_user_files(opts.user)) {
    throw InputError("", "--set", "needs a scenario to apply to");
  }
  if (!opts.deepspeed.empty()) {
    throw InputError("", "--deepspeed",
                     "builds each version's schedule with the DeepSpeed builder; a schedule read "
                     "with --schedule has its own version");
  }
  Schedule schedule;
  run_showing_progress(0, 1, "reading " + opts.schedule,
                       [&] { schedule = read_schedule(opts.schedule); });
  std::optional<Scenario> sc;
  if (!opts.scenarios.empty() || has_user_files(opts.user)) {
    const std::string path = opts.scenarios.empty() ? "" : opts.scenarios[0];
    sc = load(path, opts.user, overrides_of(opts));
    check_world_size(*sc, schedule, opts.schedule);
  } else if (opts.sensitivity) {
    throw InputError("", "--sensitivity",
                     "simulates the schedule, which needs a scenario for the cluster and the "
                     "costs (give one, whose world size the schedule has)");
  }
  check::CheckResult result;
  std::string rank_by_rank;
  run_showing_progress(0.5, 1, "checking " + opts.schedule, [&] {
    result = on_schedule(opts.schedule,
                         [&] { return check_one(schedule, opts, opts.schedule, rank_by_rank); });
  });
  progress_bar(1, 1, opts.schedule + " checked");
  const auto v = schedule.source.find("deepspeed");
  const std::string recorded = v == schedule.source.end() ? "" : v->second;
  const bool clean = result.clean();
  Checked checked{std::move(result),
                  step_count(schedule),
                  true,
                  {},
                  std::nullopt,
                  {},
                  "",
                  recorded_defects(schedule),
                  is_deepspeed_release(recorded) ? recorded : "",
                  std::nullopt,
                  {},
                  std::nullopt,
                  std::move(rank_by_rank)};
  if (opts.sensitivity) {
    sc->run.steps = step_count(schedule);  // as sim --schedule takes them
    checked.sensitivity = on_schedule(
        opts.schedule, [&] { return timing_margin(*sc, schedule, checked.result, true); });
  }
  if (opts.explain && clean) {
    run_showing_progress(0.75, 1, "explaining " + opts.schedule, [&] {
      checked.explanation =
          check::explain_ordering(schedule, std::max(1u, std::thread::hardware_concurrency()));
    });
  }
  return checked;
}

}  // namespace hpz::cli
