#include "sim/ir/schedule.hpp"

#include <algorithm>
#include <array>
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
    for (Op& op : ops) {
      if (op.group != kNoGroup) op.group = (*groups_)[static_cast<std::size_t>(op.group)];
    }
    groups_.reset();
  }
  return ops;
}

bool OpList::share_if_same(const OpList& other) {
  if (shares_with(other) && groups_ == other.groups_) return true;
  if (size() != other.size()) return false;
  // map[g]: our group for the shared copy's group g, kNoGroup until seen.
  std::vector<GroupId> map;
  bool identity = true;
  for (std::size_t i = 0; i < size(); ++i) {
    const Op& stored = other.ops_[i];  // the copy's own group
    const Op ours = (*this)[i];
    if ((stored.group == kNoGroup) != (ours.group == kNoGroup)) return false;
    Op same_group = stored;
    same_group.group = ours.group;
    if (!(same_group == ours)) return false;
    if (stored.group == kNoGroup) continue;
    const auto g = static_cast<std::size_t>(stored.group);
    if (map.size() <= g) map.resize(g + 1, kNoGroup);
    if (map[g] == kNoGroup) {
      map[g] = ours.group;
    } else if (map[g] != ours.group) {
      return false;
    }
    identity = identity && ours.group == stored.group;
  }
  ops_ = other.ops_;
  if (identity) {
    groups_.reset();
  } else {
    groups_ = std::make_shared<const std::vector<GroupId>>(std::move(map));
  }
  return true;
}

void share_alike(RankSchedule& r, const RankSchedule& base) {
  r.ops.share_if_same(base.ops);
  r.buffers.share_if_equal(base.buffers);
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
