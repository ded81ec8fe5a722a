#include "sim/ir/schedule.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "sim/error.hpp"

namespace hpz {
namespace {

constexpr std::array<std::string_view, 16> kOpKindNames = {"kernel",
                                                           "copy",
                                                           "all_gather",
                                                           "reduce_scatter",
                                                           "all_reduce",
                                                           "all_to_all",
                                                           "quantize",
                                                           "dequantize",
                                                           "event_record",
                                                           "stream_wait_event",
                                                           "host_stream_sync",
                                                           "host_device_sync",
                                                           "alloc",
                                                           "free",
                                                           "host_event_sync",
                                                           "record_stream"};
constexpr std::array<std::string_view, 6> kPhaseNames = {
    "init", "checkpoint_load", "forward", "backward", "grad_reduce", "optimizer"};
constexpr std::array<std::string_view, 28> kPurposeNames = {
    "param_init",        "param_fetch",
    "prefetch",          "weight_quantize",
    "weight_dequantize", "nccl_handshake",
    "fetch_wait",        "forward_compute",
    "recompute_forward", "backward_compute",
    "loss_gradient",     "param_release",
    "secondary_alloc",   "secondary_partition_copy",
    "fix_host_sync",     "fix_event_record",
    "fix_event_wait",    "grad_alloc",
    "grad_reduce",       "grad_norm",
    "optimizer_step",    "secondary_invalidate",
    "checkpoint_load",   "offload_copy",
    "step_sync",         "repro_spin",
    "host_throttle",     "other"};
constexpr std::array<std::string_view, 8> kRoleNames = {"primary",    "secondary", "full",
                                                        "quantized",  "grad_full", "grad_shard",
                                                        "activation", "scratch"};
constexpr std::array<std::string_view, 4> kGroupKindNames = {"world", "hpz", "inter_node",
                                                             "intra_node"};

template <typename Enum, std::size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, Enum e) {
  return names.at(static_cast<std::size_t>(e));
}

template <typename Enum, std::size_t N>
Enum parse_name(const std::array<std::string_view, N>& names, std::string_view s,
                const char* what) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<Enum>(i);
  }
  std::string allowed;
  for (auto n : names) allowed += (allowed.empty() ? "" : ", ") + std::string(n);
  throw InputError("", what, "unknown value '" + shown(s) + "' (allowed: " + allowed + ")");
}

// Op is the bulk of a large schedule (tens of millions at 1,024 ranks): keep new fields in its
// padding.
static_assert(sizeof(Op) <= 72, "Op grew");
static_assert(sizeof(Access) <= 32, "Access grew");

}  // namespace

bool is_collective(OpKind kind) {
  return kind == OpKind::kAllGather || kind == OpKind::kReduceScatter ||
         kind == OpKind::kAllReduce || kind == OpKind::kAllToAll;
}

bool is_host_sync(OpKind kind) {
  return kind == OpKind::kHostStreamSync || kind == OpKind::kHostDeviceSync ||
         kind == OpKind::kHostEventSync;
}

bool on_host(const Op& op) {
  return op.stream == kHostStream || is_host_sync(op.kind) || op.kind == OpKind::kRecordStream;
}

std::vector<Op>& OpList::mut() {
  std::vector<Op>& ops = ops_.mut();
  if (groups_) {
    for (Op& op : ops) op.group = own_group(op.group);
    groups_.reset();
  }
  return ops;
}

bool OpList::share_if_same(const OpList& other) {
  if (shares_with(other)) return true;  // shared with a group map checked when it was made
  if (size() != other.size()) return false;
  OpMatcher m(other);
  for (std::size_t i = 0; i < size(); ++i) {
    if (!m.add((*this)[i])) return false;
  }
  *this = m.shared();
  return true;
}

OpList OpList::sharing(const OpList& like, std::vector<GroupPair> groups) {
  OpList out;
  out.ops_ = like.ops_;
  const bool identity = std::all_of(groups.begin(), groups.end(),
                                    [](const GroupPair& p) { return p.copy == p.ours; });
  if (!identity) out.groups_ = std::make_shared<const std::vector<GroupPair>>(std::move(groups));
  return out;
}

bool OpMatcher::add(const Op& ours) {
  if (!ok_) return false;
  if (matched_ == like_->size()) return ok_ = false;
  const Op& stored = like_->ops_[matched_];  // the copy's own group
  if ((stored.group == kNoGroup) != (ours.group == kNoGroup)) return ok_ = false;
  Op same_group = stored;
  same_group.group = ours.group;
  if (!(same_group == ours)) return ok_ = false;
  if (stored.group != kNoGroup) {
    const auto seen = std::find_if(map_.begin(), map_.end(),
                                   [&](const GroupPair& p) { return p.copy == stored.group; });
    if (seen == map_.end()) {
      map_.push_back({stored.group, ours.group});
    } else if (seen->ours != ours.group) {
      return ok_ = false;
    }
    identity_ = identity_ && ours.group == stored.group;
  }
  ++matched_;
  return true;
}

std::vector<Op> OpMatcher::prefix() const {
  std::vector<Op> out(like_->ops_.begin(),
                      like_->ops_.begin() + static_cast<std::ptrdiff_t>(matched_));
  for (Op& op : out) {
    if (op.group == kNoGroup) continue;
    op.group = std::find_if(map_.begin(), map_.end(), [&](const GroupPair& p) {
                 return p.copy == op.group;
               })->ours;  // every group of a matched op was seen
  }
  return out;
}

OpList OpMatcher::shared() const {
  OpList out;
  if (!complete()) throw std::logic_error("OpMatcher::shared: the lists differ");
  out.ops_ = like_->ops_;
  if (!identity_) out.groups_ = std::make_shared<const std::vector<GroupPair>>(map_);
  return out;
}

AccessList::const_iterator::const_iterator(const AccessList* list, std::size_t i)
    : list_(list), i_(i) {
  // The first own block that does not end at or before i (blocks are disjoint and ascending,
  // so their ends ascend too).
  std::size_t lo = 0, hi = list_->own_begin_.size();
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (list_->own_end(mid) <= i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  block_ = lo;
}

const Access& AccessList::const_iterator::operator*() const {
  const AccessList& l = *list_;
  if (block_ < l.own_begin_.size() && i_ >= l.own_begin_[block_]) {
    return l.own_[l.own_at_[block_] + (i_ - l.own_begin_[block_])];
  }
  return l.base_[i_];
}

AccessList::const_iterator& AccessList::const_iterator::operator++() {
  ++i_;
  const AccessList& l = *list_;
  if (block_ < l.own_begin_.size() && i_ >= l.own_end(block_)) {
    ++block_;
  }
  return *this;
}

std::size_t AccessList::own_block(std::size_t i) const {
  // The last block that begins at or before i, if it reaches i.
  const auto it = std::upper_bound(own_begin_.begin(), own_begin_.end(), i,
                                   [](std::size_t v, std::uint32_t b) { return v < b; });
  if (it == own_begin_.begin()) return own_begin_.size();
  const auto k = static_cast<std::size_t>(it - own_begin_.begin()) - 1;
  return i < own_end(k) ? k : own_begin_.size();
}

const Access& AccessList::operator[](std::size_t i) const {
  if (own_begin_.empty()) return base_[i];
  const std::size_t k = own_block(i);
  return k == own_begin_.size() ? base_[i] : own_[own_at_[k] + (i - own_begin_[k])];
}

std::span<const Access> AccessList::block(std::uint32_t begin, std::uint32_t count) const {
  if (count == 0) return {};
  if (!own_begin_.empty()) {
    const std::size_t k = own_block(begin);
    if (k != own_begin_.size()) {
      return std::span<const Access>(own_).subspan(own_at_[k] + (begin - own_begin_[k]), count);
    }
  }
  return std::span<const Access>(base_.get()).subspan(begin, count);
}

std::span<const Access> AccessList::BlockReader::block(std::uint32_t begin, std::uint32_t count) {
  const AccessList& l = *list_;
  if (count == 0) return {};
  while (k_ < l.own_begin_.size() && l.own_end(k_) <= begin) ++k_;
  if (k_ < l.own_begin_.size() && l.own_begin_[k_] <= begin) {
    return std::span<const Access>(l.own_).subspan(l.own_at_[k_] + (begin - l.own_begin_[k_]),
                                                   count);
  }
  return std::span<const Access>(l.base_.get()).subspan(begin, count);
}

std::size_t AccessList::index_of(const Access* a) const {
  const std::vector<Access>& base = base_.get();
  if (!base.empty() && a >= base.data() && a < base.data() + base.size()) {
    return static_cast<std::size_t>(a - base.data());
  }
  const auto at = static_cast<std::size_t>(a - own_.data());
  const auto it = std::upper_bound(own_at_.begin(), own_at_.end(), at,
                                   [](std::size_t v, std::uint32_t b) { return v < b; });
  const auto k = static_cast<std::size_t>(it - own_at_.begin()) - 1;
  return own_begin_[k] + (at - own_at_[k]);
}

std::vector<Access>& AccessList::mut() {
  if (own_begin_.empty()) return base_.mut();
  std::vector<Access> plain(begin(), end());
  own_begin_.clear();
  own_at_.clear();
  own_.clear();
  own_.shrink_to_fit();
  base_ = SharedVector<Access>();
  base_.mut() = std::move(plain);
  return base_.mut();
}

void AccessList::share_blocks(const AccessList& base, const OpList& ops, const OpList& base_ops) {
  if (base_.shares_with(base.base_) || !ops.shares_with(base_ops) || size() != base.size()) return;
  const std::vector<Access>& theirs = base.base_.get();
  AccessList out = on_base_of(base);
  std::size_t covered = 0;  // every op's block so far ends at or before this index
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops.stored(i);  // shared: the same access_begin and access_count as base's
    if (op.access_count == 0) continue;
    // Own blocks must ascend and be disjoint: a list whose ops' blocks do not (no builder or
    // reader makes one) stays plain.
    if (op.access_begin < covered || std::size_t{op.access_begin} + op.access_count > size()) {
      return;
    }
    covered = std::size_t{op.access_begin} + op.access_count;
    const std::span<const Access> mine = block(op.access_begin, op.access_count);
    if (std::equal(mine.begin(), mine.end(), theirs.begin() + op.access_begin)) continue;
    out.add_own_block(op.access_begin, mine);
  }
  out.own_begin_.shrink_to_fit();
  out.own_at_.shrink_to_fit();
  out.own_.shrink_to_fit();
  *this = std::move(out);
}

AccessList AccessList::on_base_of(const AccessList& other) {
  AccessList out;
  out.base_ = other.base_;
  return out;
}

void AccessList::add_own_block(std::uint32_t begin, std::span<const Access> values) {
  const std::size_t last_end = own_begin_.empty() ? 0 : own_end(own_begin_.size() - 1);
  if (values.empty()) return;
  if (begin < last_end || std::size_t{begin} + values.size() > size()) {
    throw std::logic_error("AccessList::add_own_block: blocks out of order or past the end");
  }
  if (own_at_.empty()) own_at_.push_back(0);
  own_begin_.push_back(begin);
  own_.insert(own_.end(), values.begin(), values.end());
  own_at_.push_back(static_cast<std::uint32_t>(own_.size()));
}

void share_alike(RankSchedule& r, const RankSchedule& base) {
  r.ops.share_if_same(base.ops);
  r.buffers.share_if_equal(base.buffers);
  r.accesses.share_blocks(base.accesses, r.ops, base.ops);
}

bool has_strided_accesses(const Schedule& schedule) {
  for (const RankSchedule& rs : schedule.ranks) {
    for (const Access& a : rs.accesses) {
      if (a.strided()) return true;
    }
  }
  return false;
}

Schedule unfold_strided(const Schedule& schedule) {
  Schedule out = schedule;
  for (RankSchedule& rs : out.ranks) {
    if (std::none_of(rs.accesses.begin(), rs.accesses.end(),
                     [](const Access& a) { return a.strided(); })) {
      continue;
    }
    std::vector<Access> plain;
    std::vector<Op>& ops = rs.ops.mut();
    for (Op& op : ops) {
      const auto begin = static_cast<std::uint32_t>(plain.size());
      for (std::uint32_t k = 0; k < op.access_count; ++k) {
        Access a = rs.accesses[op.access_begin + k];
        if (!a.strided()) {
          plain.push_back(a);
          continue;
        }
        a.for_each_slice([&](std::uint64_t lo, std::uint64_t hi) {
          plain.push_back({a.buffer, a.mode, lo, hi - lo});
        });
      }
      op.access_begin = begin;
      op.access_count = static_cast<std::uint32_t>(plain.size() - begin);
    }
    rs.accesses = std::move(plain);
  }
  return out;
}

bool has_repro_spins(const Schedule& schedule) {
  for (const RankSchedule& rs : schedule.ranks) {
    for (const Op& op : rs.ops) {
      if (op.purpose == Purpose::kReproSpin) return true;
    }
  }
  return false;
}

Schedule with_spin_before_secondary_copies(const Schedule& schedule, double us) {
  Schedule out = schedule;
  for (RankSchedule& rs : out.ranks) {
    std::vector<Op> ops;
    ops.reserve(rs.ops.size());
    for (const Op& op : rs.ops) {  // by value: each rank's own groups
      if (op.kind == OpKind::kCopy && op.purpose == Purpose::kSecondaryPartitionCopy &&
          op.phase != Phase::kInit) {
        Op spin;
        spin.kind = OpKind::kKernel;
        spin.stream = op.stream;
        spin.phase = op.phase;
        spin.purpose = Purpose::kReproSpin;
        spin.step = op.step;
        spin.micro_step = op.micro_step;
        spin.unit = op.unit;
        spin.label = op.label;
        spin.spin_us = static_cast<float>(us);
        ops.push_back(spin);
      }
      ops.push_back(op);
    }
    rs.ops = OpList();
    rs.ops.mut() = std::move(ops);
  }
  return out;
}

int step_count(const Schedule& schedule) {
  std::int32_t last = 0;
  for (const RankSchedule& rs : schedule.ranks) {
    for (const Op& op : rs.ops) last = std::max(last, op.step);
  }
  return last + 1;
}

std::string schedule_label(const std::string& variant,
                           const std::map<std::string, std::string>& source) {
  const auto deepspeed = source.find("deepspeed");
  const auto builder = source.find("builder");
  const bool built = builder != source.end() && builder->second == "deepspeed";
  const std::string version = deepspeed == source.end() ? ""
                                                        : ", DeepSpeed " + deepspeed->second +
                                                              (built ? " built" : " recorded");
  return (variant.empty() ? "?" : variant) + version;
}

std::string_view to_string(OpKind k) {
  return name_of(kOpKindNames, k);
}
std::string_view to_string(Phase p) {
  return name_of(kPhaseNames, p);
}
std::string_view to_string(Purpose p) {
  return name_of(kPurposeNames, p);
}
std::string_view to_string(BufferRole r) {
  return name_of(kRoleNames, r);
}
std::string_view to_string(GroupKind k) {
  return name_of(kGroupKindNames, k);
}

OpKind parse_op_kind(std::string_view s) {
  return parse_name<OpKind>(kOpKindNames, s, "kind");
}
Phase parse_phase(std::string_view s) {
  return parse_name<Phase>(kPhaseNames, s, "phase");
}
Purpose parse_purpose(std::string_view s) {
  return parse_name<Purpose>(kPurposeNames, s, "purpose");
}
BufferRole parse_buffer_role(std::string_view s) {
  return parse_name<BufferRole>(kRoleNames, s, "role");
}
GroupKind parse_group_kind(std::string_view s) {
  return parse_name<GroupKind>(kGroupKindNames, s, "group kind");
}

const char* to_string(Fill f) {
  switch (f) {
    case Fill::kNan:
      return "nan";
    case Fill::kStale:
      return "stale";
    case Fill::kZero:
      return "zero";
  }
  return "unknown";
}

}  // namespace hpz
