#include "sim/check/allocator.hpp"

#include <algorithm>
#include <stdexcept>

namespace hpz::check {
namespace {

/** The uses of `from` that overlap [lo, hi), clipped to it. */
PendingUses overlapping(const PendingUses& from, std::uint64_t lo, std::uint64_t hi) {
  PendingUses out;
  for (const PendingUse& u : from) {
    if (u.hi <= lo || u.lo >= hi) continue;
    PendingUse c = u;
    c.lo = std::max(u.lo, lo);
    c.hi = std::min(u.hi, hi);
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::uint64_t CachingAllocator::round_size(std::uint64_t bytes) {
  // round_size: kMinBlockSize for anything smaller, else a multiple of it.
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

void CachingAllocator::insert_free(std::uint64_t address, Block& b) {
  b.free = true;
  free_.insert(Key{b.stream, b.small, b.size, address});
}

void CachingAllocator::erase_free(std::uint64_t address, const Block& b) {
  free_.erase(Key{b.stream, b.small, b.size, address});
}

std::pair<std::uint64_t, PendingUses> CachingAllocator::allocate(StreamId stream,
                                                                 std::uint64_t bytes) {
  const std::uint64_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  // get_free_block: the first block at or after (stream, size) in the pool's order, if it is
  // the same stream's.
  auto it = free_.lower_bound(Key{stream, small, size, 0});
  std::uint64_t address = 0;
  if (it != free_.end() && std::get<0>(*it) == stream && std::get<1>(*it) == small) {
    address = std::get<3>(*it);
    free_.erase(it);
  } else {
    // alloc_block: a new segment of get_allocation_size.
    std::uint64_t seg = kSmallBuffer;
    if (!small) {
      seg = size < kMinLargeAlloc ? kLargeBuffer
                                  : kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
    }
    address = next_segment_;
    next_segment_ += seg + kRoundLarge;  // a gap: segments never merge
    ++segments_;
    Block b;
    b.size = seg;
    b.segment = address;
    b.stream = stream;
    b.small = small;
    blocks_.emplace(address, b);
  }
  Block& b = blocks_.at(address);
  b.free = false;
  // should_split: the rest must be worth a block of its own.
  const std::uint64_t rest = b.size - size;
  const bool split = small ? rest >= kMinBlockSize : rest > kSmallSize;
  if (split) {
    Block r;
    r.size = rest;
    r.segment = b.segment;
    r.stream = b.stream;
    r.small = b.small;
    r.pending = overlapping(b.pending, address + size, address + b.size);
    b.size = size;
    auto [rit, fresh] = blocks_.emplace(address + size, std::move(r));
    if (!fresh) throw std::logic_error("caching allocator: split onto a live block");
    insert_free(rit->first, rit->second);
  }
  PendingUses uses = overlapping(b.pending, address, address + b.size);
  b.pending.clear();
  return {address, std::move(uses)};
}

void CachingAllocator::free(std::uint64_t address, PendingUses pending) {
  auto it = blocks_.find(address);
  if (it == blocks_.end() || it->second.free) {
    throw std::logic_error("caching allocator: free of a block not allocated");
  }
  Block& b = it->second;
  for (PendingUse& u : pending) {
    u.lo = address;
    u.hi = address + b.size;
  }
  b.pending = std::move(pending);
  // free_block -> try_merge_blocks with the previous and the next block of the segment.
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    Block& p = prev->second;
    if (p.free && p.segment == b.segment && prev->first + p.size == address) {
      erase_free(prev->first, p);
      p.size += b.size;
      p.pending.insert(p.pending.end(), b.pending.begin(), b.pending.end());
      blocks_.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  Block& m = it->second;
  if (next != blocks_.end() && next->second.free && next->second.segment == m.segment &&
      it->first + m.size == next->first) {
    erase_free(next->first, next->second);
    m.size += next->second.size;
    m.pending.insert(m.pending.end(), next->second.pending.begin(), next->second.pending.end());
    blocks_.erase(next);
  }
  insert_free(it->first, it->second);
}

}  // namespace hpz::check
