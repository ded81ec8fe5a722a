#include "sim/time/engine.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u/Activity.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <stdexcept>
#include <unordered_map>

#include "sim/time/cost_model.hpp"
#include "sim/time/jitter.hpp"
#include "sim/time/platform.hpp"

namespace hpz::time {
namespace {

namespace s4u = simgrid::s4u;

constexpr std::int32_t kNone = -1;

/** A SimGrid activity in flight and what its completion means. */
struct Task {
  enum class Kind : std::uint8_t { kTimer, kRun, kSend } kind = Kind::kRun;
  Rank rank = 0;
  std::uint32_t op = 0;        ///< kTimer, kRun: the op
  std::uint32_t instance = 0;  ///< kSend: the collective instance
  std::int32_t from = 0;       ///< kSend: member index of the sender
  std::int32_t to = 0;         ///< kSend: member index of the receiver
  std::uint32_t slot = 0;      ///< index in the task pool
  s4u::ActivityPtr activity;
};

/** One collective: the k-th collective of every member of a group. */
struct Instance {
  GroupId group = kNoGroup;
  std::vector<std::uint32_t> ops;  ///< per member (Group::ranks order): that rank's op
  CollectivePlan plan;
  std::int32_t step = 0;  ///< training step, for per-step link bytes
  int arrived = 0;
  std::vector<int> sends_started, sends_done, recvs_done;
  std::vector<bool> finished;
};

/** Per-rank bookkeeping for dependency counting. */
struct RankState {
  std::vector<std::int32_t> stream_next;            ///< per op: the next op on its stream
  std::vector<std::uint8_t> deps;                   ///< per op: unmet dependencies
  std::vector<std::vector<std::uint32_t>> waiters;  ///< per event: the ops waiting on it
  std::vector<std::int32_t> instance;               ///< per op: collective instance
  std::vector<int> issued, done;                    ///< per stream: ops issued / finished
  std::size_t next = 0;                             ///< next op the host issues
  double host_time = 0;                             ///< when the host reaches `next`
  bool blocked = false;                             ///< the host waits on a sync
};

/** Host syncs run on the host thread; their `stream` names the stream they wait for. */
bool on_host(const Op& op) {
  return op.kind == OpKind::kHostStreamSync || op.kind == OpKind::kHostDeviceSync ||
         op.stream == kHostStream;
}

class Simulation {
 public:
  Simulation(const Scenario& sc, const Schedule& schedule, std::uint64_t seed,
             const Topology& topology, std::vector<s4u::Host*> hosts)
      : schedule_(schedule),
        cost_(sc),
        jitter_(seed, sc.sim.jitter),
        topology_(topology),
        hosts_(std::move(hosts)),
        model_(collective_model_of(sc)) {
    run_.timeline.seed = seed;
    run_.link_bytes.assign(static_cast<std::size_t>(sc.run.steps + 1),
                           std::vector<double>(topology.links().size(), 0.0));
    for (const RankSchedule& rs : schedule.ranks) prepare(rs);
  }

  void kick() {
    for (Rank r = 0; r < static_cast<Rank>(ranks_.size()); ++r) run_host(r);
    drain();
  }

  void on_complete(const s4u::Activity& activity) {
    retired_.clear();  // activities completed in earlier callbacks: safe to release now
    auto* task = activity.get_data<Task>();
    if (task == nullptr) return;
    const Task done = *task;
    retired_.push_back(std::move(task->activity));
    free_.push_back(task->slot);
    handle(done);
    drain();
  }

  EngineRun finish_run() {
    for (const auto& rank : run_.timeline.ranks) {
      for (const OpTime& t : rank) run_.stats.unfinished += t.end_s < 0 ? 1 : 0;
    }
    return std::move(run_);
  }

 private:
  void prepare(const RankSchedule& rs);
  void prepare_collective(const RankSchedule& rs, std::uint32_t i,
                          std::unordered_map<GroupId, std::uint32_t>& position);
  void run_host(Rank r);
  bool sync_satisfied(Rank r, const Op& op) const;
  void release(Rank r, std::uint32_t i);
  void drain();
  void ready(Rank r, std::uint32_t i);
  void begin(Rank r, std::uint32_t i);
  void finish(Rank r, std::uint32_t i);
  void arrive(Rank r, std::uint32_t i);
  void launch(std::uint32_t inst);
  void try_send(std::uint32_t inst, int member);
  void send(std::uint32_t inst, int from, int to, std::uint64_t bytes);
  void check_member(std::uint32_t inst, int member);
  void handle(const Task& task);
  Task& new_task(Task::Kind kind, Rank r);
  void after(Task::Kind kind, Rank r, std::uint32_t i, double seconds);

  const Schedule& schedule_;
  CostModel cost_;
  Jitter jitter_;
  const Topology& topology_;
  std::vector<s4u::Host*> hosts_;
  CollectiveModel model_;
  EngineRun run_;
  std::vector<RankState> ranks_;
  std::vector<Instance> instances_;
  std::unordered_map<std::uint64_t, std::uint32_t> instance_index_;
  std::vector<std::pair<Rank, std::uint32_t>> pending_;  ///< ops whose dependencies are met
  std::size_t pending_head_ = 0;
  std::deque<Task> tasks_;
  std::vector<std::uint32_t> free_;
  std::vector<s4u::ActivityPtr> retired_;
};

void Simulation::prepare(const RankSchedule& rs) {
  RankState st;
  const std::size_t n = rs.ops.size();
  st.stream_next.assign(n, kNone);
  st.deps.assign(n, 0);
  st.instance.assign(n, kNone);
  st.issued.assign(rs.streams.size(), 0);
  st.done.assign(rs.streams.size(), 0);
  std::vector<std::int32_t> last(rs.streams.size(), kNone);
  std::unordered_map<EventId, bool> recorded;
  std::unordered_map<GroupId, std::uint32_t> position;
  ranks_.push_back(std::move(st));
  RankState& s = ranks_.back();
  for (std::uint32_t i = 0; i < n; ++i) {
    const Op& op = rs.ops[i];
    if (on_host(op)) continue;
    s.deps[i] = 1;  // issued by the host
    auto& prev = last[static_cast<std::size_t>(op.stream)];
    if (prev != kNone) {
      s.stream_next[static_cast<std::size_t>(prev)] = static_cast<std::int32_t>(i);
      ++s.deps[i];
    }
    prev = static_cast<std::int32_t>(i);
    if (op.kind == OpKind::kEventRecord) recorded[op.event] = true;
    if (op.kind == OpKind::kStreamWaitEvent && recorded.count(op.event) != 0) {
      const auto e = static_cast<std::size_t>(op.event);
      if (s.waiters.size() <= e) s.waiters.resize(e + 1);
      s.waiters[e].push_back(i);
      ++s.deps[i];
    }
    if (is_collective(op.kind)) prepare_collective(rs, i, position);
  }
  run_.timeline.ranks.emplace_back(n, OpTime{-1, -1, -1});
}

void Simulation::prepare_collective(const RankSchedule& rs, std::uint32_t i,
                                    std::unordered_map<GroupId, std::uint32_t>& position) {
  const Op& op = rs.ops[i];
  const std::uint64_t key = (static_cast<std::uint64_t>(op.group) << 32) | position[op.group]++;
  const auto [it, fresh] =
      instance_index_.try_emplace(key, static_cast<std::uint32_t>(instances_.size()));
  const Group& g = schedule_.groups[static_cast<std::size_t>(op.group)];
  const int n = static_cast<int>(g.ranks.size());
  if (fresh) {
    Instance inst;
    inst.group = op.group;
    inst.ops.assign(static_cast<std::size_t>(n), 0);
    inst.plan = plan_collective(op.kind, op.comm_bytes, n, model_);
    inst.step = op.step;
    inst.sends_started.assign(static_cast<std::size_t>(n), 0);
    inst.sends_done = inst.recvs_done = inst.sends_started;
    inst.finished.assign(static_cast<std::size_t>(n), false);
    instances_.push_back(std::move(inst));
  }
  const auto member = std::lower_bound(g.ranks.begin(), g.ranks.end(), rs.rank) - g.ranks.begin();
  instances_[it->second].ops[static_cast<std::size_t>(member)] = i;
  ranks_.back().instance[i] = static_cast<std::int32_t>(it->second);
}

bool Simulation::sync_satisfied(Rank r, const Op& op) const {
  const RankState& s = ranks_[static_cast<std::size_t>(r)];
  if (op.kind == OpKind::kHostStreamSync) {
    if (op.stream == kHostStream) return true;
    const auto st = static_cast<std::size_t>(op.stream);
    return s.done[st] == s.issued[st];
  }
  return s.done == s.issued;
}

void Simulation::run_host(Rank r) {
  RankState& s = ranks_[static_cast<std::size_t>(r)];
  const RankSchedule& rs = schedule_.ranks[static_cast<std::size_t>(r)];
  auto& times = run_.timeline.ranks[static_cast<std::size_t>(r)];
  for (; s.next < rs.ops.size(); ++s.next) {
    const auto i = static_cast<std::uint32_t>(s.next);
    const Op& op = rs.ops[i];
    times[i].issue_s = s.host_time;
    if (on_host(op)) {
      times[i].start_s = s.host_time;
      if (!sync_satisfied(r, op)) {
        s.blocked = true;
        return;
      }
      times[i].end_s = s.host_time;
      continue;
    }
    s.host_time += cost_.launch_s() * jitter_.factor(r, i, 1);
    ++s.issued[static_cast<std::size_t>(op.stream)];
    release(r, i);
  }
}

void Simulation::release(Rank r, std::uint32_t i) {
  if (--ranks_[static_cast<std::size_t>(r)].deps[i] == 0) pending_.emplace_back(r, i);
}

void Simulation::drain() {
  while (pending_head_ < pending_.size()) {
    const auto [r, i] = pending_[pending_head_++];
    ready(r, i);
  }
  pending_.clear();
  pending_head_ = 0;
}

void Simulation::ready(Rank r, std::uint32_t i) {
  const double issue = run_.timeline.ranks[static_cast<std::size_t>(r)][i].issue_s;
  const double now = s4u::Engine::get_clock();
  if (issue > now) {
    after(Task::Kind::kTimer, r, i, issue - now);  // the host has not reached it yet
  } else {
    begin(r, i);
  }
}

void Simulation::begin(Rank r, std::uint32_t i) {
  const Op& op = schedule_.ranks[static_cast<std::size_t>(r)].ops[i];
  auto& t = run_.timeline.ranks[static_cast<std::size_t>(r)][i];
  t.start_s = s4u::Engine::get_clock();
  if (is_collective(op.kind)) return arrive(r, i);
  const double seconds = cost_.op_s(schedule_, r, op);
  if (seconds <= 0) return finish(r, i);
  after(Task::Kind::kRun, r, i, seconds * jitter_.factor(r, i, 0));
}

void Simulation::finish(Rank r, std::uint32_t i) {
  RankState& s = ranks_[static_cast<std::size_t>(r)];
  const RankSchedule& rs = schedule_.ranks[static_cast<std::size_t>(r)];
  const Op& op = rs.ops[i];
  const double now = s4u::Engine::get_clock();
  run_.timeline.ranks[static_cast<std::size_t>(r)][i].end_s = now;
  ++run_.stats.ops;
  ++s.done[static_cast<std::size_t>(op.stream)];
  if (s.stream_next[i] != kNone) release(r, static_cast<std::uint32_t>(s.stream_next[i]));
  const auto e = static_cast<std::size_t>(op.event);
  if (op.kind == OpKind::kEventRecord && op.event >= 0 && e < s.waiters.size()) {
    for (std::uint32_t w : s.waiters[e]) release(r, w);
  }
  if (s.blocked && sync_satisfied(r, rs.ops[s.next])) {
    auto& t = run_.timeline.ranks[static_cast<std::size_t>(r)][s.next];
    t.end_s = std::max(t.issue_s, now);
    s.host_time = t.end_s;
    s.blocked = false;
    ++s.next;
    run_host(r);
  }
}

void Simulation::arrive(Rank r, std::uint32_t i) {
  const auto inst = static_cast<std::uint32_t>(ranks_[static_cast<std::size_t>(r)].instance[i]);
  Instance& in = instances_[inst];
  const auto n = static_cast<int>(in.ops.size());
  if (++in.arrived == n) launch(inst);
}

void Simulation::launch(std::uint32_t inst) {
  Instance& in = instances_[inst];
  const Group& g = schedule_.groups[static_cast<std::size_t>(in.group)];
  const double now = s4u::Engine::get_clock();
  const auto n = static_cast<int>(in.ops.size());
  for (int m = 0; m < n; ++m) {
    const auto rank = static_cast<std::size_t>(g.ranks[static_cast<std::size_t>(m)]);
    run_.timeline.ranks[rank][in.ops[static_cast<std::size_t>(m)]].start_s = now;
  }
  for (int m = 0; m < n; ++m) {
    if (in.plan.all_to_all) {
      for (int k = 1; k < n; ++k) send(inst, m, (m + k) % n, in.plan.step_bytes);
      in.sends_started[static_cast<std::size_t>(m)] = n - 1;
    } else {
      try_send(inst, m);
    }
    check_member(inst, m);
  }
}

void Simulation::try_send(std::uint32_t inst, int m) {
  Instance& in = instances_[inst];
  const auto mu = static_cast<std::size_t>(m);
  const int s = in.sends_started[mu];
  // One step in flight per member; step s forwards what arrived in step s - 1.
  if (in.plan.all_to_all || s >= in.plan.steps || in.sends_done[mu] < s || in.recvs_done[mu] < s) {
    return;
  }
  ++in.sends_started[mu];
  send(inst, m, (m + 1) % static_cast<int>(in.ops.size()), in.plan.step_bytes);
}

void Simulation::send(std::uint32_t inst, int from, int to, std::uint64_t bytes) {
  const Instance& in = instances_[inst];
  const Group& g = schedule_.groups[static_cast<std::size_t>(in.group)];
  const Rank a = g.ranks[static_cast<std::size_t>(from)];
  const Rank b = g.ranks[static_cast<std::size_t>(to)];
  auto& per_link = run_.link_bytes[static_cast<std::size_t>(std::max(in.step + 1, 0))];
  for (LinkId id : topology_.route(a, b)) per_link[id] += static_cast<double>(bytes);
  Task& task = new_task(Task::Kind::kSend, a);
  task.instance = inst;
  task.from = from;
  task.to = to;
  s4u::CommPtr comm = s4u::Comm::sendto_init(hosts_[static_cast<std::size_t>(a)],
                                             hosts_[static_cast<std::size_t>(b)]);
  comm->set_payload_size(bytes);
  comm->set_data(&task);
  task.activity = comm;
  ++run_.stats.transfers;
  comm->start();
}

void Simulation::check_member(std::uint32_t inst, int m) {
  Instance& in = instances_[inst];
  const auto mu = static_cast<std::size_t>(m);
  if (in.finished[mu] || in.sends_done[mu] < in.plan.steps || in.recvs_done[mu] < in.plan.steps) {
    return;
  }
  in.finished[mu] = true;
  const Group& g = schedule_.groups[static_cast<std::size_t>(in.group)];
  finish(g.ranks[mu], in.ops[mu]);
}

void Simulation::handle(const Task& task) {
  switch (task.kind) {
    case Task::Kind::kTimer:
      return begin(task.rank, task.op);
    case Task::Kind::kRun:
      return finish(task.rank, task.op);
    case Task::Kind::kSend: {
      Instance& in = instances_[task.instance];
      ++in.sends_done[static_cast<std::size_t>(task.from)];
      ++in.recvs_done[static_cast<std::size_t>(task.to)];
      try_send(task.instance, task.from);
      try_send(task.instance, task.to);
      check_member(task.instance, task.from);
      check_member(task.instance, task.to);
      return;
    }
  }
}

Task& Simulation::new_task(Task::Kind kind, Rank r) {
  std::uint32_t slot = 0;
  if (free_.empty()) {
    slot = static_cast<std::uint32_t>(tasks_.size());
    tasks_.emplace_back();
  } else {
    slot = free_.back();
    free_.pop_back();
  }
  Task& task = tasks_[slot];
  task = Task{};
  task.kind = kind;
  task.rank = r;
  task.slot = slot;
  return task;
}

void Simulation::after(Task::Kind kind, Rank r, std::uint32_t i, double seconds) {
  // A kernel, copy or host-issue delay occupies nothing SimGrid shares (concurrent kernels do
  // not slow each other down), so it is a kernel timer, not an Exec: an Exec would add a
  // variable to the CPU model's max-min system, and SimGrid 3.32 files every Exec started from
  // maestro in maestro's activity list, which it scans linearly (std::list::remove) at each
  // completion, a cost that grows with the number of execs in flight, i.e. with the ranks.
  ++run_.stats.execs;
  simgrid::kernel::timer::Timer::set(s4u::Engine::get_clock() + seconds, [this, kind, r, i] {
    Task task;
    task.kind = kind;
    task.rank = r;
    task.op = i;
    handle(task);
    drain();
  });
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

std::vector<std::string> engine_args(const SimConfig& sim) {
  return {"hpzlab",
          "--log=root.thresh:critical",
          "--cfg=network/model:" + sim.network_model,
          fmt::format("--cfg=network/bandwidth-factor:{}", sim.bandwidth_factor),
          fmt::format("--cfg=network/latency-factor:{}", sim.latency_factor),
          "--cfg=network/TCP-gamma:1e15"};
}

}  // namespace

CollectiveModel collective_model_of(const Scenario& scenario) {
  return scenario.sim.collective_model == "coarse" ? CollectiveModel::kCoarse
                                                   : CollectiveModel::kFine;
}

EngineRun run_engine(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed) {
  static bool used = false;
  if (used) throw std::logic_error("SimGrid's engine runs once per process: use run_isolated()");
  used = true;
  const auto wall_start = std::chrono::steady_clock::now();
  static std::vector<std::string> args = engine_args(scenario.sim);
  static std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  s4u::Engine engine(&argc, argv.data());
  const Topology topology(scenario.cluster);
  Simulation sim(scenario, schedule, seed, topology, install(topology, used_pairs(schedule)));
  s4u::Activity::on_completion_cb([&sim](const s4u::Activity& a) { sim.on_complete(a); });
  sim.kick();
  engine.run();
  EngineRun run = sim.finish_run();
  run.stats.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  run.stats.peak_rss_bytes = peak_rss_bytes();
  return run;
}

}  // namespace hpz::time
