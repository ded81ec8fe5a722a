#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/check/finding_log.hpp"
#include "sim/time/report.hpp"

namespace hpz::time {
namespace {

std::string seconds(double s) {
  return duration_text(s);
}

/** A margin with its sign: "+1.200 ms" (the later op started after), "-185.0 us" (before). */
std::string signed_seconds(double s) {
  return (s < 0 ? "-" : "+") + seconds(std::abs(s));
}

void races(const SimResult& r, std::string& out) {
  bool any = false;
  for (const RaceReport& race : r.races) {
    if (race.group.example.kind != check::FindingKind::kRace) continue;
    any = true;
    out += fmt::format("  race: {} vs {}: {} instances; manifested in {} of {} runs\n",
                       check::describe_short(race.group.example.first),
                       check::describe_short(race.group.example.second), race.instances,
                       race.runs_manifested, r.runs.size());
    if (race.has_margin) {
      out += fmt::format(
          "    margin: {} at rank {} (op #{} {} op #{} ended), median {} over the instances that "
          "ran\n",
          race.min_margin_s < 0 ? "bites by " + seconds(-race.min_margin_s)
                                : "misses by " + seconds(race.min_margin_s),
          race.closest.rank, race.closest.second,
          race.min_margin_s < 0 ? "started before" : "started after", race.closest.first,
          signed_seconds(race.median_margin_s));
    }
    if (!race.has_example) continue;
    const Manifestation& m = race.example_timing;
    out += fmt::format(
        "    first in run 1: rank {} op #{} started at {:.6f} s, {} before op #{} ended at "
        "{:.6f} s (largest overlap {})\n",
        race.example.rank, race.example.second, m.second_start_s, seconds(m.overlap_s),
        race.example.first, m.first_end_s, seconds(race.max_overlap_s));
  }
  if (any) return;
  if (r.steps >= 2) {
    out += "  races: none (the checker proves this schedule race-free)\n";
    return;
  }
  // The hpZ race needs a second step: DeepSpeed copies the secondary partition in one step and
  // reads (prefetches) it in the next, after the optimizer step; step 0 does not prefetch.
  out += fmt::format(
      "  races: none in {} step: one step of DeepSpeed's schedule cannot show the hpZ race, which "
      "needs a step after the optimizer's (run.steps = 2 or more, or a longer recording)\n",
      r.steps);
}

void links(const SimResult& r, std::string& out) {
  std::vector<const LinkReport*> sorted;
  for (const LinkReport& l : r.links) sorted.push_back(&l);
  std::stable_sort(sorted.begin(), sorted.end(), [](const LinkReport* a, const LinkReport* b) {
    return a->utilisation > b->utilisation;
  });
  double nic = 0, nvlink = 0;
  for (const LinkReport& l : r.links) (l.spec.internode ? nic : nvlink) += l.bytes_last_step;
  out += fmt::format("  bytes in the step: {:.3f} GB over NICs, {:.3f} GB over NVLink\n", nic / 1e9,
                     nvlink / 1e9);
  out += "  busiest links (step):";
  for (std::size_t i = 0; i < std::min<std::size_t>(3, sorted.size()); ++i) {
    out += fmt::format(" {} {:.1f}%", sorted[i]->spec.name, 100 * sorted[i]->utilisation);
  }
  out += "\n";
}

}  // namespace

std::string duration_text(double s) {
  const double a = std::abs(s);
  if (a >= 1) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string render_races(const SimResult& result) {
  std::string out;
  races(result, out);
  return out;
}

std::string ConsoleReporter::render(const Schedule& s, const SimResult& r) const {
  const StepMetrics& m = r.mean;
  std::string out =
      fmt::format("{} [{}]: {} ranks on {} nodes, step {} of {}{}\n", r.scenario,
                  schedule_label(r.variant, s.source), r.world_size, r.nodes, r.steps - 1, r.steps,
                  r.runs.size() > 1 ? fmt::format(", mean of {} runs", r.runs.size()) : "");
  if (r.spin_before_copy_us > 0) {
    out += fmt::format(
        "  spin               {} on S0 ahead of every secondary copy "
        "(run.spin_before_copy_us)\n",
        seconds(r.spin_before_copy_us * 1e-6));
  }
  if (m.hung) out += "  HANG: some ops never ran (mismatched collectives); times are partial\n";
  out += fmt::format("  step time          {}\n", seconds(m.step_time_s));
  out += fmt::format("  tokens/s/node      {:.1f}\n", m.tokens_per_s_per_node);
  out += fmt::format("  exposed comm       {} (compute stream idle, mean over ranks)\n",
                     seconds(m.exposed_comm_s));
  out += fmt::format("  host stall (fix A) {} (host blocked in the secondary-copy syncs)\n",
                     seconds(m.host_stall_s));
  // The header's "mean of N runs" is true of the times above; race instances are counted.
  out += fmt::format("  races manifested   {}{}\n", m.races_manifested,
                     r.runs.size() > 1 ? fmt::format(" (summed over {} runs)", r.runs.size()) : "");
  races(r, out);
  links(r, out);
  out += fmt::format(
      "  network: SimGrid {} (bandwidth factor {}, latency factor {}), {} collectives; "
      "{} transfers, {} execs\n",
      r.network_model, r.bandwidth_factor, r.latency_factor, r.collective_model, r.stats.transfers,
      r.stats.execs);
  if (r.by_class()) out += fmt::format("  simulated          {}\n", r.by_class_how);
  // The hardware every number above assumed (issue 35: sim never said).
  const ClusterConfig& c = r.cluster;
  out += fmt::format(
      "  cluster            {} nodes x {} GPUs ({}), {} x {:g} Gbit/s NIC per node, NVLink {:g} "
      "GB/s per GPU (--gpu, --nic-gbps, --nics-per-node, --nvlink-gbytes-per-s)\n",
      c.nodes, c.gpus_per_node, c.gpu.name, c.nics_per_node, c.nic_gbps, c.nvlink_gbytes_per_s);
  return out;
}

}  // namespace hpz::time
