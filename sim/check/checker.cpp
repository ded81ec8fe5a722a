#include "sim/check/checker.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>

#include "sim/check/checker_impl.hpp"

namespace hpz::check {
namespace detail {
namespace {

int max_threads(const Schedule& s) {
  std::size_t streams = 0;
  for (const auto& r : s.ranks) streams = std::max(streams, r.streams.size());
  if (streams + 1 > static_cast<std::size_t>(kMaxThreads)) {
    throw std::invalid_argument(fmt::format(
        "race checker: a rank has {} streams, at most {} supported", streams, kMaxThreads - 1));
  }
  return static_cast<int>(streams) + 1;
}

}  // namespace

Checker::Checker(const Schedule& schedule, const Ablation& ablation, const RankClasses* classes,
                 const SymmetricWorld* world)
    : schedule_(schedule),
      ablation_(ablation),
      arena_(static_cast<int>(schedule.ranks.size()), max_threads(schedule)),
      log_(schedule),
      ranks_(schedule.ranks.size()),
      group_reported_(schedule.groups.size(), false) {
  if (classes != nullptr && !classes->per_rank() && !ablation.leave_out) {
    classes_ = classes;
    world_ = world;
    deferred_ = std::make_unique<ClassFindings>(schedule, *classes);
  }
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    RankState& rs = ranks_[r];
    const RankSchedule& sched = schedule.ranks[r];
    if (sched.rank != static_cast<Rank>(r)) {
      throw std::invalid_argument(
          fmt::format("malformed schedule: ranks[{}].rank is {}", r, sched.rank));
    }
    rs.schedule = &sched;
    // A rank its representative stands for keeps no bytes, versions or allocator; in a
    // symmetric world it does not walk at all.
    if (classes_ != nullptr) {
      const RankClass& c = classes_->classes[static_cast<std::size_t>(classes_->class_of[r])];
      rs.checks_bytes = c.representative == static_cast<Rank>(r);
      rs.notes_clock = world_ == nullptr && c.ranks.size() > 1;
      rs.alike = static_cast<std::uint32_t>(c.ranks.size());
      if (world_ != nullptr && !rs.checks_bytes) continue;
    }
    init_rank(rs, sched);
  }
}

void Checker::init_rank(RankState& rs, const RankSchedule& sched) {
  // Tick 1 for every own thread: tick 0 means "nothing known" in a clock.
  rs.host.own[0] = 1;
  rs.streams.assign(sched.streams.size(), Clock{RankTicks{}, rs.host.remote});
  for (std::size_t s = 0; s < sched.streams.size(); ++s) rs.streams[s].own[1 + s] = 1;
  rs.stream_gen.assign(sched.streams.size(), 0);
  rs.pending.assign(sched.streams.size(), kNotPending);
  rs.group_seq.assign(schedule_.groups.size(), 0);
  rs.group_last_op.assign(schedule_.groups.size(), kNoOp);
  waits_of(rs);
  if (!rs.checks_bytes) return;
  rs.buffers.resize(sched.buffers.size());
  if (schedule_.allocator) rs.blocks.resize(sched.buffers.size());
  // A unit's first data (whatever init writes) is version 1; 0 means "holds no data", so
  // a secondary copied from the freshly initialized parameter before its primary is written
  // (DeepSpeed 0.13.1 partitions the secondary first) is tracked like any other copy.
  rs.unit_version.assign(schedule_.units.size(), 1);
  rs.unit_writer.assign(schedule_.units.size(), kNoOp);
}

// How many ops wait for each event of the rank, so that a snapshot lives until its last wait.
void Checker::waits_of(RankState& rs) {
  std::vector<EventId> waited;
  for (const Op& op : rs.schedule->ops) {
    if (op.kind == OpKind::kStreamWaitEvent || op.kind == OpKind::kHostEventSync)
      waited.push_back(op.event);
  }
  std::sort(waited.begin(), waited.end());
  for (const EventId e : waited) {
    if (rs.waits.empty() || rs.waits.back().first != e) rs.waits.emplace_back(e, 0);
    ++rs.waits.back().second;
  }
  rs.waits.shrink_to_fit();
}

void Checker::malformed(const RankState& rs, std::uint32_t index, const std::string& what) const {
  throw std::invalid_argument(
      fmt::format("malformed schedule: rank {} op #{}: {}", rs.schedule->rank, index, what));
}

CheckResult Checker::run() {
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    if (world_ == nullptr || ranks_[r].checks_bytes) ready_.push_back(static_cast<Rank>(r));
  }
  while (true) {
    while (!ready_.empty()) {
      const Rank r = ready_.front();
      ready_.pop_front();
      advance(ranks_[r]);
    }
    if (instances_.empty()) break;
    // Nobody can move: every incomplete collective is a hang. Report, then let the ranks that
    // arrived go on so the rest of the schedule is still checked.
    const bool anyone_blocked =
        std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& rs) { return rs.blocked; });
    if (!anyone_blocked) {
      force_all();  // every rank finished, but some collectives were issued by part of a group
      break;
    }
    force_all();
  }
  if (world_ != nullptr) {
    classes_held_ = finish_symmetric();
  } else if (classes_) {
    classes_held_ = finish_classes();
  }
  CheckResult result;
  result.scenario = schedule_.scenario;
  result.variant = schedule_.variant;
  result.source = schedule_.source;
  result.world_size = schedule_.world_size;
  result.allocator = schedule_.allocator;
  result.groups = log_.take();
  stats_.clock_bases = arena_.base_count();
  result.stats = stats_;
  return result;
}

void Checker::advance(RankState& rs) {
  const auto n = static_cast<std::uint32_t>(rs.schedule->ops.size());
  const std::uint32_t from = rs.next;
  const std::size_t found = deferred_ ? deferred_->count(rs.schedule->rank) : 0;
  while (rs.next < n) {
    if (!step(rs, rs.next)) {
      rs.blocked = true;
      break;
    }
    ++rs.next;
    ++stats_.ops;
  }
  rs.done = rs.next == n;
  if (classes_ && rs.next > from && run_may_find(rs, from, found)) {
    runs_.push_back({rs.schedule->rank, rs.next});
  }
}

// Only runs with findings need to be kept for the replay: a representative's when it found
// something in it; another rank's unless its representative is past the run and found nothing
// in those ops (most runs: the representative, the lowest rank, mostly leads).
bool Checker::run_may_find(const RankState& rs, std::uint32_t from, std::size_t found) const {
  const Rank r = rs.schedule->rank;
  if (rs.checks_bytes) return deferred_->count(r) > found;
  const Rank rep =
      classes_->classes[static_cast<std::size_t>(classes_->class_of[r])].representative;
  if (ranks_[static_cast<std::size_t>(rep)].next < rs.next) return true;
  return deferred_->any_in(r, from, rs.next);
}

void Checker::absorb_host(RankState& rs, StreamId s) {
  if (rs.stream_gen[s] == rs.host_gen) return;
  arena_.join(rs.streams[s], rs.host);
  rs.stream_gen[s] = rs.host_gen;
}

// By class, a rank its representative stands for walks only happens-before: its byte checks
// are the representative's, which hold for it when it saw the same clocks at every one of them
// (finish_classes compares the hashes).
void Checker::touch_bytes(RankState& rs, std::uint32_t index, const Op& op, const Clock& clock,
                          int thread) {
  if (rs.notes_clock && op.access_count > 0) note_clock(rs, index, clock.own);
  if (!rs.checks_bytes) {
    stats_.accesses += op.access_count;
    return;
  }
  if (world_ != nullptr) stats_.accesses += std::uint64_t{op.access_count} * (rs.alike - 1);
  check_accesses(rs, index, op, clock, thread);
  track_versions(rs, index, op);
}

void Checker::note_clock(RankState& rs, std::uint32_t index, const RankTicks& own) const {
  // Two independent 64-bit hashes of the sequence of (op, every own tick): a polynomial of the
  // op's values each, then splitmix64's finalizer into the running hash.
  constexpr std::array<std::uint64_t, 2> kBase = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full};
  for (std::size_t i = 0; i < kBase.size(); ++i) {
    std::uint64_t v = index;
    for (int t = 0; t < arena_.threads(); ++t) v = v * kBase[i] + own[t];
    std::uint64_t h = (rs.clock_hash[i] ^ v) + kBase[i];
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    rs.clock_hash[i] = h ^ (h >> 31);
  }
}

// In a symmetric world every rank's clocks are its representative's (symmetric_world.hpp), and
// every rank walks to the end: no collective waits forever where all ranks issue one op list.
bool Checker::finish_symmetric() {
  stats_.ops = 0;
  for (const RankSchedule& r : schedule_.ranks) stats_.ops += r.ops.size();
  stats_.collectives = world_->instances;
  for (const RankClass& c : classes_->classes) {
    const RankState& rep = ranks_[static_cast<std::size_t>(c.representative)];
    stats_.same_data_rewrites += rep.same_data * (c.ranks.size() - 1);
  }
  if (deferred_->empty()) return true;
  const std::optional<std::vector<RankRun>> runs =
      walk_runs(schedule_, [this](Rank r, std::uint32_t from, std::uint32_t to) {
        return deferred_->any_in(r, from, to);
      });
  if (!runs) return false;
  deferred_->replay(*runs, log_);
  return true;
}

// Every rank of a class saw its representative's clocks: the representative's findings are
// its own, at its own offsets, logged in the order the ranks walked their ops (runs_), as the
// check rank by rank logs them.
bool Checker::finish_classes() {
  for (const RankClass& c : classes_->classes) {
    const RankState& rep = ranks_[static_cast<std::size_t>(c.representative)];
    for (const Rank r : c.ranks) {
      if (ranks_[static_cast<std::size_t>(r)].clock_hash != rep.clock_hash) return false;
    }
    stats_.same_data_rewrites += rep.same_data * (c.ranks.size() - 1);
  }
  deferred_->replay(runs_, log_);
  return true;
}

bool Checker::left_out(RankState& rs, std::uint32_t index, const Op& op) {
  if (!ablation_.leave_out || !is_ordering(op.kind) ||
      !ablation_.leave_out(rs.schedule->rank, index, op)) {
    return false;
  }
  // As if never issued; an event it waited for is kept only for its other waits.
  if (op.kind == OpKind::kStreamWaitEvent || op.kind == OpKind::kHostEventSync) {
    const auto it = rs.events.find(op.event);
    if (it != rs.events.end() && --it->second.waits_left == 0) rs.events.erase(it);
  }
  return true;
}

void Checker::host_stream_sync(RankState& rs, std::uint32_t index, const Op& op) {
  if (op.stream == kHostStream) malformed(rs, index, "host stream sync names no stream");
  Clock& s = rs.streams[op.stream];
  absorb_host(rs, op.stream);
  arena_.join(rs.host, s);
  ++s.own[thread_of(op.stream)];
  ++rs.host.own[0];
  ++rs.host_gen;
}

bool Checker::host_device_sync(RankState& rs) {
  const auto nstreams = static_cast<StreamId>(rs.streams.size());
  for (StreamId s = 0; s < nstreams; ++s) {
    if (rs.pending[s] != kNotPending) return false;
  }
  for (StreamId s = 0; s < nstreams; ++s) {
    absorb_host(rs, s);
    arena_.join(rs.host, rs.streams[s]);
    ++rs.streams[s].own[thread_of(s)];
  }
  ++rs.host.own[0];
  ++rs.host_gen;
  return true;
}

void Checker::record_event(RankState& rs, std::uint32_t index, const Op& op) {
  if (op.stream == kHostStream) malformed(rs, index, "event recorded on the host");
  absorb_host(rs, op.stream);
  Clock& s = rs.streams[op.stream];
  const auto waits = std::lower_bound(rs.waits.begin(), rs.waits.end(),
                                      std::make_pair(op.event, std::uint32_t{0}));
  if (waits != rs.waits.end() && waits->first == op.event && waits->second > 0) {
    rs.events[op.event] = EventSnapshot{s, waits->second};
  }
  ++s.own[thread_of(op.stream)];
}

void Checker::run_work(RankState& rs, std::uint32_t index, const Op& op) {
  if (is_collective(op.kind)) {
    if (op.stream == kHostStream) malformed(rs, index, "collective on the host");
    absorb_host(rs, op.stream);
    touch_bytes(rs, index, op, rs.streams[op.stream], thread_of(op.stream));
    arrive(rs, index, op);
    return;
  }
  if (op.stream == kHostStream) {
    touch_bytes(rs, index, op, rs.host, 0);
    if (op.access_count > 0) {
      ++rs.host.own[0];
      ++rs.host_gen;
    }
    return;
  }
  absorb_host(rs, op.stream);
  touch_bytes(rs, index, op, rs.streams[op.stream], thread_of(op.stream));
}

bool Checker::step(RankState& rs, std::uint32_t index) {
  const Op& op = rs.schedule->ops[index];
  if (op.stream != kHostStream) {
    if (op.stream < 0 || op.stream >= static_cast<StreamId>(rs.streams.size())) {
      malformed(rs, index, "no such stream");
    }
    // FIFO: nothing more happens on a stream whose collective still waits for its peers.
    if (rs.pending[op.stream] != kNotPending) return false;
  }
  if (left_out(rs, index, op)) return true;
  switch (op.kind) {
    case OpKind::kHostStreamSync:
      host_stream_sync(rs, index, op);
      return true;
    case OpKind::kHostDeviceSync:
      return host_device_sync(rs);
    case OpKind::kEventRecord:
      record_event(rs, index, op);
      return true;
    case OpKind::kStreamWaitEvent: {
      if (op.stream == kHostStream) malformed(rs, index, "event waited on the host");
      absorb_host(rs, op.stream);
      wait_for_event(rs, index, op, rs.streams[op.stream]);
      return true;
    }
    case OpKind::kHostEventSync:
      wait_for_event(rs, index, op, rs.host);
      ++rs.host.own[0];
      ++rs.host_gen;
      return true;
    case OpKind::kAlloc:
    case OpKind::kFree:
      if (op.stream != kHostStream) absorb_host(rs, op.stream);
      // The allocator's reuse asks what the host knows complete (host_knows).
      if (rs.notes_clock && schedule_.allocator) note_clock(rs, index, rs.host.own);
      if (rs.checks_bytes) lifetime(rs, op, op.kind == OpKind::kAlloc, index);
      return true;
    case OpKind::kRecordStream:
      if (rs.checks_bytes) record_stream(rs, op, index);
      return true;
    default:
      run_work(rs, index, op);
      return true;
  }
}

void Checker::wait_for_event(RankState& rs, std::uint32_t index, const Op& op, Clock& waiter) {
  const EventId e = op.event;
  auto it = rs.events.find(e);
  if (it == rs.events.end()) {
    malformed(rs, index, fmt::format("waits for event {}, never recorded before", e));
  }
  arena_.join(waiter, it->second.clock);
  if (--it->second.waits_left == 0) rs.events.erase(it);
}

}  // namespace detail

std::uint64_t CheckResult::count(FindingKind kind) const {
  std::uint64_t n = 0;
  for (const auto& g : groups) {
    if (g.example.kind == kind) n += g.count;
  }
  return n;
}

std::size_t CheckResult::group_count(FindingKind kind) const {
  return static_cast<std::size_t>(
      std::count_if(groups.begin(), groups.end(),
                    [kind](const FindingGroup& g) { return g.example.kind == kind; }));
}

bool is_ordering(OpKind kind) {
  return kind == OpKind::kHostStreamSync || kind == OpKind::kHostDeviceSync ||
         kind == OpKind::kHostEventSync || kind == OpKind::kStreamWaitEvent;
}

CheckResult check_schedule(const Schedule& schedule, const Ablation& ablation) {
  return detail::Checker(schedule, ablation, nullptr).run();
}

CheckResult check_schedule_by_class(const Schedule& schedule, ClassCheck* how) {
  ClassCheck unused;
  ClassCheck& h = how != nullptr ? *how : unused;
  const auto every_rank = [&h](bool bytes_too) {
    if (h.before_every_rank) h.before_every_rank(bytes_too);
  };
  const RankClasses classes = rank_classes(schedule);
  h.classes = classes.classes.size();
  h.summary = describe_classes(classes);
  if (classes.per_rank()) {
    if (classes.capped) {
      h.per_rank_because = "too many kinds of ranks";
    } else if (schedule.ranks.size() > 1) {
      h.per_rank_because =
          "no two ranks alike, each issuing other ops or its slices in another order";
    }
    every_rank(true);
    return check_schedule(schedule);
  }
  try {
    static const Ablation kNone;
    const std::optional<SymmetricWorld> world =
        symmetric_world(schedule, &h.walked_every_rank_because);
    h.walked_by_class = world.has_value();
    if (!world) every_rank(false);
    detail::Checker checker(schedule, kNone, &classes, world ? &*world : nullptr);
    CheckResult result = checker.run();
    if (checker.classes_held()) return result;
    h.walked_by_class = false;
    h.per_rank_because =
        world ? "a collective would never complete" : "ranks of one class are ordered differently";
  } catch (const std::invalid_argument&) {
    h.per_rank_because = "malformed schedule";  // rank by rank names the first error
  }
  every_rank(true);
  return check_schedule(schedule);
}

}  // namespace hpz::check
