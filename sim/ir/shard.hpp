// Shard arithmetic as DeepSpeed's ZeRO-3 does it: a parameter of `numel` elements is padded to a
// multiple of the world size P; rank r owns the primary slice [r*S, (r+1)*S) with S = padded/P;
// with hpZ, rank r at position g in its group of P' ranks owns the secondary slice
// [g*S', (g+1)*S') with S' = padded/P'. Slices may reach into, or lie entirely in, the padding.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hpz {

/** A half-open element range [begin, end) of a flattened parameter. */
struct ElemRange {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return size() == 0; }
  bool operator==(const ElemRange&) const = default;
};

/** How one parameter unit is cut into primary and secondary shards. */
class ShardLayout {
 public:
  /** Requires world_size % hpz_size == 0 (the scenario validates it). */
  ShardLayout(std::uint64_t numel, int world_size, int hpz_size);

  std::uint64_t numel() const { return numel_; }
  std::uint64_t padded_numel() const { return padded_; }
  /** Elements per primary shard, S = padded / P. */
  std::uint64_t shard_numel() const { return padded_ / world_; }
  /** Elements per secondary shard, S' = padded / P'. */
  std::uint64_t secondary_numel() const { return padded_ / hpz_; }

  /** Rank r's primary slice of the padded parameter. */
  ElemRange primary_slice(int rank) const;
  /** The secondary slice of the rank at position `group_pos` in its hpZ group. */
  ElemRange secondary_slice(int group_pos) const;
  /** The part of a slice that holds real elements (not padding); empty when all padding. */
  ElemRange valid(ElemRange r) const;
  /** Pre-PR-5216 copy bounds: the secondary copy happened only when the rank's *primary* slice
   *  lay entirely inside the parameter. */
  bool legacy_copy_happens(int rank) const;

 private:
  std::uint64_t numel_;
  std::uint64_t padded_;
  std::uint64_t world_;
  std::uint64_t hpz_;
};

}  // namespace hpz
