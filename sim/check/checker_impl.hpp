// The race checker's state while it walks a schedule (checker.hpp says what it proves); its
// parts: checker.cpp (the walk and happens-before within a rank), checker_bytes.cpp (byte
// histories, data versions, the caching allocator), checker_collectives.cpp (collectives across
// ranks). Internal to hpzlab_check.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "sim/check/allocator.hpp"
#include "sim/check/byte_history.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/class_findings.hpp"
#include "sim/check/clock.hpp"
#include "sim/check/finding_log.hpp"
#include "sim/check/symmetric_world.hpp"
#include "sim/ir/symmetry.hpp"

namespace hpz::check::detail {

inline constexpr std::int64_t kNotPending = -1;

inline int thread_of(StreamId s) {
  return s == kHostStream ? 0 : 1 + s;
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
  /** False for a rank its class representative stands for (check by class): its bytes, data
   *  versions and allocator are the representative's, only its happens-before is walked. */
  bool checks_bytes = true;
  bool notes_clock = false;     ///< hashes its clocks: its class has other ranks (by class)
  std::uint64_t same_data = 0;  ///< same-data rewrites left out on this rank (check by class)
  std::uint32_t alike = 1;      ///< ranks of its class, itself included (check by class)
  /** The clocks every byte check of this rank used, hashed (check by class): equal on every
   *  rank of a class when the representative's checks hold for all of them. */
  std::array<std::uint64_t, 2> clock_hash{};
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

/** Walks every rank's ops in host order, all ranks together, and checks the rules of
 *  checker.hpp; by class, only each class's representative checks bytes. */
class Checker {
 public:
  /** `classes`: check one rank per class (null or one class per rank: every rank). `world`
   *  (with classes only): the ranks are alike (symmetric_world.hpp), so only each class's
   *  representative walks happens-before, and a collective orders only its own stream. */
  Checker(const Schedule& schedule, const Ablation& ablation, const RankClasses* classes,
          const SymmetricWorld* world = nullptr);
  CheckResult run();
  /** After run() by class: false when some rank's clocks differed from its representative's,
   *  or the order of a symmetric world's findings could not be had (the result must then come
   *  from a check rank by rank). */
  bool classes_held() const { return classes_held_; }

 private:
  static void waits_of(RankState& rs);
  void advance(RankState& rs);
  bool run_may_find(const RankState& rs, std::uint32_t from, std::size_t found) const;
  bool step(RankState& rs, std::uint32_t index);
  void absorb_host(RankState& rs, StreamId s);
  // The helpers of step() take the op it read: an OpList gives each op by value.
  /** Whether the ablation leaves out ordering op `op`; if so, drops its wait on its event. */
  bool left_out(RankState& rs, std::uint32_t index, const Op& op);
  /** The host waits for one stream: each learns the other's clock. */
  void host_stream_sync(RankState& rs, std::uint32_t index, const Op& op);
  /** The host waits for every stream; false (not yet) while a stream's collective is pending. */
  bool host_device_sync(RankState& rs);
  /** Snapshots the stream's clock as the event's, when some op waits for it. */
  void record_event(RankState& rs, std::uint32_t index, const Op& op);
  /** A collective, kernel or copy: its accesses checked under the clock it runs with. */
  void run_work(RankState& rs, std::uint32_t index, const Op& op);
  void wait_for_event(RankState& rs, std::uint32_t index, const Op& op, Clock& waiter);
  void touch_bytes(RankState& rs, std::uint32_t index, const Op& op, const Clock& clock,
                   int thread);
  void note_clock(RankState& rs, std::uint32_t index, const RankTicks& own) const;
  bool finish_classes();
  void check_accesses(RankState& rs, std::uint32_t index, const Op& op, const Clock& clock,
                      int thread);
  /** The buffer access `a` touches, live from here when it was not; malformed() on an access
   *  to no buffer or past its end. */
  BufferState& touched_buffer(RankState& rs, std::uint32_t index, const Access& a);
  /** Logs (or, by class, defers) a race of access `a` of op `index` with op `prior_op`. */
  void report_race(Rank r, std::uint32_t index, const Access& a, std::uint32_t prior_op,
                   AccessMode prior_mode, std::uint64_t lo, std::uint64_t hi);
  /** Logs (or, by class, defers) access `a`'s read of bytes [lo, hi) never written since
   *  allocation op `alloc_op`. */
  void report_uninitialized(Rank r, std::uint32_t index, const Access& a, std::uint32_t alloc_op,
                            std::uint64_t lo, std::uint64_t hi);
  void track_versions(RankState& rs, std::uint32_t index, const Op& op);
  bool rewrites_same_data(const RankState& rs, const Op& op, BufferId buffer) const;
  void lifetime(RankState& rs, const Op& op, bool alloc, std::uint32_t index);
  void end_block(RankState& rs, BlockState& k, const Op& op, std::uint32_t index);
  void record_stream(RankState& rs, const Op& op, std::uint32_t index);
  void check_reuse(RankState& rs, std::uint32_t index, const Op& op, const Access& a,
                   const Clock& clock, const AccessStamp& stamp);
  void arrive(RankState& rs, std::uint32_t index, const Op& op);
  /** A collective in a symmetric world: it completes at once, and what the peers tell this
   *  rank it knew already (symmetric_world.hpp). */
  void meet_by_symmetry(RankState& rs, std::uint32_t index, const Op& op);
  void init_rank(RankState& rs, const RankSchedule& sched);
  /** After the representatives' walk in a symmetric world: the whole world's counts, and their
   *  findings for every rank in the order the check rank by rank meets them; false when that
   *  order cannot be had (walk_runs). */
  bool finish_symmetric();
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
  // Check by class (null: rank by rank): the representatives' findings, kept for their ranks,
  // and the runs of ops in the order the ranks walked them, to hand them out in.
  const RankClasses* classes_ = nullptr;
  const SymmetricWorld* world_ = nullptr;  // with classes_: only representatives walk
  std::unique_ptr<ClassFindings> deferred_;
  std::vector<RankRun> runs_;  // only runs that may hold findings (run_may_find)
  bool classes_held_ = true;
};

}  // namespace hpz::check::detail
