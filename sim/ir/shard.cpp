#include "sim/ir/shard.hpp"

#include <cassert>

namespace hpz {

ShardLayout::ShardLayout(std::uint64_t numel, int world_size, int hpz_size)
    : numel_(numel),
      padded_((numel + world_size - 1) / world_size * world_size),
      world_(world_size),
      hpz_(hpz_size) {
  assert(world_size > 0 && hpz_size > 0 && world_size % hpz_size == 0);
}

ElemRange ShardLayout::primary_slice(int rank) const {
  const std::uint64_t s = shard_numel();
  return {rank * s, (rank + 1) * s};
}

ElemRange ShardLayout::secondary_slice(int group_pos) const {
  const std::uint64_t s = secondary_numel();
  return {group_pos * s, (group_pos + 1) * s};
}

ElemRange ShardLayout::valid(ElemRange r) const {
  const std::uint64_t begin = std::min(r.begin, numel_);
  return {begin, std::max(begin, std::min(r.end, numel_))};
}

bool ShardLayout::legacy_copy_happens(int rank) const {
  const ElemRange p = primary_slice(rank);
  return p.begin < numel_ && p.end <= numel_;
}

}  // namespace hpz
