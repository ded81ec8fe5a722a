// The access history of one buffer lifetime, byte-exact: an interval map from byte ranges to the
// last write and the reads since, each stamped with its thread and tick. Two accesses conflict
// only where their byte ranges overlap (a slice copy and an overlapping gathered view do;
// disjoint slices of one buffer do not), which is what keying on a tensor's start pointer misses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
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
    segments_.assign(1, Segment{0, bytes, {}, false, {}});
    size_ = bytes;
  }

  /** Ends the lifetime: frees the map. */
  void clear() {
    segments_.clear();
    segments_.shrink_to_fit();
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
    const std::size_t first = split_at(begin);
    const std::size_t last = split_at(end);  // one past the last segment inside
    for (std::size_t i = first; i < last; ++i) {
      Segment& seg = segments_[i];
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
    coalesce(first == 0 ? 0 : first - 1, std::min(last + 1, segments_.size()));
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

  // Index of the segment starting at `at`, splitting one if needed; size() when at == size_.
  std::size_t split_at(std::uint64_t at) {
    auto it = std::upper_bound(segments_.begin(), segments_.end(), at,
                               [](std::uint64_t x, const Segment& s) { return x < s.begin; });
    std::size_t i = static_cast<std::size_t>(it - segments_.begin()) - 1;
    if (segments_[i].begin == at) return i;
    if (at >= segments_[i].end) return i + 1;
    Segment tail = segments_[i];
    tail.begin = at;
    segments_[i].end = at;
    segments_.insert(segments_.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::move(tail));
    return i + 1;
  }

  void coalesce(std::size_t from, std::size_t to) {
    if (to <= from + 1) return;
    std::size_t out = from;
    for (std::size_t i = from + 1; i < to; ++i) {
      if (segments_[out].same_state(segments_[i])) {
        segments_[out].end = segments_[i].end;
      } else {
        ++out;
        if (out != i) segments_[out] = std::move(segments_[i]);
      }
    }
    const std::size_t removed = to - out - 1;
    if (removed > 0) {
      segments_.erase(segments_.begin() + static_cast<std::ptrdiff_t>(out) + 1,
                      segments_.begin() + static_cast<std::ptrdiff_t>(to));
    }
  }

  std::vector<Segment> segments_;
  std::uint64_t size_ = 0;
};

}  // namespace hpz::check
