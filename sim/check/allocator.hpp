// PyTorch's CUDA caching allocator, as far as the checker needs it: which freed memory a new
// allocation gets, and which streams may still use that memory. The checker's use-after-free
// rule (checker.hpp) asks it at every kAlloc and kFree of a schedule whose Schedule::allocator
// is set.
//
// Rules, from c10/cuda/CUDACachingAllocator.cpp (the same in torch 2.1.2 and 2.10; line numbers
// in docs/checker.md#use-after-free-across-streams):
//  - A block belongs to the stream current at its allocation, and only an allocation on that
//    stream reuses it (get_free_block searches the pool by (stream, size, address)).
//  - Sizes round up to 512 bytes (round_size, kMinBlockSize). Requests up to 1 MiB (kSmallSize)
//    come from the small pool, larger ones from the large pool.
//  - Best fit: the smallest free block of the stream's pool that holds the request, the lowest
//    address among equals.
//  - A block bigger than the request is split (should_split: the rest is at least 512 bytes in
//    the small pool, more than 1 MiB in the large one); the rest stays free.
//  - No fit: a new segment from cudaMalloc, 2 MiB for a small request (kSmallBuffer), 20 MiB up
//    to 10 MiB (kLargeBuffer, kMinLargeAlloc), else the request rounded up to 2 MiB
//    (kRoundLarge); fresh memory that no stream used.
//  - free(): a block with no recorded stream_uses returns to its pool at once, merged with its
//    free neighbours in the segment; with recorded streams, only after an event recorded on
//    each of them at the free has completed (insert_events, process_events).
// What is not modelled: addresses (segments get consecutive made-up ones, so the lowest-address
// tie break follows allocation order), the release of cached segments (empty_cache, an OOM
// retry), expandable segments and the max_split_size / roundup_power2_divisions settings (off
// by default).
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "sim/check/byte_history.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::check {

/** An access that may still be running when its memory is reused: the op and where it ran. */
struct PendingUse {
  AccessStamp stamp;
  AccessMode mode = AccessMode::kRead;
  BufferId buffer = kNoBuffer;    ///< the buffer it accessed, in the lifetime that was freed
  std::uint32_t free_op = kNoOp;  ///< the kFree that ended that lifetime
  StreamId block_stream = 0;      ///< the stream the freed buffer was allocated on
  std::uint64_t lo = 0;           ///< the memory it is pending on: [lo, hi), made-up addresses
  std::uint64_t hi = 0;
  bool operator==(const PendingUse&) const = default;
};

using PendingUses = boost::container::small_vector<PendingUse, 2>;

/** One rank's caching allocator. Addresses are made up; sizes, pools, streams, splitting and
 *  merging are the allocator's. */
class CachingAllocator {
 public:
  static constexpr std::uint64_t kMinBlockSize = 512;         ///< round_size's unit
  static constexpr std::uint64_t kSmallSize = 1u << 20;       ///< largest small-pool request
  static constexpr std::uint64_t kSmallBuffer = 2u << 20;     ///< small-pool segment
  static constexpr std::uint64_t kMinLargeAlloc = 10u << 20;  ///< up to this: a kLargeBuffer
  static constexpr std::uint64_t kLargeBuffer = 20u << 20;    ///< large-pool segment
  static constexpr std::uint64_t kRoundLarge = 2u << 20;      ///< larger segments round to this

  /** The rounded size of a request (round_size). */
  static std::uint64_t round_size(std::uint64_t bytes);

  /** Allocates `bytes` on `stream`: the block's address and the uses its memory may still have
   *  (those of the freed blocks it reuses that overlap it; empty for fresh memory). */
  std::pair<std::uint64_t, PendingUses> allocate(StreamId stream, std::uint64_t bytes);

  /** Frees the block at `address` (from allocate); `pending` are the uses that may still run
   *  when the allocator hands the memory out again (their lo/hi are set here: the block's). */
  void free(std::uint64_t address, PendingUses pending);

  /** Blocks (free and in use) and segments, for tests. */
  std::size_t block_count() const { return blocks_.size(); }
  std::size_t segment_count() const { return segments_; }

 private:
  struct Block {
    std::uint64_t size = 0;
    std::uint64_t segment = 0;  ///< the segment's base address
    StreamId stream = 0;
    bool small = true;
    bool free = false;
    PendingUses pending;
  };
  using Key =
      std::tuple<StreamId, bool, std::uint64_t, std::uint64_t>;  // stream, small, size, addr

  void insert_free(std::uint64_t address, Block& b);
  void erase_free(std::uint64_t address, const Block& b);

  std::map<std::uint64_t, Block> blocks_;  ///< by address
  std::set<Key> free_;                     ///< free blocks, best fit first
  std::uint64_t next_segment_ = 1u << 30;
  std::size_t segments_ = 0;
};

}  // namespace hpz::check
