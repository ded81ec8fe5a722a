#include "real/executor.hpp"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "real/elements.hpp"

namespace hpz::real {

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

namespace {

struct ElementDiff {
  std::uint64_t differ = 0;  ///< elements of `a` whose bits differ from `b`'s
  std::uint64_t nans = 0;    ///< NaN elements of `a`
};

/** Compares n elements of T (uint16_t: fp16, uint32_t: fp32) bit for bit and counts NaNs in
 *  `a`, in one branch-free pass the compiler vectorizes (weights run to gigabytes). */
template <typename T>
ElementDiff diff_elements(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n) {
  ElementDiff d;
  for (std::uint64_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    d.differ += x != y ? 1 : 0;
    d.nans += is_nan_bits(x) ? 1 : 0;
  }
  return d;
}

/** (rank, op) of every gather probe, in the order of their indices. */
std::vector<std::pair<Rank, std::uint32_t>> probe_sites(const Plan& plan) {
  std::vector<std::pair<Rank, std::uint32_t>> out;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    for (std::uint32_t i = 0; i < plan.ranks[r].ops.size(); ++i) {
      if (plan.ranks[r].ops[i].is_gather_probe) out.emplace_back(static_cast<Rank>(r), i);
    }
  }
  return out;
}

/** The host side of every collective: members post their markers and wait, with a deadline,
 *  until every member has posted. Phase 0 is arrival, phase 1 is "my part is done". */
class Rendezvous {
 public:
  Rendezvous(const Plan& plan, double timeout_s) : plan_(plan), timeout_s_(timeout_s) {
    slots_.resize(plan.instances.size());
  }

  std::vector<Mark> meet(std::size_t instance, std::size_t member, int phase, Mark m) {
    const Instance& inst = plan_.instances[instance];
    std::unique_lock lock(mu_);
    Slot& s = slots_[instance];
    auto& marks = s.marks[phase];
    if (marks.empty()) {
      marks.resize(inst.members.size());
      s.posted[phase].assign(inst.members.size(), false);
    }
    marks[member] = m;
    s.posted[phase][member] = true;
    ++s.count[phase];
    cv_.notify_all();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    const std::size_t want = inst.group_ranks.size();
    while (s.count[phase] < want) {
      if (!abort_.empty()) throw HangError(abort_);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && s.count[phase] < want) {
        abort_ = describe(instance, phase);
        cv_.notify_all();
        throw HangError(abort_);
      }
    }
    return marks;
  }

  /** Makes every waiting member give up (another rank failed). */
  void abort(const std::string& why) {
    std::lock_guard lock(mu_);
    if (abort_.empty()) abort_ = why;
    cv_.notify_all();
  }

 private:
  struct Slot {
    std::vector<Mark> marks[2];
    std::vector<bool> posted[2];
    std::size_t count[2] = {0, 0};
  };

  std::string describe(std::size_t instance, int phase) const {
    const Instance& inst = plan_.instances[instance];
    const Slot& s = slots_[instance];
    std::string missing;
    for (Rank g : inst.group_ranks) {
      bool here = false;
      for (std::size_t k = 0; k < inst.members.size(); ++k) {
        here = here || (inst.members[k].first == g && s.posted[phase][k]);
      }
      if (!here) missing += fmt::format("{}{}", missing.empty() ? "" : ",", g);
    }
    return fmt::format(
        "HANG: a collective on group {} waited {:g} s and only {} of its {} ranks arrived "
        "(missing ranks: {})",
        inst.group, timeout_s_, s.count[phase], inst.group_ranks.size(), missing);
  }

  const Plan& plan_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::string abort_;
};

class RankThread {
 public:
  RankThread(const Schedule& s, const Plan& p, Backend& b, Rendezvous& rv,
             const std::vector<std::int64_t>& probe_index, const ExecOptions& o, double origin,
             Rank r, Timeline& t)
      : s_(s),
        p_(p),
        b_(b),
        rv_(rv),
        probe_index_(probe_index),
        o_(o),
        origin_(origin),
        r_(r),
        t_(t) {}

  void run() {
    b_.bind_thread(r_);
    const RankSchedule& rs = s_.ranks[r_];
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      OpTime& ot = t_.ranks[r_][i];
      ot.issue_s = now_s() - origin_;
      ot.start_s = ot.end_s = ot.issue_s;
      issue(op, i, ot);
      if (o_.serialize && op.stream != kHostStream && is_stream_work(op.kind)) {
        b_.host_sync(r_, op.stream, o_.timeout_s);
      }
    }
  }

 private:
  static bool is_stream_work(OpKind k) {
    return k != OpKind::kAlloc && k != OpKind::kFree && k != OpKind::kRecordStream &&
           !is_host_sync(k);
  }

  void issue(const Op& op, std::uint32_t i, OpTime& ot) {
    const PlanOp& po = p_.ranks[r_].ops[i];
    switch (op.kind) {
      case OpKind::kAlloc:
        return b_.alloc(r_, op.stream, po.alloc_slot, static_cast<Fill>(op.fill));
      case OpKind::kFree:
        return b_.free(r_, op.stream, po.alloc_slot);
      case OpKind::kEventRecord:
        return b_.record_event(r_, op.stream, op.event);
      case OpKind::kStreamWaitEvent:
        return b_.wait_event(r_, op.stream, op.event);
      case OpKind::kHostStreamSync:
      case OpKind::kHostDeviceSync:
        b_.host_sync(r_, op.kind == OpKind::kHostDeviceSync ? kHostStream : op.stream,
                     o_.timeout_s);
        ot.end_s = now_s() - origin_;
        return;
      case OpKind::kHostEventSync:
        b_.host_event_sync(r_, op.event, o_.timeout_s);
        ot.end_s = now_s() - origin_;
        return;
      case OpKind::kRecordStream:
        // The executor's slots outlive every stream's use (cuda_backend.cpp frees a slot only
        // when every stream has passed the free), which is what record_stream asks for.
        return;
      case OpKind::kKernel:
      case OpKind::kQuantize:
      case OpKind::kDequantize:
      case OpKind::kCopy:
        b_.op_begin(r_, op.stream, i);
        if (!po.models.empty()) {
          // A model kernel's actions gather its inputs (the optimizer step's reduced gradient
          // on DeepSpeed's schedules): before it, on its stream.
          b_.run_actions(r_, op.stream, po.actions);
          for (const ModelOp& m : po.models) b_.model(r_, op.stream, m);
        } else {
          if (o_.real_compute && po.gemm) {
            b_.gemm(r_, op.stream, *po.gemm);
          } else if (po.spin_s > 0) {
            b_.spin(r_, op.stream, po.spin_s);
          }
          b_.run_actions(r_, op.stream, po.actions);
        }
        b_.op_end(r_, op.stream, i);
        return;
      default:
        return collective(op, i, po);
    }
  }

  void collective(const Op& op, std::uint32_t i, const PlanOp& po) {
    // What this member prepares before it joins (its packed send), in stream order: done when
    // the others read it, emulated (the mark they wait for is taken after it) or through NCCL.
    b_.run_actions(r_, op.stream, po.pre_actions);
    if (b_.native_collectives()) {
      b_.op_begin(r_, op.stream, i);
      b_.collective(r_, op.stream, op.group, po);
      probe(op, i, po);
      return b_.op_end(r_, op.stream, i);
    }
    const auto inst = static_cast<std::size_t>(po.instance);
    const auto member = static_cast<std::size_t>(po.member);
    const std::vector<Mark> arrived = rv_.meet(inst, member, 0, b_.mark(r_, op.stream));
    for (std::size_t k = 0; k < arrived.size(); ++k) {
      if (k != member) b_.wait_mark(r_, op.stream, arrived[k]);
    }
    b_.op_begin(r_, op.stream, i);
    b_.run_actions(r_, op.stream, po.actions);
    probe(op, i, po);
    const std::vector<Mark> done = rv_.meet(inst, member, 1, b_.mark(r_, op.stream));
    for (std::size_t k = 0; k < done.size(); ++k) {
      if (k != member) b_.wait_mark(r_, op.stream, done[k]);
    }
    b_.run_actions(r_, op.stream, po.post_actions);
    b_.op_end(r_, op.stream, i);
  }

  void probe(const Op& op, std::uint32_t i, const PlanOp& po) {
    if (po.is_gather_probe) {
      b_.probe(r_, op.stream, static_cast<std::uint64_t>(probe_index_[i]), po.probe, po.probe_n);
    }
  }

  const Schedule& s_;
  const Plan& p_;
  Backend& b_;
  Rendezvous& rv_;
  const std::vector<std::int64_t>& probe_index_;
  const ExecOptions& o_;
  double origin_;
  Rank r_;
  Timeline& t_;
};

}  // namespace

RunOutput execute(const Schedule& schedule, const Plan& plan, Backend& backend,
                  const ExecOptions& options) {
  RunOutput out;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  out.timeline.ranks.resize(schedule.ranks.size());
  for (std::size_t r = 0; r < schedule.ranks.size(); ++r) {
    out.timeline.ranks[r].assign(schedule.ranks[r].ops.size(), {nan, nan, nan});
  }
  std::vector<std::vector<std::int64_t>> probe_index(plan.ranks.size());
  std::int64_t next = 0;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    probe_index[r].assign(plan.ranks[r].ops.size(), -1);
    for (std::size_t i = 0; i < plan.ranks[r].ops.size(); ++i) {
      if (plan.ranks[r].ops[i].is_gather_probe) probe_index[r][i] = next++;
    }
  }
  backend.begin_run(schedule, plan);
  Rendezvous rv(plan, options.timeout_s);
  if (options.before_start) {
    try {
      options.before_start();
    } catch (const HangError& e) {
      out.hung = true;
      out.hang = e.what();
      return out;
    }
  }
  const double origin = now_s();
  std::mutex mu;
  std::exception_ptr failure;
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < schedule.ranks.size(); ++r) {
    if (options.only_rank >= 0 && static_cast<std::size_t>(options.only_rank) != r) continue;
    threads.emplace_back([&, r] {
      try {
        RankThread(schedule, plan, backend, rv, probe_index[r], options, origin,
                   static_cast<Rank>(r), out.timeline)
            .run();
      } catch (const HangError& e) {
        rv.abort(e.what());
        std::lock_guard lock(mu);
        if (!out.hung) out.hang = e.what();
        out.hung = true;
      } catch (...) {
        rv.abort("another rank failed");
        std::lock_guard lock(mu);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  try {
    backend.end_run(options.timeout_s, origin, out.timeline, out.probes, out.weights);
    if (plan.model) {
      for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
        out.losses.push_back(backend.losses(static_cast<Rank>(r)));
      }
    }
  } catch (const HangError& e) {
    out.hung = true;
    if (out.hang.empty()) out.hang = e.what();
  }
  return out;
}

Corruption compare_runs(const Plan& plan, const RunOutput& reference, const RunOutput& run) {
  Corruption c;
  const int eb = plan.element_bytes;
  for (std::size_t r = 0; r < run.weights.size() && r < reference.weights.size(); ++r) {
    for (std::size_t u = 0; u < run.weights[r].size() && u < reference.weights[r].size(); ++u) {
      const auto& a = run.weights[r][u];
      const auto& b = reference.weights[r][u];
      const std::uint64_t n = std::min(a.size(), b.size()) / static_cast<std::size_t>(eb);
      const ElementDiff d = eb == 2 ? diff_elements<std::uint16_t>(a.data(), b.data(), n)
                                    : diff_elements<std::uint32_t>(a.data(), b.data(), n);
      c.corrupted_elements += d.differ;
      c.nan_elements += d.nans;
    }
  }
  const auto sites = probe_sites(plan);
  for (std::size_t k = 0; k < run.probes.size() && k < reference.probes.size(); ++k) {
    c.probe_nans += run.probes[k].nans;
    if (run.probes[k] == reference.probes[k]) continue;
    ++c.bad_probes;
    const auto [r, i] = sites[k];
    const double start = run.timeline.ranks[r][i].start_s;
    if (!c.has_first || start < c.first_start_s) {
      c.has_first = true;
      c.first_rank = r;
      c.first_op = i;
      c.first_start_s = start;
    }
  }
  return c;
}

}  // namespace hpz::real
