#include "real/run.hpp"

#include <fmt/format.h>

#include "real/device.hpp"
#include "sim/check/checker.hpp"
#include "sim/error.hpp"
#include "sim/time/races.hpp"

namespace hpz::real {
namespace {

// Room the CUDA context, the caching allocator's spare blocks and fragmentation need beyond
// one lifetime of every buffer.
constexpr double kMemoryHeadroom = 0.8;
// The host backends keep every lifetime's storage for the whole run.
constexpr std::uint64_t kHostBackendBytes = std::uint64_t{4} << 30;

}  // namespace

RealResult run_real(const Scenario& scenario, const Schedule& schedule,
                    const RealOptions& options) {
  const Plan plan = make_plan(scenario, schedule);
  RealResult out;
  out.ranks = schedule.world_size;
  out.probes = plan.probes;
  std::unique_ptr<Backend> backend;
  const bool cuda = options.backend == "cuda";
  if (cuda) {
    const DeviceInfo dev = probe_devices();
    const std::uint64_t need = peak_bytes_estimate(plan, schedule);
    if (static_cast<double>(need) > kMemoryHeadroom * static_cast<double>(dev.memory_bytes)) {
      throw InputError(scenario.path, "cluster",
                       fmt::format("{} emulated ranks need about {:.1f} GiB of device memory, "
                                   "more than {:.0f}% of the {:.1f} GiB of {}; use a smaller "
                                   "model or fewer ranks (scenarios/race-1gpu.toml fits)",
                                   schedule.world_size, static_cast<double>(need) / (1 << 30),
                                   kMemoryHeadroom * 100,
                                   static_cast<double>(dev.memory_bytes) / (1 << 30), dev.name));
    }
    backend = make_cuda_backend();
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
  } else {
    std::uint64_t bytes = 0;
    for (const RankPlan& rp : plan.ranks) {
      for (const SlotInfo& s : rp.slots) {
        bytes += s.elements * static_cast<std::uint64_t>(plan.element_bytes);
      }
    }
    if (bytes > kHostBackendBytes) {
      throw InputError(scenario.path, "--backend",
                       fmt::format("the host backends keep every buffer lifetime, {:.1f} GiB "
                                   "here (at most {:.0f} GiB): use a small scenario such as "
                                   "scenarios/tiny.toml",
                                   static_cast<double>(bytes) / (1 << 30),
                                   static_cast<double>(kHostBackendBytes) / (1 << 30)));
    }
    const bool lazy = options.backend == "host-lazy";
    backend = make_host_backend(lazy);
    out.device = "cpu";
    out.mode = lazy ? fmt::format(
                          "host, lazy streams: {} ranks; stream work runs when the host "
                          "waits, the compute stream last",
                          schedule.world_size)
                    : fmt::format("host reference: {} ranks, every op carried out at issue",
                                  schedule.world_size);
  }
  out.backend = backend->name();
  const int total = options.runs + 1;

  ExecOptions serialized;
  serialized.serialize = true;
  serialized.timeout_s = options.timeout_s;
  const RunOutput reference = execute(schedule, plan, *backend, serialized);
  out.reference_hung = reference.hung;
  out.reference_hang = reference.hang;
  if (options.progress) options.progress(1, total);

  time::SimResult& t = out.timing;
  t.scenario = schedule.scenario;
  t.variant = schedule.variant;
  t.world_size = schedule.world_size;
  t.nodes = scenario.cluster.nodes;
  t.steps = scenario.run.steps;
  t.spin_before_copy_us = scenario.run.spin_before_copy_us;
  t.collective_model = cuda ? "emulated (device copies)" : options.backend;
  t.network_model = "none (measured)";
  time::attach_races(check::check_schedule(schedule), t);

  ExecOptions timed;
  timed.timeout_s = options.timeout_s;
  std::vector<Timeline> timelines;
  for (int k = 0; k < options.runs; ++k) {
    RunOutput run = execute(schedule, plan, *backend, timed);
    RealRun rr;
    rr.hung = run.hung;
    rr.hang = run.hang;
    if (!run.hung && !reference.hung) rr.corruption = compare_runs(plan, reference, run);
    out.corrupted_runs += rr.corruption.corrupted() ? 1 : 0;
    out.runs.push_back(rr);
    time::StepMetrics m = time::step_metrics(scenario, schedule, run.timeline);
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
  return out;
}

}  // namespace hpz::real
