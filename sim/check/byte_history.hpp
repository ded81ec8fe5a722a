// The access history of one buffer lifetime, byte-exact: an interval map from byte ranges to the
// last write and the reads since, each stamped with its thread and tick. Two accesses conflict
// only where their byte ranges overlap (a slice copy and an overlapping gathered view do;
// disjoint slices of one buffer do not), which is what keying on a tensor's start pointer misses.
// A strided read (one slice per rank, a coalesced gather's torch.cat) is kept as one entry of
// the segments it spans, with its slice pattern, instead of splitting them at every slice: the
// same answers as its slices one by one, without a segment per slice.
#pragma once

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "sim/check/clock.hpp"

namespace hpz::check {

/** Marks "no op" where an op index is expected. */
inline constexpr std::uint32_t kNoOp = std::numeric_limits<std::uint32_t>::max();

/** Who accessed: the op (index in its rank's issue order), its thread and its tick there. */
struct AccessStamp {
  std::uint32_t op = kNoOp;
  Tick tick = 0;
  std::uint8_t thread = 0;
  bool operator==(const AccessStamp&) const = default;
};

/** Slices [offset + i * stride, + bytes) for i < count (Access's); count 1 is one range. */
struct Slices {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stride = 0;
  std::uint32_t count = 1;
  std::uint64_t end() const { return offset + (count - 1) * stride + bytes; }
  bool operator==(const Slices&) const = default;
};

/** A half-open byte range; empty when lo >= hi. */
struct ByteRange {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  bool empty() const { return lo >= hi; }
};

/** The lowest part of `p` inside [lo, hi). */
inline ByteRange first_piece(const Slices& p, std::uint64_t lo, std::uint64_t hi) {
  if (p.bytes == 0 || hi <= p.offset || lo >= p.end() || lo >= hi) return {};
  std::uint64_t i = p.count == 1 || lo <= p.offset ? 0 : (lo - p.offset) / p.stride;
  if (p.offset + i * p.stride + p.bytes <= lo) ++i;  // lo falls in the gap after slice i
  if (i >= p.count) return {};
  const std::uint64_t s = p.offset + i * p.stride;
  if (s >= hi) return {};
  return {std::max(s, lo), std::min(s + p.bytes, hi)};
}

/** The highest part of `p` inside [lo, hi). */
inline ByteRange last_piece(const Slices& p, std::uint64_t lo, std::uint64_t hi) {
  if (p.bytes == 0 || hi <= p.offset || lo >= p.end() || lo >= hi) return {};
  const std::uint64_t i =
      p.count == 1 ? 0 : std::min<std::uint64_t>(p.count - 1, (hi - 1 - p.offset) / p.stride);
  const std::uint64_t s = p.offset + i * p.stride;
  if (s + p.bytes <= lo) return {};
  return {std::max(s, lo), std::min(s + p.bytes, hi)};
}

/** True when no byte of [lo, hi) is in both a and b. */
inline bool disjoint_in(const Slices& a, const Slices& b, std::uint64_t lo, std::uint64_t hi) {
  if (a.count > 1 && b.count > 1 && a.stride == b.stride) {
    // Same period: slices that never share a residue modulo the stride never meet (the slices
    // of two parameters in one gather's flat buffer).
    const std::uint64_t m = a.stride;
    const std::uint64_t d = (b.offset % m + m - a.offset % m) % m;  // b's residue after a's
    if (d >= a.bytes && d + b.bytes <= m) return true;
  }
  // Otherwise piece by piece over a's slices in [lo, hi).
  for (ByteRange r = first_piece(a, lo, hi); !r.empty(); r = first_piece(a, r.hi, hi)) {
    if (!first_piece(b, r.lo, r.hi).empty()) return false;
  }
  return true;
}

/** The last write and the reads since, for every byte of one buffer lifetime. */
class ByteHistory {
 public:
  /** Starts a lifetime of `bytes` bytes that nothing has written. */
  void reset(std::uint64_t bytes) {
    segments_.clear();
    patterns_.reset();
    segments_.emplace(0, Segment{0, bytes, {}, false, {}});
    size_ = bytes;
  }

  /** Ends the lifetime: frees the map. */
  void clear() {
    segments_.clear();
    patterns_.reset();
    size_ = 0;
  }

  std::uint64_t size() const { return size_; }

  /** Records an access of [begin, end). For every earlier access of overlapping bytes that is
   *  not `ordered` before this one and conflicts (one of the two a write), calls
   *  on_conflict(prior_stamp, prior_mode, lo, hi) with overlapping bytes of the two; for every
   *  unwritten range a read touches, on_unwritten(lo, hi). */
  template <class Ordered, class OnConflict, class OnUnwritten>
  void access(std::uint64_t begin, std::uint64_t end, AccessMode mode, AccessStamp stamp,
              Ordered&& ordered, OnConflict&& on_conflict, OnUnwritten&& on_unwritten) {
    if (begin >= end) return;
    if (end > size_) throw std::out_of_range("access past the end of its buffer");
    const auto first = split_at(begin);
    const auto last = split_at(end);  // one past the last segment inside
    for (auto it = first; it != last; ++it) {
      Segment& seg = it->second;
      if (seg.written && seg.write.thread != stamp.thread && !ordered(seg.write)) {
        on_conflict(seg.write, AccessMode::kWrite, seg.begin, seg.end);
      }
      if (mode == AccessMode::kRead) {
        if (!seg.written) on_unwritten(seg.begin, seg.end);
        add_read(seg, stamp);
      } else {
        for (const Read& r : seg.reads) {
          if (r.stamp.thread == stamp.thread || ordered(r.stamp)) continue;
          const ByteRange piece = read_piece(r, seg);
          if (!piece.empty()) on_conflict(r.stamp, AccessMode::kRead, piece.lo, piece.hi);
        }
        seg.write = stamp;
        seg.written = true;
        seg.reads.clear();
      }
    }
    coalesce(first == segments_.begin() ? first : std::prev(first),
             last == segments_.end() ? last : std::next(last));
  }

  /** Records an access of the slices `p`, with the same answers as an access of each slice in
   *  turn: a read is one entry, with its pattern, in every segment it touches (a segment is
   *  split at slice bounds only where a read of the same thread partly overlaps it); a write
   *  is its slices in turn. */
  template <class Ordered, class OnConflict, class OnUnwritten>
  void access(const Slices& p, AccessMode mode, AccessStamp stamp, Ordered&& ordered,
              OnConflict&& on_conflict, OnUnwritten&& on_unwritten) {
    if (p.count <= 1 || mode == AccessMode::kWrite) {
      for (std::uint64_t i = 0; i < p.count; ++i) {
        const std::uint64_t b = p.offset + i * p.stride;
        access(b, b + p.bytes, mode, stamp, ordered, on_conflict, on_unwritten);
      }
      return;
    }
    if (p.bytes == 0) return;
    if (p.end() > size_) throw std::out_of_range("access past the end of its buffer");
    const auto first = split_at(p.offset);
    const auto last = split_at(p.end());
    std::uint32_t id = kWhole;
    for (auto it = first; it != last; ++it) {
      Segment& seg = it->second;
      const ByteRange piece = first_piece(p, seg.begin, seg.end);
      if (piece.empty()) continue;  // the segment lies in a gap
      if (seg.written && seg.write.thread != stamp.thread && !ordered(seg.write)) {
        on_conflict(seg.write, AccessMode::kWrite, piece.lo, piece.hi);
      }
      if (!seg.written) on_unwritten(piece.lo, last_piece(p, seg.begin, seg.end).hi);
      if (piece.lo == seg.begin && piece.hi == seg.end) {
        add_read(seg, stamp);  // the segment lies inside one slice
        continue;
      }
      // The latest read per thread and byte: an earlier read of this thread goes where this
      // one covers it. Kept beside it when disjoint; the segment is split when they overlap.
      bool overlap = false;
      Read* same = nullptr;
      for (Read& r : seg.reads) {
        if (r.stamp.thread != stamp.thread) continue;
        if (r.pattern != kWhole && (*patterns_)[r.pattern] == p) {
          same = &r;
        } else if (r.pattern == kWhole ||
                   !disjoint_in((*patterns_)[r.pattern], p, seg.begin, seg.end)) {
          overlap = true;
        }
      }
      if (overlap) {
        it = read_slices(it, p, stamp);
        continue;
      }
      if (id == kWhole) {
        if (!patterns_) patterns_ = std::make_unique<std::vector<Slices>>();
        id = static_cast<std::uint32_t>(patterns_->size());
        patterns_->push_back(p);
      }
      if (same) {
        *same = {stamp, id};
      } else {
        seg.reads.push_back({stamp, id});
      }
    }
    coalesce(first == segments_.begin() ? first : std::prev(first),
             last == segments_.end() ? last : std::next(last));
  }

  /** Segments held now (for tests). */
  std::size_t segment_count() const { return segments_.size(); }

 private:
  static constexpr std::uint32_t kWhole = std::numeric_limits<std::uint32_t>::max();

  /** A read since the last write: of the whole segment, or of its bytes in patterns_[pattern]. */
  struct Read {
    AccessStamp stamp;
    std::uint32_t pattern = kWhole;
    bool operator==(const Read&) const = default;
  };

  struct Segment {
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
    AccessStamp write;
    bool written = false;
    /** The latest read per thread and byte since the write; most segments have one or two,
     *  held in place (a heap block per segment was a fifth of a 1,024-rank check in malloc). */
    boost::container::small_vector<Read, 2> reads;

    bool same_state(const Segment& o) const {
      return written == o.written && write == o.write && reads == o.reads;
    }
  };

  ByteRange read_piece(const Read& r, const Segment& seg) const {
    if (r.pattern == kWhole) return {seg.begin, seg.end};
    return first_piece((*patterns_)[r.pattern], seg.begin, seg.end);
  }

  // A read of the whole segment replaces the earlier reads of its thread there.
  static void add_read(Segment& seg, AccessStamp stamp) {
    bool kept = false;
    std::size_t out = 0;
    for (std::size_t i = 0; i < seg.reads.size(); ++i) {
      if (seg.reads[i].stamp.thread == stamp.thread) {
        if (kept) continue;  // dropped: this read covers it
        // In place: a later read on the same thread is ordered after the earlier one.
        seg.reads[i] = {stamp, kWhole};
        kept = true;
      }
      seg.reads[out++] = seg.reads[i];
    }
    seg.reads.resize(out);
    if (!kept) seg.reads.push_back({stamp, kWhole});
  }

  // Splits the segment at `it` at the bounds of p's slices in it and reads each slice's part;
  // returns the last part.
  using Segments = std::map<std::uint64_t, Segment>;
  Segments::iterator read_slices(Segments::iterator it, const Slices& p, AccessStamp stamp) {
    const std::uint64_t end = it->second.end;
    for (ByteRange r = first_piece(p, it->second.begin, end); !r.empty();
         r = first_piece(p, r.hi, end)) {
      const auto part = split_at(r.lo);
      split_at(r.hi);
      add_read(part->second, stamp);
    }
    return std::prev(segments_.upper_bound(end - 1));
  }

  // A map from each segment's first byte: a split is a node insertion, where a vector's insert
  // moved every later segment.

  // The segment starting at `at`, splitting one if needed; end() when at == size_. A patterned
  // read that leaves one side is dropped there.
  Segments::iterator split_at(std::uint64_t at) {
    if (at >= size_) return segments_.end();
    auto it = std::prev(segments_.upper_bound(at));
    if (it->first == at) return it;
    Segment tail = it->second;
    tail.begin = at;
    it->second.end = at;
    prune(it->second);
    prune(tail);
    return segments_.emplace_hint(std::next(it), at, std::move(tail));
  }

  void prune(Segment& seg) const {
    seg.reads.erase(std::remove_if(seg.reads.begin(), seg.reads.end(),
                                   [&](const Read& r) { return read_piece(r, seg).empty(); }),
                    seg.reads.end());
  }

  // Merges neighbours in [from, to) that hold the same state.
  void coalesce(Segments::iterator from, Segments::iterator to) {
    if (from == to) return;
    auto out = from;
    for (auto it = std::next(from); it != to;) {
      if (out->second.same_state(it->second)) {
        out->second.end = it->second.end;
        it = segments_.erase(it);
      } else {
        out = it++;
      }
    }
  }

  Segments segments_;
  /** The slices of this lifetime's strided reads; made on the first (most buffers have none,
   *  and every rank holds a history per buffer). */
  std::unique_ptr<std::vector<Slices>> patterns_;
  std::uint64_t size_ = 0;
};

}  // namespace hpz::check
