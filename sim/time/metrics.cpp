// Step time, throughput, exposed communication and host stalls, from Schedule + Timeline.
#include <algorithm>
#include <limits>

#include "sim/time/by_class.hpp"
#include "sim/time/simulate.hpp"

namespace hpz::time {
namespace {

/** The schedule's rank that row `row` of a timeline times: by class, a simulated rank. */
std::size_t rank_of_row(const NodeQuotient* quotient, std::size_t row) {
  return quotient == nullptr
             ? row
             : static_cast<std::size_t>(quotient->simulated_rank(static_cast<int>(row)));
}

/** When the last op of step k ended, over all ranks (k = -1: init). */
double step_end(const Schedule& schedule, const Timeline& timeline, std::int32_t k,
                const NodeQuotient* quotient) {
  double end = 0;
  for (std::size_t r = 0; r < timeline.ranks.size(); ++r) {
    const auto& ops = schedule.ranks[rank_of_row(quotient, r)].ops;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].step == k) end = std::max(end, timeline.ranks[r][i].end_s);
    }
  }
  return end;
}

bool occupies_compute(const Op& op) {
  return op.kind == OpKind::kKernel || op.kind == OpKind::kCopy || op.kind == OpKind::kQuantize ||
         op.kind == OpKind::kDequantize;
}

/** Seconds within [lo, hi) that rank r's compute streams ran compute ops: S0, and S_step where
 *  the script issues forward and backward from a stream of its own (run.step_stream = "side"),
 *  which waits on S0 and S0 on it, so the two never overlap. */
double compute_busy(const RankSchedule& rs, const std::vector<OpTime>& times, double lo,
                    double hi) {
  std::vector<bool> compute(rs.streams.size());
  for (std::size_t s = 0; s < rs.streams.size(); ++s) {
    compute[s] = rs.streams[s].name == "S0" || rs.streams[s].name == "S_step";
  }
  double busy = 0;
  for (std::size_t i = 0; i < rs.ops.size(); ++i) {
    const Op& op = rs.ops[i];
    const auto stream = static_cast<std::size_t>(op.stream);  // the host's -1: none
    if (op.stream < 0 || stream >= compute.size() || !compute[stream] || !occupies_compute(op) ||
        times[i].end_s < 0) {
      continue;
    }
    busy += std::max(0.0, std::min(hi, times[i].end_s) - std::max(lo, times[i].start_s));
  }
  return busy;
}

double host_blocked(const RankSchedule& rs, const std::vector<OpTime>& times, std::int32_t k,
                    bool fix_only) {
  double blocked = 0;
  for (std::size_t i = 0; i < rs.ops.size(); ++i) {
    const Op& op = rs.ops[i];
    if (!is_host_sync(op.kind) || op.step != k || times[i].end_s < 0) continue;
    if (fix_only && op.purpose != Purpose::kFixHostSync) continue;
    blocked += times[i].end_s - times[i].start_s;
  }
  return blocked;
}

}  // namespace

StepMetrics step_metrics(const TimingInputs& in, const Schedule& schedule, const Timeline& timeline,
                         const NodeQuotient* quotient) {
  StepMetrics m;
  const std::int32_t k = in.steps - 1;
  const double lo = step_end(schedule, timeline, k - 1, quotient);
  const double hi = step_end(schedule, timeline, k, quotient);
  m.step_time_s = hi - lo;
  const double tokens =
      static_cast<double>(in.seq_len) * in.micro_batch * in.grad_accum * in.cluster.gpus_per_node;
  m.tokens_per_s_per_node = m.step_time_s > 0 ? tokens / m.step_time_s : 0;
  // By class the timeline has the simulated ranks (node 0's, and one node's of every other kind
  // of node), whose means, each weighted by the nodes of its kind, are every rank's
  // (by_class.hpp). With one kind every weight is 1.
  const auto ranks =
      static_cast<double>(quotient != nullptr ? quotient->gpus_per_node : timeline.ranks.size());
  for (std::size_t r = 0; r < timeline.ranks.size(); ++r) {
    const RankSchedule& rs = schedule.ranks[rank_of_row(quotient, r)];
    const auto& times = timeline.ranks[r];
    const double weight = quotient == nullptr
                              ? 1.0
                              : static_cast<double>(quotient->stands_for(static_cast<int>(r))) /
                                    static_cast<double>(quotient->nodes);
    m.exposed_comm_s += (m.step_time_s - compute_busy(rs, times, lo, hi)) * weight / ranks;
    m.host_stall_s += host_blocked(rs, times, k, true) * weight / ranks;
    m.host_sync_s += host_blocked(rs, times, k, false) * weight / ranks;
    for (const OpTime& o : times) m.hung = m.hung || o.end_s < 0;
  }
  return m;
}

}  // namespace hpz::time
