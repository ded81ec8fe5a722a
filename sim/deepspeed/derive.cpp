#include "sim/deepspeed/derive.hpp"

#include <algorithm>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "sim/ir/shard.hpp"

namespace hpz::deepspeed {
namespace {

/** The change per rank from a to b over `ranks` ranks, when it is a whole number. */
bool slope_of(std::uint64_t a, std::uint64_t b, std::int64_t ranks, std::int64_t* slope) {
  // Offsets may wrap (part() of a slice past the parameter's end: a clamped start minus the
  // slice's start), so the difference is taken modulo 2^64 and read as signed.
  const auto diff = static_cast<std::int64_t>(b - a);
  if (diff % ranks != 0) return false;
  *slope = diff / ranks;
  return true;
}

std::uint64_t along(std::uint64_t a, std::int64_t slope, std::int64_t ranks) {
  return a + static_cast<std::uint64_t>(slope) * static_cast<std::uint64_t>(ranks);
}

}  // namespace

RankKinds rank_kinds(const Schedule& s, int gpus_per_node, Rank mismatch_rank) {
  const int world = s.world_size;
  const int hpz = std::max(s.hpz_size, 1);
  std::vector<ShardLayout> layouts;
  layouts.reserve(s.units.size());
  for (const ParamUnit& u : s.units) layouts.emplace_back(u.numel, world, hpz);
  RankKinds k;
  k.kind_of.resize(static_cast<std::size_t>(world));
  k.place.resize(static_cast<std::size_t>(world));
  // A rank's key as bytes: its hpZ position, its index in its node (the builder reads it only
  // through its qgZ groups, which are paired; kept so that ranks of one kind are alike in it
  // too where hpZ is smaller than a node), whether it is rank 0 or the mismatched rank, and
  // each parameter's real elements in its primary slice.
  constexpr std::size_t kFixed = 4;
  const int local = std::max(gpus_per_node, 1);
  std::unordered_map<std::string, std::int32_t> ids;
  std::vector<std::uint64_t> key(kFixed + layouts.size());
  std::string bytes;
  for (Rank r = 0; r < world; ++r) {
    key[0] = static_cast<std::uint64_t>(r % hpz);
    key[1] = static_cast<std::uint64_t>(r % local);
    key[2] = r == 0 ? 1 : 0;
    key[3] = r == mismatch_rank ? 1 : 0;
    for (std::size_t p = 0; p < layouts.size(); ++p) {
      key[kFixed + p] = layouts[p].valid(layouts[p].primary_slice(r)).size();
    }
    bytes.assign(reinterpret_cast<const char*>(key.data()), key.size() * sizeof(std::uint64_t));
    const auto [it, added] = ids.try_emplace(bytes, static_cast<std::int32_t>(k.members.size()));
    if (added) k.members.emplace_back();
    const auto i = static_cast<std::size_t>(r);
    k.kind_of[i] = it->second;
    std::vector<Rank>& members = k.members[static_cast<std::size_t>(it->second)];
    k.place[i] = static_cast<std::int32_t>(members.size());
    members.push_back(r);
  }
  return k;
}

std::optional<std::vector<GroupPair>> Derivation::groups_for(const Schedule& s,
                                                             const WorldIndex& index,
                                                             Rank r) const {
  // Each rank's groups ascending: its hpZ group, the world, its node's and its local index's
  // (qgZ), the gradients' clone of the world (add_groups in build.cpp makes them in that order).
  const std::span<const GroupId> theirs = index.groups_of(first_);
  const std::span<const GroupId> ours = index.groups_of(r);
  if (theirs.size() != ours.size()) return std::nullopt;
  const RankSchedule& first = s.ranks[static_cast<std::size_t>(first_)];
  std::vector<GroupPair> out;
  out.reserve(copy_groups_.size());
  for (const GroupId cg : copy_groups_) {
    const GroupId g = first.ops.own_group(cg);
    const auto at = std::find(theirs.begin(), theirs.end(), g);
    if (at == theirs.end()) return std::nullopt;
    const GroupId mine = ours[static_cast<std::size_t>(at - theirs.begin())];
    const Group& a = s.groups[static_cast<std::size_t>(g)];
    const Group& b = s.groups[static_cast<std::size_t>(mine)];
    if (a.kind != b.kind || a.ranks.size() != b.ranks.size() ||
        (a.kind == GroupKind::kWorld && a.name != b.name)) {
      return std::nullopt;
    }
    out.push_back({cg, mine});
  }
  return out;
}

std::optional<Derivation> Derivation::make(const Schedule& s, const WorldIndex& index, Rank first,
                                           Rank second) {
  const RankSchedule& a = s.ranks[static_cast<std::size_t>(first)];
  const RankSchedule& b = s.ranks[static_cast<std::size_t>(second)];
  if (!b.ops.shares_with(a.ops) || !b.accesses.shares_with(a.accesses) ||
      !(b.buffers.shares_with(a.buffers) || b.buffers.get() == a.buffers.get()) ||
      a.streams.size() != b.streams.size()) {
    return std::nullopt;
  }
  for (std::size_t i = 0; i < a.streams.size(); ++i) {
    if (a.streams[i].name != b.streams[i].name) return std::nullopt;
  }
  Derivation d;
  d.first_ = first;
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const GroupId g = a.ops.stored(i).group;
    if (g != kNoGroup &&
        std::find(d.copy_groups_.begin(), d.copy_groups_.end(), g) == d.copy_groups_.end()) {
      d.copy_groups_.push_back(g);
    }
  }
  // The second rank's groups must be the pairing's.
  const std::optional<std::vector<GroupPair>> pairs = d.groups_for(s, index, second);
  if (!pairs) return std::nullopt;
  for (const GroupPair& p : *pairs) {
    if (b.ops.own_group(p.copy) != p.ours) return std::nullopt;
  }
  const auto ranks = static_cast<std::int64_t>(second - first);
  AccessList::BlockReader first_blocks(a.accesses), second_blocks(b.accesses);
  std::uint32_t covered = 0;
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const Op& op = a.ops.stored(i);
    if (op.access_count == 0) continue;
    if (op.access_begin < covered) return std::nullopt;  // blocks must ascend (share_blocks)
    covered = op.access_begin + op.access_count;
    const std::span<const Access> x = first_blocks.block(op.access_begin, op.access_count);
    const std::span<const Access> y = second_blocks.block(op.access_begin, op.access_count);
    const std::span<const Access> base = a.accesses.base_block(op.access_begin, op.access_count);
    const bool moves = !std::equal(x.begin(), x.end(), y.begin());
    if (!moves && std::equal(x.begin(), x.end(), base.begin())) continue;
    d.blocks_.push_back({op.access_begin, op.access_count,
                         static_cast<std::uint32_t>(d.first_accesses_.size()), moves});
    for (std::size_t k = 0; k < x.size(); ++k) {
      Slope sl;
      if (moves) {
        if (x[k].buffer != y[k].buffer || x[k].mode != y[k].mode ||
            !slope_of(x[k].offset, y[k].offset, ranks, &sl.offset) ||
            !slope_of(x[k].bytes, y[k].bytes, ranks, &sl.bytes) ||
            !slope_of(x[k].stride, y[k].stride, ranks, &sl.stride) ||
            !slope_of(x[k].count, y[k].count, ranks, &sl.count)) {
          return std::nullopt;
        }
      }
      d.first_accesses_.push_back(x[k]);
      d.slopes_.push_back(sl);
    }
  }
  return d;
}

std::optional<RankSchedule> Derivation::derive(const Schedule& s, const WorldIndex& index,
                                               Rank r) const {
  std::optional<std::vector<GroupPair>> pairs = groups_for(s, index, r);
  if (!pairs) return std::nullopt;
  const RankSchedule& a = s.ranks[static_cast<std::size_t>(first_)];
  RankSchedule out;
  out.rank = r;
  out.streams = a.streams;
  out.buffers = a.buffers;
  out.ops = OpList::sharing(a.ops, std::move(*pairs));
  out.accesses = AccessList::on_base_of(a.accesses);
  const auto ranks = static_cast<std::int64_t>(r - first_);
  std::vector<Access> moved;
  for (const Block& b : blocks_) {
    const std::span<const Access> x(first_accesses_.data() + b.at, b.count);
    if (!b.moves) {
      out.accesses.add_own_block(b.begin, x);
      continue;
    }
    moved.assign(x.begin(), x.end());
    for (std::uint32_t k = 0; k < b.count; ++k) {
      const Slope& sl = slopes_[b.at + k];
      Access& m = moved[k];
      m.offset = along(m.offset, sl.offset, ranks);
      m.bytes = along(m.bytes, sl.bytes, ranks);
      const std::uint64_t stride = along(m.stride, sl.stride, ranks);
      const std::uint64_t count = along(m.count, sl.count, ranks);
      if (stride > std::numeric_limits<std::uint32_t>::max() ||
          count > std::numeric_limits<std::uint16_t>::max()) {
        return std::nullopt;
      }
      m.stride = static_cast<std::uint32_t>(stride);
      m.count = static_cast<std::uint16_t>(count);
    }
    const std::span<const Access> base = a.accesses.base_block(b.begin, b.count);
    if (!std::equal(moved.begin(), moved.end(), base.begin())) {
      out.accesses.add_own_block(b.begin, moved);
    }
  }
  return out;
}

bool same_rank_schedule(const RankSchedule& a, const RankSchedule& b) {
  if (a.rank != b.rank || a.streams.size() != b.streams.size() || a.ops.size() != b.ops.size() ||
      a.accesses.size() != b.accesses.size() || a.buffers.get() != b.buffers.get()) {
    return false;
  }
  for (std::size_t i = 0; i < a.streams.size(); ++i) {
    if (a.streams[i].name != b.streams[i].name) return false;
  }
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    if (!(a.ops[i] == b.ops[i])) return false;
  }
  return std::equal(a.accesses.begin(), a.accesses.end(), b.accesses.begin());
}

}  // namespace hpz::deepspeed
