#include "real/run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "real/device.hpp"
#include "real/gemm.hpp"
#include "real/store.hpp"
#include "sim/check/checker.hpp"
#include "sim/error.hpp"
#include "sim/replay/data_engine.hpp"
#include "sim/replay/replay.hpp"
#include "sim/time/races.hpp"

namespace hpz::real {
namespace {

// Room the CUDA context, the caching allocator's spare blocks and fragmentation need beyond
// one lifetime of every buffer.
constexpr double kMemoryHeadroom = 0.8;
// The host backends keep every lifetime's storage for the whole run.
constexpr std::uint64_t kHostBackendBytes = std::uint64_t{4} << 30;

void check_memory(const Scenario& scenario, std::uint64_t need, const DeviceInfo& dev,
                  const std::string& who) {
  if (static_cast<double>(need) <= kMemoryHeadroom * static_cast<double>(dev.memory_bytes)) return;
  throw InputError(scenario.path, "cluster",
                   fmt::format("{} need about {:.1f} GiB of device memory, more than {:.0f}% of "
                               "the {:.1f} GiB of {}; use a smaller model or fewer ranks "
                               "(scenarios/race-1gpu.toml fits)",
                               who, static_cast<double>(need) / (1 << 30), kMemoryHeadroom * 100,
                               static_cast<double>(dev.memory_bytes) / (1 << 30), dev.name));
}

void check_host_memory(const Scenario& scenario, const Plan& plan) {
  std::uint64_t bytes = 0;
  for (const RankPlan& rp : plan.ranks) {
    for (const SlotInfo& s : rp.slots) {
      if (s.touched) bytes += s.elements * static_cast<std::uint64_t>(plan.element_bytes);
    }
  }
  if (bytes <= kHostBackendBytes) return;
  throw InputError(scenario.path, "--backend",
                   fmt::format("the host backends keep every buffer lifetime, {:.1f} GiB "
                               "here (at most {:.0f} GiB): use a small scenario such as "
                               "scenarios/tiny.toml",
                               static_cast<double>(bytes) / (1 << 30),
                               static_cast<double>(kHostBackendBytes) / (1 << 30)));
}

/** Whether layer kernels run as cuBLAS GEMMs: --compute real on a model too big for the
 *  model's real math (the numeric replay's Llama). */
bool gemms(const Plan& plan, const RealOptions& options) {
  return options.compute == "real" && !plan.model;
}

/** Device memory --compute real's GEMM scratch takes (GemmRunner: one set for the ranks this
 *  process runs). */
std::uint64_t gemm_bytes(const Plan& plan, const RealOptions& options) {
  if (!gemms(plan, options)) return 0;
  const int rank = options.launch ? options.launch->rank : -1;
  return gemm_scratch_bytes(max_shape(gemm_shapes(plan, rank)), plan.element_bytes,
                            static_cast<int>(plan.ranks.size()));
}

/** Every rank in this process: emulated on one GPU, or on the CPU. */
std::unique_ptr<Backend> emulated_backend(const Scenario& scenario, const Schedule& schedule,
                                          const Plan& plan, const RealOptions& options,
                                          RealResult& out) {
  if (options.backend != "cuda") {
    check_host_memory(scenario, plan);
    const bool lazy = options.backend == "host-lazy";
    out.device = "cpu";
    out.mode = lazy ? fmt::format(
                          "host, lazy streams: {} ranks; stream work runs when the host "
                          "waits, the compute stream last",
                          schedule.world_size)
                    : fmt::format("host reference: {} ranks, every op carried out at issue",
                                  schedule.world_size);
    return make_host_backend(lazy);
  }
  const DeviceInfo dev = probe_devices();
  check_memory(scenario, peak_bytes_estimate(plan, schedule) + gemm_bytes(plan, options), dev,
               fmt::format("{} emulated ranks", schedule.world_size));
  std::unique_ptr<Backend> backend = make_cuda_backend(gemms(plan, options));
  out.device = dev.name;
  auto streams = static_cast<std::size_t>(backend->own_streams());
  for (const RankSchedule& rs : schedule.ranks) streams += rs.streams.size();
  out.mode = fmt::format("emulated: {} ranks on one GPU, collectives as device copies",
                         schedule.world_size);
  const auto queues = static_cast<std::size_t>(dev.hardware_queues);
  if (streams > queues) {
    out.mode += fmt::format(
        "; WARNING: {} streams share {} hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), and "
        "the false dependencies between them can hide a race (use fewer ranks)",
        streams, queues);
  }
  return backend;
}

/** This process's rank of a run with one process per rank. */
std::unique_ptr<Backend> rank_backend(const Scenario& scenario, const Schedule& schedule,
                                      const Plan& plan, const RealOptions& options, Store& store,
                                      RealResult& out) {
  const Launch& l = *options.launch;
  const auto rank = static_cast<Rank>(l.rank);
  if (options.backend == "host") {
    check_host_memory(scenario, plan);
    out.device = "cpu";
    out.mode = fmt::format(
        "one process per rank: {} processes ({}), host backend, collectives through rank 0's "
        "store",
        l.world, l.via);
    return make_host_rank_backend(rank, store);
  }
  for (const PlanOp& po : plan.ranks[rank].ops) {
    if (po.instance < 0) continue;
    const Instance& inst = plan.instances[static_cast<std::size_t>(po.instance)];
    // A collective some member never issues is reported as a hang when a rank reaches it; one
    // whose buffers do not fit a single NCCL call cannot run at all.
    if (inst.members.size() == inst.group_ranks.size() &&
        po.native.kind == NativeCollective::Kind::kNone) {
      throw InputError(scenario.path, "model",
                       "a collective's buffers do not fit one NCCL call (plan.hpp, "
                       "NativeCollective); run it with ranks emulated on one GPU");
    }
  }
  const DeviceInfo dev = probe_devices();
  if (l.local_rank >= dev.count) {
    throw InputError("environment", l.via,
                     fmt::format("local rank {} needs GPU {}, but this node has {} CUDA "
                                 "device(s); start at most one process per GPU",
                                 l.local_rank, l.local_rank, dev.count));
  }
  check_memory(scenario, peak_bytes_estimate(plan, schedule, l.rank) + gemm_bytes(plan, options),
               dev, fmt::format("rank {}'s buffers", l.rank));
  out.device = dev.name;
  out.mode =
      fmt::format("one process per rank: {} processes ({}), NCCL collectives, one GPU per process",
                  l.world, l.via);
  return make_nccl_backend(schedule, rank, l.local_rank, store, gemms(plan, options));
}

constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ULL;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ULL;

/** FNV-1a, continuing from `h`, over 64-bit little-endian words and then the tail's bytes: a
 *  byte at a time is 2.5 s per GiB, too slow for race-1gpu's 1.8 GiB of weights. */
std::uint64_t fnv1a(std::uint64_t h, const std::uint8_t* p, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = 0;
    for (int b = 7; b >= 0; --b) w = (w << 8) | p[i + static_cast<std::size_t>(b)];
    h = (h ^ w) * kFnvPrime;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

/** The hash of rank r's final weights in `run`. */
std::uint64_t rank_weights_hash(const RunOutput& run, Rank r) {
  std::uint64_t h = kFnvBasis;
  if (static_cast<std::size_t>(r) >= run.weights.size()) return h;
  for (const auto& unit : run.weights[r]) h = fnv1a(h, unit.data(), unit.size());
  return h;
}

/** Per-rank weight hashes combined in rank order. */
std::uint64_t combine_hashes(const std::vector<std::uint64_t>& per_rank) {
  return fnv1a(kFnvBasis, reinterpret_cast<const std::uint8_t*>(per_rank.data()),
               per_rank.size() * sizeof(std::uint64_t));
}

/** What one process knows of a run: its rank's timeline rows, corruption, weights hash (when
 *  `hash`; 0 otherwise) and whether it hung. CBOR, which keeps NaN times (ops that never ran) as
 * they are. */
std::string encode_part(const RunOutput& run, const Corruption& c, Rank rank, bool hash) {
  nlohmann::json rows = nlohmann::json::array();
  for (const OpTime& t : run.timeline.ranks[rank]) rows.push_back({t.issue_s, t.start_s, t.end_s});
  const nlohmann::json j = {
      {"hung", run.hung},
      {"hang", run.hang},
      {"corrupted", c.corrupted_elements},
      {"nans", c.nan_elements},
      {"bad_probes", c.bad_probes},
      {"probe_nans", c.probe_nans},
      {"has_first", c.has_first},
      {"first_rank", c.first_rank},
      {"first_op", c.first_op},
      {"first_start_s", c.first_start_s},
      {"weights_hash", hash ? rank_weights_hash(run, rank) : 0},
      {"losses", static_cast<std::size_t>(rank) < run.losses.size() ? run.losses[rank]
                                                                    : std::vector<float>{}},
      {"rows", rows}};
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(j);
  return {bytes.begin(), bytes.end()};
}

/** Merges every process's part of run `key` into `run` and `c`: each rank's rows from its own
 *  process, counts summed, the earliest first bad read (clocks aligned at the run's start
 *  barrier), hung when any process hung. Returns the per-rank weight hashes. */
std::vector<std::uint64_t> merge_parts(Store& store, const std::string& key, Rank rank,
                                       RunOutput& run, Corruption& c, bool hash) {
  const std::vector<std::string> parts = store.all_gather(key, encode_part(run, c, rank, hash));
  Corruption all;
  std::vector<std::uint64_t> hashes;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const nlohmann::json j = nlohmann::json::from_cbor(parts[p]);
    hashes.push_back(j.at("weights_hash").get<std::uint64_t>());
    if (j.at("hung").get<bool>() && !run.hung) {
      run.hung = true;
      run.hang = j.at("hang").get<std::string>();
    }
    all.corrupted_elements += j.at("corrupted").get<std::uint64_t>();
    all.nan_elements += j.at("nans").get<std::uint64_t>();
    all.bad_probes += j.at("bad_probes").get<std::uint64_t>();
    all.probe_nans += j.at("probe_nans").get<std::uint64_t>();
    const double start = j.at("first_start_s").get<double>();
    if (j.at("has_first").get<bool>() && (!all.has_first || start < all.first_start_s)) {
      all.has_first = true;
      all.first_rank = j.at("first_rank").get<Rank>();
      all.first_op = j.at("first_op").get<std::uint32_t>();
      all.first_start_s = start;
    }
    if (run.losses.size() < parts.size()) run.losses.resize(parts.size());
    run.losses[p] = j.at("losses").get<std::vector<float>>();
    auto& rows = run.timeline.ranks.at(p);
    const auto& in = j.at("rows");
    for (std::size_t i = 0; i < rows.size() && i < in.size(); ++i) {
      rows[i] = {in[i][0].get<double>(), in[i][1].get<double>(), in[i][2].get<double>()};
    }
  }
  c = all;
  return hashes;
}

/** The loss per training step under the model math: the mean over every rank and micro-step of
 *  the loss kernels' values, summed in double (as the numeric replay does); NaN for a step
 *  without any. */
std::vector<double> step_losses(const Scenario& scenario, const Plan& plan, const RunOutput& run) {
  std::vector<double> sum(static_cast<std::size_t>(std::max(scenario.run.steps, 0)), 0.0);
  std::vector<int> count(sum.size(), 0);
  for (std::size_t r = 0; r < plan.ranks.size() && r < run.losses.size(); ++r) {
    const std::vector<int>& steps = plan.ranks[r].loss_steps;
    for (std::size_t k = 0; k < steps.size() && k < run.losses[r].size(); ++k) {
      const auto st = static_cast<std::size_t>(steps[k]);
      if (st >= sum.size()) continue;
      sum[st] += static_cast<double>(run.losses[r][k]);
      ++count[st];
    }
  }
  for (std::size_t k = 0; k < sum.size(); ++k) {
    sum[k] = count[k] == 0 ? std::numeric_limits<double>::quiet_NaN() : sum[k] / count[k];
  }
  return sum;
}

/** Whether some op of the plan moves a gradient into a weight (spin mode's optimizer step). */
bool updates_weights(const Plan& plan) {
  for (const RankPlan& rp : plan.ranks) {
    for (const PlanOp& po : rp.ops) {
      for (const Action& a : po.actions) {
        if (a.kind == Action::Kind::kAxpy) return true;
      }
    }
  }
  return false;
}

/** Throws when the plan cannot run as asked: its gradients cross ranks with one process per rank,
 *  or it needs cuBLAS GEMMs off the cuda backend. */
void check_runnable(const Scenario& scenario, const Schedule& schedule, const Plan& plan,
                    const RealOptions& options) {
  // Gradients that reach each optimizer step through every rank's gradient slots, not through
  // the reduce-scatters (plan_gradients.cpp): one process must hold every rank.
  if (options.launch && plan.cross_rank_gradients) {
    throw InputError("", "--distributed",
                     "this schedule runs with every rank in one process (ranks emulated on one "
                     "GPU, or the host backends): the plan cannot follow its gradients through "
                     "the gradient reduction's collectives (qgZ's quantized all-to-alls, a "
                     "recording's buckets, or no reduce-scatter at all), so each optimizer step "
                     "reads every rank's memory");
  }
  if (gemms(plan, options) && options.backend != "cuda") {
    throw InputError("", "--compute",
                     "real runs cuBLAS GEMMs on this model (the model's math cannot run it: " +
                         model_math_unfit(scenario, schedule) + ") and needs --backend cuda");
  }
}

/** Where the runs happen: the backend, the options every run starts from, and with one process
 *  per rank this process's rank and the store its parts are merged through. */
struct RunSite {
  Rank rank = 0;
  std::unique_ptr<Store> store;
  std::unique_ptr<Backend> backend;
  ExecOptions base;
  int run_no = 0;  ///< the next run's number
};

/** Sets up this process's backend: its own rank's under a launcher, every rank's otherwise. */
RunSite open_site(const Scenario& scenario, const Schedule& schedule, const Plan& plan,
                  const RealOptions& options, RealResult& out) {
  RunSite site;
  site.base.timeout_s = options.timeout_s;
  site.base.real_compute = gemms(plan, options);
  if (!options.launch) {
    site.backend = emulated_backend(scenario, schedule, plan, options, out);
    return site;
  }
  const Launch& l = *options.launch;
  if (l.world != schedule.world_size) {
    throw InputError("environment", l.via,
                     fmt::format("the launcher started {} processes, but {} has {} ranks "
                                 "(cluster.nodes x cluster.gpus_per_node): start one per rank",
                                 l.world, scenario.path, schedule.world_size));
  }
  if (options.backend == "host-lazy") {
    throw InputError("", "--backend",
                     "host-lazy needs every rank in one process; with one process per rank "
                     "use cuda or host");
  }
  site.rank = static_cast<Rank>(l.rank);
  site.store =
      std::make_unique<Store>(l.rank, l.world, l.store_addr, l.store_port, options.timeout_s);
  site.backend = rank_backend(scenario, schedule, plan, options, *site.store, out);
  site.base.only_rank = l.rank;
  out.processes = l.world;
  out.reports = l.rank == 0;
  return site;
}

/** Adds to `mode` what the kernels compute and whether the weights change. */
void add_compute_mode(const Plan& plan, const RealOptions& options, bool model, std::string& mode) {
  if (gemms(plan, options)) mode += "; layer kernels as cuBLAS GEMMs of the layer shapes";
  if (model) {
    mode +=
        "; kernels run transformers' Llama in fp32, one parameter's module part each (forward, "
        "recompute, loss, backward, Adam: the numeric replay's)";
  } else if (!updates_weights(plan)) {
    mode +=
        "; no optimizer step here names the weights it updates (a recording's tensors name no "
        "parameter), so the weights never change: the gathers are what is compared";
  }
}

/** Runs once; with one process per rank the processes start together and each run's parts
 *  are merged, so every process ends with the whole run. Only the reference's weights are
 *  hashed (the report gives that hash alone). */
RunOutput run_once(RunSite& site, const Schedule& schedule, const Plan& plan, bool serialize,
                   const RunOutput* reference, Corruption& c, RealResult& out) {
  ExecOptions o = site.base;
  o.serialize = serialize;
  const int k = site.run_no++;
  std::unique_ptr<Store>& store = site.store;
  if (store) o.before_start = [&store, k] { store->barrier(fmt::format("start/{}", k)); };
  RunOutput run = execute(schedule, plan, *site.backend, o);
  if (reference != nullptr && !run.hung && !reference->hung)
    c = compare_runs(plan, *reference, run);
  const bool hash = reference == nullptr;
  std::vector<std::uint64_t> hashes;
  if (store) {
    hashes = merge_parts(*store, fmt::format("parts/{}", k), site.rank, run, c, hash);
  } else if (hash) {
    for (Rank r = 0; r < schedule.world_size; ++r) hashes.push_back(rank_weights_hash(run, r));
  }
  if (hash) out.reference_weights_hash = combine_hashes(hashes);
  return run;
}

/** The reference run's loss per step and the same training's on the CPU, into `out`. */
void reference_losses(const Scenario& scenario, const Schedule& schedule, const Plan& plan,
                      const RunOutput& reference, RealResult& out) {
  out.reference_loss = step_losses(scenario, plan, reference);
  // The same training on the CPU: the numeric replay of the schedule in a race-free order.
  // (Not along the reference's measured timeline: with one process per rank its clocks are
  // aligned only to the start barrier's skew, enough to reorder a collective's ends.)
  const Timeline order = replay::serialized_timeline(schedule);
  for (const replay::StepRecord& st :
       replay::replay(replay_inputs_of(scenario), schedule, order, replay::Mode::kNumeric).steps) {
    out.replay_loss.push_back(st.loss);
  }
}

/** The timing report's description of the run and the schedule's races, before any run. */
void describe_timing(const Scenario& scenario, const Schedule& schedule, const RealOptions& options,
                     time::SimResult& t) {
  t.scenario = schedule.scenario;
  t.variant = schedule.variant;
  t.world_size = schedule.world_size;
  t.nodes = scenario.cluster.nodes;
  t.steps = scenario.run.steps;
  t.spin_before_copy_us = scenario.run.spin_before_copy_us;
  t.collective_model = options.launch && options.backend == "cuda" ? "NCCL"
                       : options.backend == "cuda"                 ? "emulated (device copies)"
                                                                   : options.backend;
  t.network_model = "none (measured)";
  time::attach_races(check::check_schedule(schedule), t);
}

/** The measured runs, each compared with the reference, into `out` and its timing. */
void measured_runs(RunSite& site, const Scenario& scenario, const Schedule& schedule,
                   const Plan& plan, const RealOptions& options, const RunOutput& reference,
                   bool model, RealResult& out) {
  const int total = options.runs + 1;
  time::SimResult& t = out.timing;
  std::vector<Timeline> timelines;
  for (int k = 0; k < options.runs; ++k) {
    RealRun rr;
    RunOutput run = run_once(site, schedule, plan, false, &reference, rr.corruption, out);
    rr.hung = run.hung;
    if (model && !run.hung) rr.loss = step_losses(scenario, plan, run);
    rr.hang = run.hang;
    out.corrupted_runs += rr.corruption.corrupted() ? 1 : 0;
    out.runs.push_back(rr);
    time::StepMetrics m = time::step_metrics(timing_inputs_of(scenario), schedule, run.timeline);
    m.hung = m.hung || run.hung;
    t.runs.push_back(m);
    timelines.push_back(std::move(run.timeline));
    if (options.progress) options.progress(k + 2, total);
  }
  std::vector<const Timeline*> views;
  for (const Timeline& tl : timelines) views.push_back(&tl);
  time::time_races(views, t);
  t.mean = time::mean_of(t.runs);
  if (!timelines.empty()) t.timeline = std::move(timelines.front());
}

}  // namespace

RealResult run_real(const Scenario& scenario, const Schedule& given, const RealOptions& options) {
  // The plan and the backends index accesses one range each: strided ones written out.
  std::optional<Schedule> unfolded;
  if (has_strided_accesses(given)) unfolded = unfold_strided(given);
  const Schedule& schedule = unfolded ? *unfolded : given;
  // --compute real: the model's real math where the numeric replay can run the model
  // (transformers' Llama), cuBLAS GEMMs of the layer shapes otherwise.
  const bool model = options.compute == "real" && model_math_unfit(scenario, schedule).empty();
  const Plan plan = make_plan(scenario, schedule, model);
  check_runnable(scenario, schedule, plan, options);
  RealResult out;
  out.ranks = schedule.world_size;
  out.probes = plan.probes;
  out.model = model;
  RunSite site = open_site(scenario, schedule, plan, options, out);
  out.backend = site.backend->name();
  add_compute_mode(plan, options, model, out.mode);

  Corruption none;
  const RunOutput reference = run_once(site, schedule, plan, true, nullptr, none, out);
  out.reference_hung = reference.hung;
  out.reference_hang = reference.hang;
  if (model && !reference.hung) reference_losses(scenario, schedule, plan, reference, out);
  if (options.progress) options.progress(1, options.runs + 1);

  describe_timing(scenario, schedule, options, out.timing);
  measured_runs(site, scenario, schedule, plan, options, reference, model, out);
  return out;
}

}  // namespace hpz::real
