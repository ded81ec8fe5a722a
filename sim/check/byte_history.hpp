// The access history of one buffer lifetime, byte-exact: an interval map from byte ranges to the
// last write and the reads since, each stamped with its thread and tick. Two accesses conflict
// only where their byte ranges overlap (a slice copy and an overlapping gathered view do;
// disjoint slices of one buffer do not), which is what keying on a tensor's start pointer misses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
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

/** The last write and the reads since, for every byte of one buffer lifetime. */
class ByteHistory {
 public:
  /** Starts a lifetime of `bytes` bytes that nothing has written. */
  void reset(std::uint64_t bytes) {
    segments_.clear();
    segments_.emplace(0, Segment{0, bytes, {}, false, {}});
    size_ = bytes;
  }

  /** Ends the lifetime: frees the map. */
  void clear() {
    segments_.clear();
    size_ = 0;
  }

  std::uint64_t size() const { return size_; }

  /** Records an access of [begin, end). For every earlier access of overlapping bytes that is
   *  not `ordered` before this one and conflicts (one of the two a write), calls
   *  on_conflict(prior_stamp, prior_mode, lo, hi); for every unwritten range a read touches,
   *  on_unwritten(lo, hi). */
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
        for (const AccessStamp& r : seg.reads) {
          if (r.thread != stamp.thread && !ordered(r)) {
            on_conflict(r, AccessMode::kRead, seg.begin, seg.end);
          }
        }
        seg.write = stamp;
        seg.written = true;
        seg.reads.clear();
      }
    }
    coalesce(first == segments_.begin() ? first : std::prev(first),
             last == segments_.end() ? last : std::next(last));
  }

 private:
  struct Segment {
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
    AccessStamp write;
    bool written = false;
    std::vector<AccessStamp> reads;  ///< the latest read per thread since the write

    bool same_state(const Segment& o) const {
      return written == o.written && write == o.write && reads == o.reads;
    }
  };

  static void add_read(Segment& seg, AccessStamp stamp) {
    for (AccessStamp& r : seg.reads) {
      if (r.thread == stamp.thread) {
        r = stamp;  // a later read on the same thread is ordered after the earlier one
        return;
      }
    }
    seg.reads.push_back(stamp);
  }

  // A map from each segment's first byte: a split is a node insertion, where a vector's insert
  // moved every later segment (an op that reads one slice per rank of a 1,024-rank gather splits
  // one buffer 1,024 times).
  using Segments = std::map<std::uint64_t, Segment>;

  // The segment starting at `at`, splitting one if needed; end() when at == size_.
  Segments::iterator split_at(std::uint64_t at) {
    if (at >= size_) return segments_.end();
    auto it = std::prev(segments_.upper_bound(at));
    if (it->first == at) return it;
    Segment tail = it->second;
    tail.begin = at;
    it->second.end = at;
    return segments_.emplace_hint(std::next(it), at, std::move(tail));
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
  std::uint64_t size_ = 0;
};

}  // namespace hpz::check
