#include "sim/check/checker.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "sim/check/allocator.hpp"
#include "sim/check/byte_history.hpp"
#include "sim/check/clock.hpp"
#include "sim/check/finding_log.hpp"

namespace hpz::check {
namespace {

constexpr std::int64_t kNotPending = -1;

int thread_of(StreamId s) {
  return s == kHostStream ? 0 : 1 + s;
}

bool versioned(BufferRole role) {
  return role == BufferRole::kPrimary || role == BufferRole::kSecondary ||
         role == BufferRole::kFull || role == BufferRole::kQuantized;
}

/** One buffer of one rank: its current lifetime's bytes and data version. */
struct BufferState {
  ByteHistory history;
  std::uint32_t version = 0;  ///< 0: holds no tracked parameter data
  std::uint32_t alloc_op = kNoOp;
  std::uint32_t last_writer = kNoOp;
  bool live = false;
};

/** The caching allocator's view of one buffer of one rank (Schedule::allocator only: kept
 *  apart from BufferState, of which a 1,024-rank check holds millions). */
struct BlockState {
  bool tracked = false;        ///< allocated on a stream through the allocator model
  std::uint64_t block = 0;     ///< its block's (made-up) address
  std::uint32_t recorded = 0;  ///< streams named by record_stream, a bit each
  PendingUses uses;            ///< the last read and the last write of each thread
  PendingUses inherited;       ///< uses of the freed memory it reuses, not yet ordered
};

/** A recorded event, kept until its last wait. */
struct EventSnapshot {
  Clock clock;
  std::uint32_t waits_left = 0;
};

/** Everything the checker tracks for one rank while walking its ops in host order. */
struct RankState {
  const RankSchedule* schedule = nullptr;
  std::uint32_t next = 0;  ///< next op to process
  Clock host;
  std::vector<Clock> streams;
  std::uint32_t host_gen = 1;             ///< bumped whenever the host's clock changes
  std::vector<std::uint32_t> stream_gen;  ///< host_gen each stream last absorbed
  std::vector<std::int64_t> pending;      ///< per stream: incomplete collective, or kNotPending
  std::vector<BufferState> buffers;
  /** (event, how many ops wait for it), by event: a sorted vector, where a hash map per rank
   *  took a third of the checker's memory at 1,024 ranks. */
  std::vector<std::pair<EventId, std::uint32_t>> waits;
  std::unordered_map<EventId, EventSnapshot> events;
  std::vector<std::uint32_t> group_seq;      ///< collectives issued, per group
  std::vector<std::uint32_t> group_last_op;  ///< last collective op issued, per group
  CachingAllocator allocator;                ///< Schedule::allocator only
  std::vector<BlockState> blocks;            ///< per buffer; Schedule::allocator only, else empty
  std::vector<std::uint32_t> unit_version;
  std::vector<std::uint32_t> unit_writer;  ///< the op that last wrote the unit's primary shard
  /** (op << 32 | buffer) of copies that wrote a secondary the data it already held. */
  std::unordered_set<std::uint64_t> same_data_rewrites;
  bool blocked = false;
  bool done = false;
};

/** One rank's arrival at a collective. */
struct Arrival {
  Rank rank = 0;
  std::uint32_t op = 0;
  StreamId stream = 0;
  Clock start;
};

/** The k-th collective of one group, while its members arrive. */
struct Instance {
  std::vector<Arrival> arrivals;
};

std::uint64_t instance_key(GroupId g, std::uint32_t seq) {
  return (static_cast<std::uint64_t>(g) << 32) | seq;
}

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.3g} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string rank_list(const std::vector<Rank>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

class Checker {
 public:
  Checker(const Schedule& schedule, const Ablation& ablation);
  CheckResult run();

 private:
  void advance(RankState& rs);
  bool step(RankState& rs, std::uint32_t index);
  void absorb_host(RankState& rs, StreamId s);
  // The helpers of step() take the op it read: an OpList gives each op by value.
  void wait_for_event(RankState& rs, std::uint32_t index, const Op& op, Clock& waiter);
  void check_accesses(RankState& rs, std::uint32_t index, const Op& op, const Clock& clock,
                      int thread);
  void track_versions(RankState& rs, std::uint32_t index, const Op& op);
  bool rewrites_same_data(const RankState& rs, const Op& op, BufferId buffer) const;
  void lifetime(RankState& rs, const Op& op, bool alloc, std::uint32_t index);
  void end_block(RankState& rs, BlockState& k, const Op& op, std::uint32_t index);
  void record_stream(RankState& rs, const Op& op, std::uint32_t index);
  void check_reuse(RankState& rs, std::uint32_t index, const Op& op, const Access& a,
                   const Clock& clock, const AccessStamp& stamp);
  void arrive(RankState& rs, std::uint32_t index, const Op& op);
  void complete(std::uint64_t key, bool forced);
  void check_signatures(GroupId g, std::uint32_t seq, const Instance& inst);
  void report_hang(GroupId g, std::uint32_t seq, const Instance& inst);
  void force_all();
  [[noreturn]] void malformed(const RankState& rs, std::uint32_t index,
                              const std::string& what) const;

  const Schedule& schedule_;
  const Ablation& ablation_;
  ClockArena arena_;
  FindingLog log_;
  std::vector<RankState> ranks_;
  std::map<std::uint64_t, Instance> instances_;  // ordered: deterministic forced completion
  std::vector<bool> group_reported_;
  std::deque<Rank> ready_;
  CheckStats stats_;
  std::vector<UnitId> unit_bumped_;  // track_versions' scratch, kept to avoid allocations
  /** One versioned read of an op, for track_versions. */
  struct UnitRead {
    UnitId unit;
    BufferId buffer;        ///< the buffer read (a copy from another buffer keeps the version)
    std::uint32_t version;  ///< its data version
  };
  std::vector<UnitRead> unit_reads_;
};

int max_threads(const Schedule& s) {
  std::size_t streams = 0;
  for (const auto& r : s.ranks) streams = std::max(streams, r.streams.size());
  if (streams + 1 > static_cast<std::size_t>(kMaxThreads)) {
    throw std::invalid_argument(fmt::format(
        "race checker: a rank has {} streams, at most {} supported", streams, kMaxThreads - 1));
  }
  return static_cast<int>(streams) + 1;
}

Checker::Checker(const Schedule& schedule, const Ablation& ablation)
    : schedule_(schedule),
      ablation_(ablation),
      arena_(static_cast<int>(schedule.ranks.size()), max_threads(schedule)),
      log_(schedule),
      ranks_(schedule.ranks.size()),
      group_reported_(schedule.groups.size(), false) {
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    RankState& rs = ranks_[r];
    const RankSchedule& sched = schedule.ranks[r];
    if (sched.rank != static_cast<Rank>(r)) {
      throw std::invalid_argument(
          fmt::format("malformed schedule: ranks[{}].rank is {}", r, sched.rank));
    }
    rs.schedule = &sched;
    // Tick 1 for every own thread: tick 0 means "nothing known" in a clock.
    rs.host.own[0] = 1;
    rs.streams.assign(sched.streams.size(), Clock{RankTicks{}, rs.host.remote});
    for (std::size_t s = 0; s < sched.streams.size(); ++s) rs.streams[s].own[1 + s] = 1;
    rs.stream_gen.assign(sched.streams.size(), 0);
    rs.pending.assign(sched.streams.size(), kNotPending);
    rs.buffers.resize(sched.buffers.size());
    if (schedule.allocator) rs.blocks.resize(sched.buffers.size());
    rs.group_seq.assign(schedule.groups.size(), 0);
    rs.group_last_op.assign(schedule.groups.size(), kNoOp);
    // A unit's first data (whatever init writes) is version 1; 0 means "holds no data", so
    // a secondary copied from the freshly initialized parameter before its primary is written
    // (DeepSpeed 0.13.1 partitions the secondary first) is tracked like any other copy.
    rs.unit_version.assign(schedule.units.size(), 1);
    rs.unit_writer.assign(schedule.units.size(), kNoOp);
    std::vector<EventId> waited;
    for (const Op& op : sched.ops) {
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
}

void Checker::malformed(const RankState& rs, std::uint32_t index, const std::string& what) const {
  throw std::invalid_argument(
      fmt::format("malformed schedule: rank {} op #{}: {}", rs.schedule->rank, index, what));
}

CheckResult Checker::run() {
  for (std::size_t r = 0; r < ranks_.size(); ++r) ready_.push_back(static_cast<Rank>(r));
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
  while (rs.next < n) {
    if (!step(rs, rs.next)) {
      rs.blocked = true;
      return;
    }
    ++rs.next;
    ++stats_.ops;
  }
  rs.done = true;
}

void Checker::absorb_host(RankState& rs, StreamId s) {
  if (rs.stream_gen[s] == rs.host_gen) return;
  arena_.join(rs.streams[s], rs.host);
  rs.stream_gen[s] = rs.host_gen;
}

bool Checker::step(RankState& rs, std::uint32_t index) {
  const Op& op = rs.schedule->ops[index];
  const auto nstreams = static_cast<StreamId>(rs.streams.size());
  if (op.stream != kHostStream) {
    if (op.stream < 0 || op.stream >= nstreams) malformed(rs, index, "no such stream");
    // FIFO: nothing more happens on a stream whose collective still waits for its peers.
    if (rs.pending[op.stream] != kNotPending) return false;
  }
  if (ablation_.leave_out && is_ordering(op.kind) &&
      ablation_.leave_out(rs.schedule->rank, index, op)) {
    // As if never issued; an event it waited for is kept only for its other waits.
    if (op.kind == OpKind::kStreamWaitEvent || op.kind == OpKind::kHostEventSync) {
      const auto it = rs.events.find(op.event);
      if (it != rs.events.end() && --it->second.waits_left == 0) rs.events.erase(it);
    }
    return true;
  }
  switch (op.kind) {
    case OpKind::kHostStreamSync: {
      if (op.stream == kHostStream) malformed(rs, index, "host stream sync names no stream");
      Clock& s = rs.streams[op.stream];
      absorb_host(rs, op.stream);
      arena_.join(rs.host, s);
      ++s.own[thread_of(op.stream)];
      ++rs.host.own[0];
      ++rs.host_gen;
      return true;
    }
    case OpKind::kHostDeviceSync: {
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
    case OpKind::kEventRecord: {
      if (op.stream == kHostStream) malformed(rs, index, "event recorded on the host");
      absorb_host(rs, op.stream);
      Clock& s = rs.streams[op.stream];
      const auto waits = std::lower_bound(rs.waits.begin(), rs.waits.end(),
                                          std::make_pair(op.event, std::uint32_t{0}));
      if (waits != rs.waits.end() && waits->first == op.event && waits->second > 0) {
        rs.events[op.event] = EventSnapshot{s, waits->second};
      }
      ++s.own[thread_of(op.stream)];
      return true;
    }
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
      lifetime(rs, op, op.kind == OpKind::kAlloc, index);
      return true;
    case OpKind::kRecordStream:
      record_stream(rs, op, index);
      return true;
    default:
      break;
  }
  if (is_collective(op.kind)) {
    if (op.stream == kHostStream) malformed(rs, index, "collective on the host");
    absorb_host(rs, op.stream);
    check_accesses(rs, index, op, rs.streams[op.stream], thread_of(op.stream));
    track_versions(rs, index, op);
    arrive(rs, index, op);
    return true;
  }
  if (op.stream == kHostStream) {
    check_accesses(rs, index, op, rs.host, 0);
    track_versions(rs, index, op);
    if (op.access_count > 0) {
      ++rs.host.own[0];
      ++rs.host_gen;
    }
    return true;
  }
  absorb_host(rs, op.stream);
  check_accesses(rs, index, op, rs.streams[op.stream], thread_of(op.stream));
  track_versions(rs, index, op);
  return true;
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

/** A use the host already knows complete is ordered before everything the host issues later,
 *  a reuse of the memory included. */
bool host_knows(const RankState& rs, const PendingUse& u) {
  return rs.host.own[u.stamp.thread] >= u.stamp.tick;
}

void Checker::lifetime(RankState& rs, const Op& op, bool alloc, std::uint32_t index) {
  if (op.buffer >= rs.buffers.size()) malformed(rs, index, "allocation names no buffer");
  BufferState& b = rs.buffers[op.buffer];
  const Buffer& buf = rs.schedule->buffers[op.buffer];
  // The caching allocator's side (allocator.hpp), on schedules that carry its events.
  if (!rs.blocks.empty()) {
    BlockState& k = rs.blocks[op.buffer];
    end_block(rs, k, op, index);
    if (alloc && op.stream != kHostStream && !buf.on_host) {
      auto [address, inherited] = rs.allocator.allocate(op.stream, buf.bytes);
      k.tracked = true;
      k.block = address;
      for (const PendingUse& u : inherited) {
        if (!host_knows(rs, u)) k.inherited.push_back(u);
      }
    }
  }
  if (alloc) {
    b.history.reset(buf.bytes);
    b.alloc_op = index;
    b.live = true;
  } else {
    b.history.clear();
    b.alloc_op = kNoOp;
    b.live = false;
  }
  b.version = 0;
  b.last_writer = kNoOp;
}

// A lifetime ends (a free, or an allocation over a live buffer: the tensor replaced). free():
// streams named by record_stream hold the block until their work at the free is done
// (insert_events), so their uses are over before any reuse; what is left goes with the block.
void Checker::end_block(RankState& rs, BlockState& k, const Op& op, std::uint32_t index) {
  if (k.tracked) {
    const StreamId block_stream = rs.schedule->ops[rs.buffers[op.buffer].alloc_op].stream;
    PendingUses pending;
    for (const PendingUse& u : k.uses) {
      const bool recorded = u.stamp.thread > 0 && (k.recorded >> (u.stamp.thread - 1)) & 1u;
      if (recorded || host_knows(rs, u)) continue;
      PendingUse p = u;
      p.buffer = op.buffer;
      p.free_op = index;
      p.block_stream = block_stream;
      pending.push_back(p);
    }
    rs.allocator.free(k.block, std::move(pending));
    k.tracked = false;
  }
  k.uses.clear();
  k.inherited.clear();
  k.recorded = 0;
}

void Checker::record_stream(RankState& rs, const Op& op, std::uint32_t index) {
  if (op.buffer >= rs.buffers.size()) malformed(rs, index, "record_stream names no buffer");
  if (op.stream == kHostStream || op.stream >= static_cast<StreamId>(rs.streams.size())) {
    malformed(rs, index, "record_stream names no stream");
  }
  // recordStream: a use on the block's own stream needs nothing, and the allocator ignores it;
  // the bit is harmless there (that stream's uses are FIFO before the reuse anyway).
  if (!rs.blocks.empty()) rs.blocks[op.buffer].recorded |= 1u << op.stream;
}

// The caching allocator's reuse (allocator.hpp): this access touches memory that a freed
// buffer's pending use may still touch. Unordered, with a write on either side, the new owner
// and the old use corrupt each other: a use after free across streams.
void Checker::check_reuse(RankState& rs, std::uint32_t index, const Op& op, const Access& a,
                          const Clock& clock, const AccessStamp& stamp) {
  if (rs.blocks.empty()) return;
  BlockState& b = rs.blocks[a.buffer];
  if (!b.tracked) return;
  const std::uint64_t lo = b.block + a.offset;
  const std::uint64_t hi = b.block + a.end();
  for (auto it = b.inherited.begin(); it != b.inherited.end();) {
    const PendingUse& u = *it;
    const bool ordered = clock.own[u.stamp.thread] >= u.stamp.tick;
    const bool overlaps = u.lo < hi && lo < u.hi;
    const bool harmful = u.mode == AccessMode::kWrite || a.mode == AccessMode::kWrite;
    if (ordered || !overlaps || !harmful) {
      ++it;
      continue;
    }
    log_.use_after_free(rs.schedule->rank, u, index, a.mode, a.buffer);
    it = b.inherited.erase(it);  // once per old use and new lifetime
  }
  // ProcessGroupNCCL records the NCCL stream on a collective's tensors (or stashes them until
  // the work is waited for): the allocator holds the block for it (docs/checker.md).
  if (is_collective(op.kind)) return;
  for (PendingUse& u : b.uses) {
    if (u.stamp.thread == stamp.thread && u.mode == a.mode) {
      u.stamp = stamp;
      return;
    }
  }
  PendingUse u;
  u.stamp = stamp;
  u.mode = a.mode;
  b.uses.push_back(u);
}

void Checker::check_accesses(RankState& rs, std::uint32_t index, const Op& op, const Clock& clock,
                             int thread) {
  const Rank r = rs.schedule->rank;
  const AccessStamp stamp{index, clock.own[thread], static_cast<std::uint8_t>(thread)};
  auto ordered = [&clock](const AccessStamp& prior) {
    return clock.own[prior.thread] >= prior.tick;
  };
  // One finding per (earlier op, buffer): an access split over several segments is one bug.
  struct Seen {
    std::uint32_t op;
    BufferId buffer;
  };
  std::vector<Seen> seen;
  for (const Access& a : schedule_.accesses_of(r, op)) {
    ++stats_.accesses;
    if (a.buffer >= rs.buffers.size()) malformed(rs, index, "no such buffer");
    BufferState& b = rs.buffers[a.buffer];
    if (!b.live) {
      b.history.reset(rs.schedule->buffers[a.buffer].bytes);
      b.live = true;
    }
    if (a.end() > b.history.size()) malformed(rs, index, "access past the end of its buffer");
    check_reuse(rs, index, op, a, clock, stamp);
    bool uninit_seen = false;
    std::uint64_t uninit_lo = 0;
    std::uint64_t uninit_hi = 0;
    const bool rewrite = a.mode == AccessMode::kWrite && rewrites_same_data(rs, op, a.buffer);
    const auto key = [](std::uint32_t op_index, BufferId buffer) {
      return static_cast<std::uint64_t>(op_index) << 32 | static_cast<std::uint32_t>(buffer);
    };
    // A strided access is one access here, as for the findings' counts: one uninitialized
    // read per access, however many slices it spans.
    b.history.access(
        Slices{a.offset, a.bytes, a.stride, a.count}, a.mode, stamp, ordered,
        [&](const AccessStamp& prior, AccessMode prior_mode, std::uint64_t lo, std::uint64_t hi) {
          const bool dup = std::any_of(seen.begin(), seen.end(), [&](const Seen& s) {
            return s.op == prior.op && s.buffer == a.buffer;
          });
          if (dup) return;
          seen.push_back({prior.op, a.buffer});
          // Every write of the pair leaves the bytes as they were: whichever runs first, the
          // other sees the same data (rewrites_same_data).
          const bool prior_harmless = prior_mode == AccessMode::kRead ||
                                      rs.same_data_rewrites.count(key(prior.op, a.buffer));
          const bool this_harmless = a.mode == AccessMode::kRead || rewrite;
          if (prior_harmless && this_harmless) {
            ++stats_.same_data_rewrites;
            return;
          }
          log_.race(r, prior.op, prior_mode, index, a.mode, a.buffer, lo, hi);
        },
        [&](std::uint64_t lo, std::uint64_t hi) {
          if (!uninit_seen) {
            uninit_seen = true;
            uninit_lo = lo;
          }
          uninit_hi = hi;  // unwritten bytes from the first gap to the last, reported once
        });
    if (uninit_seen) log_.uninitialized(r, b.alloc_op, index, a.buffer, uninit_lo, uninit_hi);
    if (rewrite) rs.same_data_rewrites.insert(key(index, a.buffer));
  }
}

// DeepSpeed 0.13.2 to 0.14.2 copy a parameter into its secondary on every release, also when
// the secondary already holds that very data (nothing changed the weights since the last
// copy: the releases of step 0 after init's copies, of a step's recompute and backward after
// its forward, and of every micro-step after the first). Such a copy changes no byte, so a read
// that is unordered with it sees the same data whether it runs before, during or after it: the
// pair is not a race. A copy into a fresh secondary (after invalidate_secondary_tensor) or of
// new data (after the optimizer step) is one, and stays reported.
bool Checker::rewrites_same_data(const RankState& rs, const Op& op, BufferId buffer) const {
  const Buffer& target = rs.schedule->buffers[buffer];
  const BufferState& held = rs.buffers[buffer];
  if (op.kind != OpKind::kCopy || target.role != BufferRole::kSecondary || target.unit < 0 ||
      !held.live || held.version == 0) {
    return false;
  }
  std::uint32_t written = 0;  // the oldest version of the unit the copy reads, as track_versions
  for (const Access& a : schedule_.accesses_of(rs.schedule->rank, op)) {
    if (a.mode != AccessMode::kRead || a.buffer == buffer) continue;
    const Buffer& from = rs.schedule->buffers[a.buffer];
    const std::uint32_t v = rs.buffers[a.buffer].version;
    if (!versioned(from.role) || from.unit != target.unit || v == 0) continue;
    written = written == 0 ? v : std::min(written, v);
  }
  return written != 0 && written == held.version;
}

// Versions per unit: an op that reads several units' buffers (a coalesced gather, a recorded
// kernel group) gives each written buffer the version of what it read of that buffer's own
// unit. A primary shard write bumps its unit's version, except when it copies the unit's data
// from another of its buffers (DeepSpeed moving a shard into its flat buffer): same data, same
// version. An update that reads and writes the same primary (the optimizer) still bumps.
void Checker::track_versions(RankState& rs, std::uint32_t index, const Op& op) {
  const Rank r = rs.schedule->rank;
  const auto units = static_cast<UnitId>(rs.unit_version.size());
  std::vector<UnitRead>& reads = unit_reads_;
  reads.clear();
  for (const Access& a : schedule_.accesses_of(r, op)) {
    if (a.mode != AccessMode::kRead) continue;
    const Buffer& buf = rs.schedule->buffers[a.buffer];
    const BufferState& b = rs.buffers[a.buffer];
    if (!versioned(buf.role) || buf.unit < 0 || buf.unit >= units || b.version == 0) continue;
    reads.push_back({buf.unit, a.buffer, b.version});
    if (buf.role == BufferRole::kSecondary && b.version < rs.unit_version[buf.unit]) {
      log_.stale(r, rs.unit_writer[buf.unit], b.last_writer, index, a.buffer);
    }
  }
  // The oldest version this op read of `unit` from buffers other than `except`; 0 = none.
  auto read_version = [&reads](UnitId unit, BufferId except) {
    std::uint32_t v = 0;
    for (const UnitRead& u : reads) {
      if (u.unit == unit && u.buffer != except) v = v == 0 ? u.version : std::min(v, u.version);
    }
    return v;
  };
  std::vector<UnitId>& bumped = unit_bumped_;
  bumped.clear();
  for (const Access& a : schedule_.accesses_of(r, op)) {
    if (a.mode != AccessMode::kWrite) continue;
    const Buffer& buf = rs.schedule->buffers[a.buffer];
    BufferState& b = rs.buffers[a.buffer];
    b.last_writer = index;
    if (!versioned(buf.role) || buf.unit < 0 || buf.unit >= units) continue;
    const std::uint32_t copied = read_version(buf.unit, a.buffer);
    // New data: a primary shard written from nothing of its unit (the optimizer, a checkpoint's
    // shards), or a load writing the whole parameter (from_pretrained on rank 0, and its
    // broadcast on the others).
    const bool loaded = buf.role == BufferRole::kFull && op.purpose == Purpose::kCheckpointLoad;
    if ((buf.role == BufferRole::kPrimary || loaded) && copied == 0) {
      if (std::find(bumped.begin(), bumped.end(), buf.unit) == bumped.end()) {
        ++rs.unit_version[buf.unit];
        bumped.push_back(buf.unit);
      }
      rs.unit_writer[buf.unit] = index;
      b.version = rs.unit_version[buf.unit];
    } else if (buf.role == BufferRole::kPrimary) {
      b.version = copied;
    } else {
      const std::uint32_t any = read_version(buf.unit, kNoBuffer);
      b.version = any != 0 ? any : rs.unit_version[buf.unit];
    }
  }
}

void Checker::arrive(RankState& rs, std::uint32_t index, const Op& op) {
  const Rank r = rs.schedule->rank;
  if (op.group < 0 || op.group >= static_cast<GroupId>(schedule_.groups.size())) {
    malformed(rs, index, "collective names no group");
  }
  const Group& g = schedule_.groups[op.group];
  if (!std::binary_search(g.ranks.begin(), g.ranks.end(), r)) {
    malformed(rs, index, fmt::format("collective on group {}, which rank {} is not in", g.name, r));
  }
  const std::uint32_t seq = rs.group_seq[op.group]++;
  rs.group_last_op[op.group] = index;
  const std::uint64_t key = instance_key(op.group, seq);
  Clock& s = rs.streams[op.stream];
  Instance& inst = instances_[key];
  inst.arrivals.push_back(Arrival{r, index, op.stream, s});
  // The start is what peers learn; later ops on the stream are not part of it.
  ++s.own[thread_of(op.stream)];
  rs.pending[op.stream] = static_cast<std::int64_t>(key);
  if (inst.arrivals.size() == g.ranks.size()) complete(key, false);
}

void Checker::complete(std::uint64_t key, bool forced) {
  auto it = instances_.find(key);
  Instance inst = std::move(it->second);
  instances_.erase(it);
  const auto g = static_cast<GroupId>(key >> 32);
  const auto seq = static_cast<std::uint32_t>(key & 0xffffffffu);
  ++stats_.collectives;
  if (!forced) check_signatures(g, seq, inst);
  std::vector<const Clock*> clocks;
  std::vector<Rank> members;
  for (const Arrival& a : inst.arrivals) {
    clocks.push_back(&a.start);
    members.push_back(a.rank);
  }
  const Knowledge met = arena_.rendezvous(clocks, members);
  for (const Arrival& a : inst.arrivals) {
    RankState& m = ranks_[a.rank];
    Clock& s = m.streams[a.stream];
    merge_ticks(s.own, arena_.ticks_of(met, a.rank));
    arena_.join(s.remote, met);
    std::erase_if(s.remote.delta, [&](const RemoteTicks& e) { return e.rank == a.rank; });
    if (m.pending[a.stream] == static_cast<std::int64_t>(key)) m.pending[a.stream] = kNotPending;
    if (m.blocked) {
      m.blocked = false;
      ready_.push_back(a.rank);
    }
  }
}

void Checker::check_signatures(GroupId g, std::uint32_t seq, const Instance& inst) {
  if (group_reported_[g]) return;
  auto signature = [&](const Arrival& a) {
    const Op& op = schedule_.ranks[a.rank].ops[a.op];
    return std::pair{op.kind, op.comm_bytes};
  };
  // The signature most members issued is "right"; the first other one is reported.
  std::map<std::pair<OpKind, std::uint64_t>, std::vector<Rank>> by_sig;
  for (const Arrival& a : inst.arrivals) by_sig[signature(a)].push_back(a.rank);
  if (by_sig.size() == 1) return;
  group_reported_[g] = true;
  auto majority = std::max_element(by_sig.begin(), by_sig.end(), [](const auto& x, const auto& y) {
    return x.second.size() < y.second.size();
  });
  const Arrival* good = nullptr;
  const Arrival* odd = nullptr;
  for (const Arrival& a : inst.arrivals) {
    if (signature(a) == majority->first) {
      if (!good) good = &a;
    } else if (!odd) {
      odd = &a;
    }
  }
  const Op& gop = schedule_.ranks[good->rank].ops[good->op];
  const Op& oop = schedule_.ranks[odd->rank].ops[odd->op];
  std::vector<Rank> odd_ranks;
  for (const auto& [sig, ranks] : by_sig) {
    if (sig != majority->first) odd_ranks.insert(odd_ranks.end(), ranks.begin(), ranks.end());
  }
  std::sort(odd_ranks.begin(), odd_ranks.end());
  log_.mismatch(g, seq, good->rank, good->op, odd->rank, odd->op,
                fmt::format("ranks {} issue {} of {} but ranks {} issue {} of {}",
                            rank_list(majority->second), to_string(gop.kind), mib(gop.comm_bytes),
                            rank_list(odd_ranks), to_string(oop.kind), mib(oop.comm_bytes)));
}

void Checker::report_hang(GroupId g, std::uint32_t seq, const Instance& inst) {
  if (group_reported_[g]) return;
  group_reported_[g] = true;
  const Group& grp = schedule_.groups[g];
  std::vector<Rank> arrived;
  for (const Arrival& a : inst.arrivals) arrived.push_back(a.rank);
  std::sort(arrived.begin(), arrived.end());
  std::vector<Rank> missing;
  std::set_difference(grp.ranks.begin(), grp.ranks.end(), arrived.begin(), arrived.end(),
                      std::back_inserter(missing));
  const Rank m = missing.front();
  const RankState& ms = ranks_[m];
  // Where the missing rank is stuck: inside a collective of its own, or done.
  std::uint32_t at = ms.done ? ms.group_last_op[g] : ms.next;
  std::string doing =
      ms.done ? fmt::format("finished after issuing only {} collectives on it", ms.group_seq[g])
              : fmt::format("is stuck at op #{}", ms.next);
  for (const auto& [key, other] : instances_) {
    for (const Arrival& a : other.arrivals) {
      if (a.rank != m) continue;
      const auto og = static_cast<GroupId>(key >> 32);
      at = a.op;
      doing = fmt::format("is itself waiting in collective #{} on group {}",
                          static_cast<std::uint32_t>(key & 0xffffffffu), schedule_.groups[og].name);
    }
  }
  const Arrival& first = inst.arrivals.front();
  const Op& fop = schedule_.ranks[first.rank].ops[first.op];
  log_.mismatch(g, seq, first.rank, first.op, m, at,
                fmt::format("ranks {} issue {} of {} but ranks {} never issue it (rank {} {})",
                            rank_list(arrived), to_string(fop.kind), mib(fop.comm_bytes),
                            rank_list(missing), m, doing));
}

void Checker::force_all() {
  // Report every incomplete collective first, while all of them still show who waits where.
  std::vector<std::uint64_t> keys;
  for (const auto& [key, inst] : instances_) {
    keys.push_back(key);
    report_hang(static_cast<GroupId>(key >> 32), static_cast<std::uint32_t>(key & 0xffffffffu),
                inst);
  }
  for (std::uint64_t key : keys) complete(key, true);
}

}  // namespace

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
  return Checker(schedule, ablation).run();
}

}  // namespace hpz::check
