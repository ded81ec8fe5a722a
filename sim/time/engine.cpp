#include "sim/time/engine.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
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

#include "sim/time/by_class.hpp"
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

/** A delay of op `op` of rank `rank` that ends at `at`; `kind` says what its end means. A
 *  kSend delay is a hop timed without SimGrid (Simulation::send): `op` is the collective
 *  instance, `rank` and `to` the sending and receiving members. */
struct Due {
  double at = 0;
  std::uint64_t seq = 0;  ///< ties at the same instant go in the order they were set
  Task::Kind kind = Task::Kind::kRun;
  Rank rank = 0;
  std::uint32_t op = 0;
  std::int32_t to = 0;
  /** The heap's order: std::push_heap keeps the greatest first, so "greater" is "earlier". */
  static bool later(const Due& x, const Due& y) {
    return x.at != y.at ? x.at > y.at : x.seq > y.seq;
  }
};

/** One collective: the k-th collective of every member of a group. */
struct Instance {
  GroupId group = kNoGroup;
  std::vector<std::uint32_t> ops;  ///< per member (Group::ranks order): that rank's op
  CollectivePlan plan;
  CollectiveModel model = CollectiveModel::kFine;  ///< the model `plan` is for
  std::int32_t step = 0;                           ///< training step, for per-step link bytes
  int members = 0;                                 ///< the group's size
  /** Members that send: all, or by class (by_class.hpp) those on the group's first node, the
   *  first `local` members; the others are those members moved, and receive what they do. */
  int local = 0;
  /** By class with kinds of node: the members on another kind's simulated node (a group that
   *  spans nodes). Each is member `driver` moved, so it ends when that one ends. */
  struct Echo {
    int driver = 0;
    std::int32_t index = 0;  ///< the simulated rank
    std::uint32_t op = 0;
  };
  std::vector<Echo> echoes;
  int arrived = 0;
  std::vector<int> sends_started, sends_done, recvs_done;
  std::vector<bool> finished;
};

/** What the engine needs of one op while it runs, packed so that handling an op touches one
 *  small record (and its OpTime) instead of the 72-byte Op and four parallel arrays: with 1,024
 *  ranks the per-op state is hundreds of MB, and the engine's cost is mostly cache misses. */
struct OpState {
  double run_s = 0;                  ///< CostModel::op_s(), before jitter
  std::int32_t stream_next = kNone;  ///< the next op on its stream
  std::int32_t instance = kNone;     ///< collectives: the collective instance
  std::int32_t waiter_row = kNone;   ///< event records with waiters: their row (RankState)
  std::uint8_t deps = 0;             ///< unmet dependencies
  StreamId stream = kHostStream;
  bool collective = false;
};

/** What a host sync waits for. */
struct HostWait {
  enum class Kind : std::uint8_t { kNothing, kStream, kAllStreams, kOp } kind = Kind::kNothing;
  std::uint32_t index = 0;  ///< kStream: the stream; kOp: the op (an event record) to end
};

/** Per-rank bookkeeping for dependency counting. */
struct RankState {
  std::vector<OpState> ops;
  /** The ops waiting on the record whose waiter_row is w: waiter_ops[waiter_begin[w] ..
   *  waiter_begin[w + 1]). */
  std::vector<std::uint32_t> waiter_begin, waiter_ops;
  /** Host event syncs: the event record each waits for (the latest one before it). */
  std::unordered_map<std::uint32_t, std::uint32_t> event_sync_record;
  std::size_t stream_base = 0;  ///< this rank's first entry in Simulation::in_flight_
  int outstanding = 0;          ///< ops issued and not finished, over all streams
  std::size_t next = 0;         ///< next op the host issues
  double host_time = 0;         ///< when the host reaches `next`
  HostWait blocked_on;          ///< what the host waits for in op `next` (kNothing: not blocked)
};

class Simulation {
 public:
  Simulation(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed,
             const Topology& topology, std::vector<s4u::Host*> hosts, const NodeQuotient* quotient)
      : schedule_(schedule),
        cost_(in),
        jitter_(seed, in.sim.jitter),
        topology_(topology),
        hosts_(std::move(hosts)),
        model_(collective_model_of(in)),
        bandwidth_factor_(in.sim.bandwidth_factor),
        latency_factor_(in.sim.latency_factor),
        quotient_(quotient) {
    run_.timeline.seed = seed;
    run_.link_bytes.assign(static_cast<std::size_t>(in.steps + 1),
                           std::vector<double>(topology.links().size(), 0.0));
    const std::size_t simulated = quotient_ != nullptr
                                      ? static_cast<std::size_t>(quotient_->simulated())
                                      : schedule.ranks.size();
    for (std::size_t r = 0; r < simulated; ++r) {
      prepare(schedule.ranks[static_cast<std::size_t>(rank_of(static_cast<Rank>(r)))]);
    }
  }

  /** Keeps `progress` (may be null) up to date from now on. */
  void report_to(EngineProgress* progress) {
    progress_ = progress;
    if (progress_ != nullptr) progress_->ops_total.store(stream_ops_, std::memory_order_relaxed);
  }

  void kick() {
    for (Rank r = 0; r < static_cast<Rank>(ranks_.size()); ++r) run_host(r);
    drain();
  }

  void on_complete(const s4u::Activity& activity) {
    retired_.clear();  // activities completed in earlier callbacks: safe to release now
    now_ = s4u::Engine::get_clock();
    auto* task = activity.get_data<Task>();
    if (task == nullptr) return;
    const Task done = *task;
    retired_.push_back(std::move(task->activity));
    free_.push_back(task->slot);
    handle(done);
    drain();
  }

  EngineRun finish_run() {
    if (progress_ != nullptr) progress_->ops_done.store(run_.stats.ops, std::memory_order_relaxed);
    for (const auto& rank : run_.timeline.ranks) {
      for (const OpTime& t : rank) run_.stats.unfinished += t.end_s < 0 ? 1 : 0;
    }
    return std::move(run_);
  }

 private:
  /** The schedule's rank that simulated rank `index` is (by class: a kind's node's). */
  Rank rank_of(Rank index) const {
    return quotient_ != nullptr ? quotient_->simulated_rank(index) : index;
  }
  /** The simulated rank that stands for schedule rank `r`. */
  Rank index_of(Rank r) const { return quotient_ != nullptr ? quotient_->index_of(r) : r; }
  void prepare(const RankSchedule& rs);
  void prepare_collective(const RankSchedule& rs, std::uint32_t i,
                          std::unordered_map<GroupId, std::uint32_t>& position);
  void run_host(Rank r);
  HostWait sync_target(const RankState& s, std::uint32_t i, const Op& op) const;
  bool drained(Rank r, const RankState& s, HostWait wait) const;
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
  void after(Task::Kind kind, Rank r, std::uint32_t i, double seconds, std::int32_t to = 0);
  double lone_transfer_s(const std::vector<LinkId>& route, std::uint64_t bytes) const;
  void arm();
  void on_due();

  const Schedule& schedule_;
  CostModel cost_;
  Jitter jitter_;
  const Topology& topology_;
  std::vector<s4u::Host*> hosts_;
  CollectiveModel model_;
  double bandwidth_factor_, latency_factor_;  ///< SimGrid's network factors (engine_args)
  const NodeQuotient* quotient_;  ///< by class: node 0 simulated for every node; null: all ranks
  EngineRun run_;
  std::vector<RankState> ranks_;
  /** Per rank and stream (RankState::stream_base + stream): ops issued and not finished. One
   *  dense array for all ranks, so that it stays in cache. */
  std::vector<int> in_flight_;
  std::vector<Instance> instances_;
  std::unordered_map<std::uint64_t, std::uint32_t> instance_index_;
  std::vector<std::pair<Rank, std::uint32_t>> pending_;  ///< ops whose dependencies are met
  std::size_t pending_head_ = 0;
  std::deque<Task> tasks_;
  std::vector<std::uint32_t> free_;
  std::vector<s4u::ActivityPtr> retired_;
  /** Delays in flight (kernels, copies, host issue), earliest first by (at, seq), and the one
   *  SimGrid timer that stands for the earliest. */
  std::vector<Due> due_;
  std::uint64_t due_seq_ = 0;
  simgrid::kernel::timer::Timer* armed_ = nullptr;
  EngineProgress* progress_ = nullptr;
  std::uint64_t stream_ops_ = 0;  ///< ops the engine times (all but host ops), all ranks
  /** SimGrid's clock, read once per callback (it does not move within one). */
  double now_ = 0;
  double armed_at_ = 0;
};

void Simulation::prepare(const RankSchedule& rs) {
  const std::size_t n = rs.ops.size();
  ranks_.emplace_back();
  RankState& s = ranks_.back();
  s.ops.resize(n);
  s.stream_base = in_flight_.size();
  in_flight_.resize(in_flight_.size() + rs.streams.size(), 0);
  std::vector<std::int32_t> last(rs.streams.size(), kNone);
  // A wait binds to the latest record of its event in issue order (CUDA's semantics); a wait
  // on an event never recorded before it waits for nothing.
  std::unordered_map<EventId, std::uint32_t> latest_record;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> record_waiter;  // (record op, wait op)
  std::unordered_map<GroupId, std::uint32_t> position;
  for (std::uint32_t i = 0; i < n; ++i) {
    const Op& op = rs.ops[i];
    if (op.kind == OpKind::kHostEventSync) {
      const auto rec = latest_record.find(op.event);
      if (rec != latest_record.end()) s.event_sync_record[i] = rec->second;
    }
    if (on_host(op)) continue;
    ++stream_ops_;
    OpState& o = s.ops[i];
    o.stream = op.stream;
    o.run_s = cost_.op_s(schedule_, rs.rank, op);
    o.deps = 1;  // issued by the host
    auto& prev = last[static_cast<std::size_t>(op.stream)];
    if (prev != kNone) {
      s.ops[static_cast<std::size_t>(prev)].stream_next = static_cast<std::int32_t>(i);
      ++o.deps;
    }
    prev = static_cast<std::int32_t>(i);
    if (op.kind == OpKind::kEventRecord) latest_record[op.event] = i;
    if (op.kind == OpKind::kStreamWaitEvent) {
      const auto rec = latest_record.find(op.event);
      if (rec != latest_record.end()) {
        record_waiter.emplace_back(rec->second, i);
        ++o.deps;
      }
    }
    if (is_collective(op.kind)) {
      o.collective = true;
      prepare_collective(rs, i, position);
    }
  }
  // Waiters in compressed rows, one row per record op that has any.
  std::stable_sort(record_waiter.begin(), record_waiter.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  s.waiter_begin.push_back(0);
  for (std::size_t k = 0; k < record_waiter.size(); ++k) {
    const std::uint32_t rec = record_waiter[k].first;
    if (k == 0 || record_waiter[k - 1].first != rec) {
      if (k != 0) s.waiter_begin.push_back(static_cast<std::uint32_t>(k));
      s.ops[rec].waiter_row = static_cast<std::int32_t>(s.waiter_begin.size() - 1);
    }
    s.waiter_ops.push_back(record_waiter[k].second);
  }
  s.waiter_begin.push_back(static_cast<std::uint32_t>(record_waiter.size()));
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
    inst.members = n;
    if (quotient_ == nullptr) {
      inst.local = n;
    } else {  // the members on the group's first node: node 0 for a group that spans nodes
      const int gpus = quotient_->gpus_per_node;
      const Rank past = (g.ranks.front() / gpus + 1) * gpus;
      inst.local = static_cast<int>(std::lower_bound(g.ranks.begin(), g.ranks.end(), past) -
                                    g.ranks.begin());
    }
    inst.ops.assign(static_cast<std::size_t>(inst.local), 0);
    // Init's collectives (step -1) run in the coarse model whatever sim.collective_model says:
    // no metric reports init's time, and the steps after it do not depend on how it was timed
    // (on every shipped scenario, both builders, the fine model's step times came out the same
    // to 1e-12 and the races that bite the same; docs/timing.md). DeepSpeed's init (zero.Init's
    // broadcasts, the re-gather of every parameter over the world) is most of what the fine
    // model sent: bench_time's 2 x 8 DeepSpeed case sends 345 k transfers instead of 844 k.
    inst.model = op.step < 0 ? CollectiveModel::kCoarse : model_;
    inst.plan = plan_collective(op.kind, op.comm_bytes, n, inst.model);
    inst.step = op.step;
    inst.sends_started.assign(static_cast<std::size_t>(inst.local), 0);
    inst.sends_done = inst.recvs_done = inst.sends_started;
    inst.finished.assign(static_cast<std::size_t>(inst.local), false);
    instances_.push_back(std::move(inst));
  }
  const auto member = std::lower_bound(g.ranks.begin(), g.ranks.end(), rs.rank) - g.ranks.begin();
  Instance& inst = instances_[it->second];
  if (member < inst.local) {
    inst.ops[static_cast<std::size_t>(member)] = i;
  } else {
    // Another kind's node in a group that spans nodes (the fold checked that it is the same on
    // every node): its member is the node-0 member of its local index moved.
    const Rank counterpart = rs.rank % quotient_->gpus_per_node;
    const auto driver =
        std::lower_bound(g.ranks.begin(), g.ranks.end(), counterpart) - g.ranks.begin();
    if (driver >= inst.local || g.ranks[static_cast<std::size_t>(driver)] != counterpart) {
      throw std::logic_error(fmt::format("by class: rank {}'s group {} has no node-0 member {}",
                                         rs.rank, g.name, counterpart));
    }
    inst.echoes.push_back(
        {static_cast<int>(driver), static_cast<std::int32_t>(ranks_.size() - 1), i});
  }
  ranks_.back().ops[i].instance = static_cast<std::int32_t>(it->second);
}

/** What host op i waits for: one stream (kHostStreamSync), the end of an event record
 *  (kHostEventSync), nothing (a stream sync naming the host, an event sync whose event was never
 *  recorded), or every stream of the rank (kHostDeviceSync and any other op on the host). */
HostWait Simulation::sync_target(const RankState& s, std::uint32_t i, const Op& op) const {
  using K = HostWait::Kind;
  if (op.kind == OpKind::kRecordStream) return {};  // allocator bookkeeping: nothing to wait for
  if (op.kind == OpKind::kHostStreamSync) {
    if (op.stream == kHostStream) return {};
    return {K::kStream, static_cast<std::uint32_t>(op.stream)};
  }
  if (op.kind == OpKind::kHostEventSync) {
    const auto rec = s.event_sync_record.find(i);
    return rec == s.event_sync_record.end() ? HostWait{} : HostWait{K::kOp, rec->second};
  }
  return {K::kAllStreams, 0};
}

bool Simulation::drained(Rank r, const RankState& s, HostWait wait) const {
  switch (wait.kind) {
    case HostWait::Kind::kNothing:
      return true;
    case HostWait::Kind::kAllStreams:
      return s.outstanding == 0;
    case HostWait::Kind::kStream:
      return in_flight_[s.stream_base + wait.index] == 0;
    case HostWait::Kind::kOp:
      return run_.timeline.ranks[static_cast<std::size_t>(r)][wait.index].end_s >= 0;
  }
  return true;
}

void Simulation::run_host(Rank r) {
  RankState& s = ranks_[static_cast<std::size_t>(r)];
  const RankSchedule& rs = schedule_.ranks[static_cast<std::size_t>(rank_of(r))];
  auto& times = run_.timeline.ranks[static_cast<std::size_t>(r)];
  for (; s.next < rs.ops.size(); ++s.next) {
    const auto i = static_cast<std::uint32_t>(s.next);
    const Op& op = rs.ops[i];
    times[i].issue_s = s.host_time;
    if (on_host(op)) {
      times[i].start_s = s.host_time;
      const HostWait wait = sync_target(s, i, op);
      if (!drained(r, s, wait)) {
        s.blocked_on = wait;
        return;
      }
      times[i].end_s = s.host_time;
      continue;
    }
    s.host_time += cost_.launch_s() * jitter_.factor(rank_of(r), i, 1);
    ++in_flight_[s.stream_base + static_cast<std::size_t>(op.stream)];
    ++s.outstanding;
    release(r, i);
  }
}

void Simulation::release(Rank r, std::uint32_t i) {
  if (--ranks_[static_cast<std::size_t>(r)].ops[i].deps == 0) pending_.emplace_back(r, i);
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
  const double now = now_;
  if (issue > now) {
    after(Task::Kind::kTimer, r, i, issue - now);  // the host has not reached it yet
  } else {
    begin(r, i);
  }
}

void Simulation::begin(Rank r, std::uint32_t i) {
  const OpState& o = ranks_[static_cast<std::size_t>(r)].ops[i];
  run_.timeline.ranks[static_cast<std::size_t>(r)][i].start_s = now_;
  if (o.collective) return arrive(r, i);
  const double seconds = o.run_s;
  if (seconds <= 0) return finish(r, i);
  after(Task::Kind::kRun, r, i, seconds * jitter_.factor(rank_of(r), i, 0));
}

void Simulation::finish(Rank r, std::uint32_t i) {
  RankState& s = ranks_[static_cast<std::size_t>(r)];
  const OpState& o = s.ops[i];
  const double now = now_;
  run_.timeline.ranks[static_cast<std::size_t>(r)][i].end_s = now;
  if ((++run_.stats.ops & 0xfff) == 0 && progress_ != nullptr) {
    progress_->ops_done.store(run_.stats.ops, std::memory_order_relaxed);
  }
  --in_flight_[s.stream_base + static_cast<std::size_t>(o.stream)];
  --s.outstanding;
  if (o.stream_next != kNone) release(r, static_cast<std::uint32_t>(o.stream_next));
  if (o.waiter_row != kNone) {
    const auto w = static_cast<std::size_t>(o.waiter_row);
    for (std::uint32_t k = s.waiter_begin[w]; k < s.waiter_begin[w + 1]; ++k) {
      release(r, s.waiter_ops[k]);
    }
  }
  if (s.blocked_on.kind != HostWait::Kind::kNothing && drained(r, s, s.blocked_on)) {
    auto& t = run_.timeline.ranks[static_cast<std::size_t>(r)][s.next];
    t.end_s = std::max(t.issue_s, now);
    s.host_time = t.end_s;
    s.blocked_on = {};
    ++s.next;
    run_host(r);
  }
}

void Simulation::arrive(Rank r, std::uint32_t i) {
  const auto inst = static_cast<std::uint32_t>(ranks_[static_cast<std::size_t>(r)].ops[i].instance);
  Instance& in = instances_[inst];
  // By class, the other nodes' members arrive when their kind's simulated node's do.
  if (++in.arrived == in.local + static_cast<int>(in.echoes.size())) launch(inst);
}

void Simulation::launch(std::uint32_t inst) {
  Instance& in = instances_[inst];
  const Group& g = schedule_.groups[static_cast<std::size_t>(in.group)];
  const double now = now_;
  const int n = in.members;
  for (int m = 0; m < in.local; ++m) {
    const auto rank = static_cast<std::size_t>(index_of(g.ranks[static_cast<std::size_t>(m)]));
    run_.timeline.ranks[rank][in.ops[static_cast<std::size_t>(m)]].start_s = now;
  }
  for (const Instance::Echo& e : in.echoes) {
    run_.timeline.ranks[static_cast<std::size_t>(e.index)][e.op].start_s = now;
  }
  for (int m = 0; m < in.local; ++m) {
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
  send(inst, m, (m + 1) % in.members, in.plan.step_bytes);
}

void Simulation::send(std::uint32_t inst, int from, int to, std::uint64_t bytes) {
  const Instance& in = instances_[inst];
  const Group& g = schedule_.groups[static_cast<std::size_t>(in.group)];
  const Rank a = g.ranks[static_cast<std::size_t>(from)];
  const Rank b = g.ranks[static_cast<std::size_t>(to)];
  auto& per_link = run_.link_bytes[static_cast<std::size_t>(std::max(in.step + 1, 0))];
  const std::vector<LinkId> route = topology_.route(a, b);
  // By class node 0's hops stand for every node's: other kinds' nodes issue its collectives
  // (by_class.cpp, collectives_alike), so their hops inside their node are not counted again.
  if (quotient_ == nullptr || a < quotient_->gpus_per_node) {
    for (LinkId id : route) {
      per_link[quotient_ != nullptr ? quotient_->fold(id) : id] += static_cast<double>(bytes);
    }
  }
  ++run_.stats.transfers;
  if (in.model == CollectiveModel::kCoarse && topology_.node_of(a) == topology_.node_of(b)) {
    // The coarse model (every collective's, or only init's: prepare_collective) times a hop
    // between two GPUs of one node as SimGrid would time it with nothing but its own collective
    // on its NVLink links (lone_transfer_s), without SimGrid. NVLink is hundreds of times faster
    // than a NIC (600 GB/s against 1.6 to 12.5 GB/s in the shipped scenarios), so the share of
    // it that concurrent flows would take moves such a hop's end by little, and its own share
    // does not slow the hops between nodes, which set a step's pace: on the shipped scenarios
    // the step time moved by at most 0.02% (docs/timing.md). As SimGrid comms these hops were
    // most of the simulation's cost at 1,024 GPUs: SimGrid 3.32 files every host-to-host comm in
    // maestro's activity list and takes it out with a std::list::remove over every comm in
    // flight, and 7 in 8 hops of a world collective, and every hop of an hpZ group's, are inside
    // a node. The fine model keeps SimGrid's sharing for every hop of the steps.
    return after(Task::Kind::kSend, from, inst, lone_transfer_s(route, bytes), to);
  }
  Task& task = new_task(Task::Kind::kSend, a);
  task.instance = inst;
  task.from = from;
  task.to = to;
  // By class, a transfer to another node arrives at the mirror of its receiver's node-0
  // counterpart, through node 0's links that stand for the receiver's (by_class.hpp).
  const int to_host = quotient_ != nullptr ? quotient_->receiver(b) : b;
  s4u::CommPtr comm = s4u::Comm::sendto_init(hosts_[static_cast<std::size_t>(a)],
                                             hosts_[static_cast<std::size_t>(to_host)]);
  comm->set_payload_size(bytes);
  comm->set_data(&task);
  task.activity = comm;
  ++run_.stats.simgrid_comms;
  comm->start();
}

/** What SimGrid's CM02 model gives a hop of a ring whose members all send at once, on links
 *  nothing else uses: the route's latency times the latency factor, then the bytes at the
 *  slowest link's bandwidth times the bandwidth factor (SimGrid 3.32 src/surf/network_cm02.cpp,
 *  comm_action_set_bounds; TCP-gamma is set out of the way in engine_args), shared with the
 *  ring neighbour's cross-traffic: each flow also loads its reverse route with weight 0.05
 *  (network_cm02.cpp:259, network/crosstraffic, on by default), and in a ring that reverse
 *  route is the outgoing link of the hop's sender and the incoming link of its receiver. */
double Simulation::lone_transfer_s(const std::vector<LinkId>& route, std::uint64_t bytes) const {
  double latency = 0, bandwidth = -1;
  for (LinkId id : route) {
    const LinkSpec& l = topology_.links()[id];
    latency += l.latency_s;
    if (bandwidth < 0 || l.bytes_per_s < bandwidth) bandwidth = l.bytes_per_s;
  }
  constexpr double kCrossTraffic = 0.05;
  return latency * latency_factor_ +
         static_cast<double>(bytes) * (1 + kCrossTraffic) / (bandwidth * bandwidth_factor_);
}

void Simulation::check_member(std::uint32_t inst, int m) {
  Instance& in = instances_[inst];
  const auto mu = static_cast<std::size_t>(m);
  if (in.finished[mu] || in.sends_done[mu] < in.plan.steps || in.recvs_done[mu] < in.plan.steps) {
    return;
  }
  in.finished[mu] = true;
  const Group& g = schedule_.groups[static_cast<std::size_t>(in.group)];
  finish(index_of(g.ranks[mu]), in.ops[mu]);
  // finish() only releases ops (run later, from drain()): `in` stays where it is.
  for (const Instance::Echo& e : in.echoes) {
    if (e.driver == m) finish(e.index, e.op);
  }
}

void Simulation::handle(const Task& task) {
  switch (task.kind) {
    case Task::Kind::kTimer:
      return begin(task.rank, task.op);
    case Task::Kind::kRun:
      return finish(task.rank, task.op);
    case Task::Kind::kSend: {
      Instance& in = instances_[task.instance];
      // By class, a receiver on another node is node 0's member `to % local` moved: what it
      // receives, that member receives from the sender moved back (by_class.hpp).
      const int to = task.to % in.local;
      ++in.sends_done[static_cast<std::size_t>(task.from)];
      ++in.recvs_done[static_cast<std::size_t>(to)];
      try_send(task.instance, task.from);
      try_send(task.instance, to);
      check_member(task.instance, task.from);
      check_member(task.instance, to);
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

void Simulation::after(Task::Kind kind, Rank r, std::uint32_t i, double seconds, std::int32_t to) {
  // A kernel, copy or host-issue delay occupies nothing SimGrid shares (concurrent kernels do
  // not slow each other down), so it is not an Exec: an Exec would add a variable to the CPU
  // model's max-min system, and SimGrid 3.32 files every Exec started from maestro in maestro's
  // activity list, which it scans linearly (std::list::remove) at each completion. Nor is each
  // one a SimGrid timer: those live in a Fibonacci heap of allocated nodes. They wait in this
  // engine's own binary heap, and one SimGrid timer stands for its earliest entry.
  if (kind != Task::Kind::kSend) ++run_.stats.execs;
  due_.push_back({now_ + seconds, due_seq_++, kind, r, i, to});
  std::push_heap(due_.begin(), due_.end(), Due::later);
  arm();
}

void Simulation::arm() {
  if (due_.empty()) return;
  const double at = due_.front().at;
  if (armed_ != nullptr) {
    if (armed_at_ <= at) return;
    armed_->remove();
  }
  armed_at_ = at;
  armed_ = simgrid::kernel::timer::Timer::set(at, [this] { on_due(); });
}

void Simulation::on_due() {
  armed_ = nullptr;
  const double now = now_ = s4u::Engine::get_clock();
  while (!due_.empty() && due_.front().at <= now) {
    std::pop_heap(due_.begin(), due_.end(), Due::later);
    const Due due = due_.back();
    due_.pop_back();
    Task task;
    task.kind = due.kind;
    task.rank = due.rank;
    task.op = due.op;
    if (due.kind == Task::Kind::kSend) {  // a hop timed without SimGrid (send)
      task.instance = due.op;
      task.from = due.rank;
      task.to = due.to;
    }
    handle(task);
    drain();
  }
  arm();
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

CollectiveModel collective_model_of(const TimingInputs& in) {
  return in.sim.collective_model == "coarse" ? CollectiveModel::kCoarse : CollectiveModel::kFine;
}

EngineRun run_engine(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed,
                     EngineProgress* progress, const NodeQuotient* quotient) {
  static bool used = false;
  if (used) throw std::logic_error("SimGrid's engine runs once per process: use run_isolated()");
  used = true;
  const auto wall_start = std::chrono::steady_clock::now();
  static std::vector<std::string> args = engine_args(in.sim);
  static std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  s4u::Engine engine(&argc, argv.data());
  const Topology topology(in.cluster);
  Simulation sim(in, schedule, seed, topology,
                 quotient != nullptr ? install_quotient(topology, *quotient)
                                     : install(topology, used_pairs(schedule)),
                 quotient);
  sim.report_to(progress);
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
