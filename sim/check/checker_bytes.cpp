// Per rank byte histories, data versions and the caching allocator's reuse: the race,
// uninitialized-read, stale-read and use-after-free rules of checker.hpp.
#include <fmt/format.h>

#include <algorithm>

#include "sim/check/checker_impl.hpp"

namespace hpz::check::detail {
namespace {

bool versioned(BufferRole role) {
  return role == BufferRole::kPrimary || role == BufferRole::kSecondary ||
         role == BufferRole::kFull || role == BufferRole::kQuantized;
}

/** A use the host already knows complete is ordered before everything the host issues later,
 *  a reuse of the memory included. */
bool host_knows(const RankState& rs, const PendingUse& u) {
  return rs.host.own[u.stamp.thread] >= u.stamp.tick;
}

/** The key of rs.same_data_rewrites for op `op_index`'s write of `buffer`. */
std::uint64_t same_data_key(std::uint32_t op_index, BufferId buffer) {
  return static_cast<std::uint64_t>(op_index) << 32 | static_cast<std::uint32_t>(buffer);
}

}  // namespace

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
    if (deferred_) {
      deferred_->add(rs.schedule->rank, {.kind = FindingKind::kUseAfterFree,
                                         .op = index,
                                         .mode = a.mode,
                                         .buffer = a.buffer,
                                         .lo = {},
                                         .hi = {},
                                         .use = u});
    } else {
      log_.use_after_free(rs.schedule->rank, u, index, a.mode, a.buffer);
    }
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

BufferState& Checker::touched_buffer(RankState& rs, std::uint32_t index, const Access& a) {
  if (a.buffer >= rs.buffers.size()) malformed(rs, index, "no such buffer");
  BufferState& b = rs.buffers[a.buffer];
  if (!b.live) {
    b.history.reset(rs.schedule->buffers[a.buffer].bytes);
    b.live = true;
  }
  if (a.end() > b.history.size()) malformed(rs, index, "access past the end of its buffer");
  return b;
}

void Checker::report_race(Rank r, std::uint32_t index, const Access& a, std::uint32_t prior_op,
                          AccessMode prior_mode, std::uint64_t lo, std::uint64_t hi) {
  if (deferred_) {
    deferred_->add(r, {.kind = FindingKind::kRace,
                       .op = index,
                       .first = prior_op,
                       .first_mode = prior_mode,
                       .mode = a.mode,
                       .buffer = a.buffer,
                       .lo = deferred_->ref(r, a.buffer, lo),
                       .hi = deferred_->ref(r, a.buffer, hi),
                       .use = {}});
  } else {
    log_.race(r, prior_op, prior_mode, index, a.mode, a.buffer, lo, hi);
  }
}

void Checker::report_uninitialized(Rank r, std::uint32_t index, const Access& a,
                                   std::uint32_t alloc_op, std::uint64_t lo, std::uint64_t hi) {
  if (deferred_) {
    deferred_->add(r, {.kind = FindingKind::kUninitializedRead,
                       .op = index,
                       .first = alloc_op,
                       .buffer = a.buffer,
                       .lo = deferred_->ref(r, a.buffer, lo),
                       .hi = deferred_->ref(r, a.buffer, hi),
                       .use = {}});
  } else {
    log_.uninitialized(r, alloc_op, index, a.buffer, lo, hi);
  }
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
    BufferState& b = touched_buffer(rs, index, a);
    check_reuse(rs, index, op, a, clock, stamp);
    bool uninit_seen = false;
    std::uint64_t uninit_lo = 0;
    std::uint64_t uninit_hi = 0;
    const bool rewrite = a.mode == AccessMode::kWrite && rewrites_same_data(rs, op, a.buffer);
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
          const bool prior_harmless =
              prior_mode == AccessMode::kRead ||
              rs.same_data_rewrites.count(same_data_key(prior.op, a.buffer));
          const bool this_harmless = a.mode == AccessMode::kRead || rewrite;
          if (prior_harmless && this_harmless) {
            ++stats_.same_data_rewrites;
            ++rs.same_data;
            return;
          }
          report_race(r, index, a, prior.op, prior_mode, lo, hi);
        },
        [&](std::uint64_t lo, std::uint64_t hi) {
          if (!uninit_seen) {
            uninit_seen = true;
            uninit_lo = lo;
          }
          uninit_hi = hi;  // unwritten bytes from the first gap to the last, reported once
        });
    if (uninit_seen) report_uninitialized(r, index, a, b.alloc_op, uninit_lo, uninit_hi);
    if (rewrite) rs.same_data_rewrites.insert(same_data_key(index, a.buffer));
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
      if (deferred_) {
        deferred_->add(r, {.kind = FindingKind::kStaleRead,
                           .op = index,
                           .first = rs.unit_writer[buf.unit],
                           .copy = b.last_writer,
                           .buffer = a.buffer,
                           .lo = {},
                           .hi = {},
                           .use = {}});
      } else {
        log_.stale(r, rs.unit_writer[buf.unit], b.last_writer, index, a.buffer);
      }
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

}  // namespace hpz::check::detail
