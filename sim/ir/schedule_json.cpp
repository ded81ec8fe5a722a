#include "sim/ir/schedule_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "sim/error.hpp"
#include "sim/input.hpp"

namespace hpz {
namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;
/** Largest step (and micro-step) a schedule file may have: far beyond any run. */
constexpr std::int32_t kMaxScheduleStep = 1'000'000;

json access_to_json(const Access& a) {
  json j = json::array({a.buffer, a.mode == AccessMode::kWrite ? "w" : "r", a.offset, a.bytes});
  if (a.strided()) {
    j.push_back(a.count);
    j.push_back(a.stride);
  }
  return j;
}

json op_to_json(const RankSchedule& rank, const Op& op) {
  json j = {{"kind", to_string(op.kind)},
            {"phase", to_string(op.phase)},
            {"purpose", to_string(op.purpose)},
            {"stream", op.stream},
            {"step", op.step}};
  // Fields at their default are left out: a 1,024-rank schedule is large enough already.
  if (op.micro_step != 0) j["micro_step"] = op.micro_step;
  if (op.unit != kNoUnit) j["unit"] = op.unit;
  if (op.group != kNoGroup) j["group"] = op.group;
  if (op.event != kNoEvent) j["event"] = op.event;
  if (op.buffer != kNoBuffer) j["buffer"] = op.buffer;
  if (op.flops != 0) j["flops"] = op.flops;
  if (op.mem_bytes != 0) j["mem_bytes"] = op.mem_bytes;
  if (op.comm_bytes != 0) j["comm_bytes"] = op.comm_bytes;
  if (op.spin_us != 0) j["spin_us"] = op.spin_us;
  if (op.label != kNoLabel) j["label"] = op.label;
  if (op.kind == OpKind::kAlloc) j["fill"] = to_string(static_cast<Fill>(op.fill));
  if (op.access_count != 0) {
    json accesses = json::array();
    for (std::uint32_t i = 0; i < op.access_count; ++i) {
      accesses.push_back(access_to_json(rank.accesses[op.access_begin + i]));
    }
    j["accesses"] = std::move(accesses);
  }
  return j;
}

/** A rank written like `base` (written in full before it), when the two share one op list and
 *  buffer table (OpList::shares_with): {"rank", "like", "groups": [[g, g2], ...], "accesses":
 *  [[op, [access, ...]], ...]}, the accesses only of the ops whose accesses differ. */
json like_to_json(const Schedule& s, const RankSchedule& rank, const RankSchedule& base) {
  std::map<GroupId, GroupId> to;
  json accesses = json::array();
  for (std::size_t i = 0; i < rank.ops.size(); ++i) {
    const Op ours = rank.ops[i];
    const Op theirs = base.ops[i];
    if (ours.group != kNoGroup && ours.group != theirs.group) to[theirs.group] = ours.group;
    const auto a = s.accesses_of(rank.rank, ours);
    const auto b = s.accesses_of(base.rank, theirs);
    if (std::equal(a.begin(), a.end(), b.begin(), b.end())) continue;
    json list = json::array();
    for (const Access& x : a) list.push_back(access_to_json(x));
    accesses.push_back(json::array({i, std::move(list)}));
  }
  json groups = json::array();
  for (const auto& [g, g2] : to) groups.push_back(json::array({g, g2}));
  json j = {{"rank", rank.rank}, {"like", base.rank}, {"groups", std::move(groups)}};
  if (!accesses.empty()) j["accesses"] = std::move(accesses);
  return j;
}

json rank_to_json(const RankSchedule& rank) {
  json streams = json::array();
  for (const auto& s : rank.streams) streams.push_back(s.name);
  json buffers = json::array();
  for (const auto& b : rank.buffers) {
    json jb = {{"name", b.name}, {"role", to_string(b.role)}, {"bytes", b.bytes}};
    if (b.unit != kNoUnit) jb["unit"] = b.unit;
    if (b.on_host) jb["on_host"] = true;
    buffers.push_back(std::move(jb));
  }
  json ops = json::array();
  for (const auto& op : rank.ops) ops.push_back(op_to_json(rank, op));
  return {{"rank", rank.rank}, {"streams", streams}, {"buffers", buffers}, {"ops", ops}};
}

/** Reads one field with a clear error naming the path inside the document. */
template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {};

class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  template <typename T>
  T get(const json& j, const char* key, const std::string& path) const {
    const std::string at = path.empty() ? std::string(key) : path + "." + key;
    if (!j.is_object() || !j.contains(key)) fail(at, "missing");
    return as<T>(j.at(key), at);
  }
  template <typename T>
  T get_or(const json& j, const char* key, T fallback, const std::string& path) const {
    if (!j.contains(key)) return fallback;
    return as<T>(j.at(key), path + "." + key);
  }
  template <typename T>
  T as(const json& j, const std::string& path) const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return integer<T>(j, path);
    } else if constexpr (is_vector<T>::value) {
      // Element by element, so that integers in nested lists are range-checked too.
      if (!j.is_array()) fail(path, "wrong type: " + std::string(j.type_name()));
      T out;
      for (std::size_t i = 0; i < j.size(); ++i) {
        out.push_back(as<typename T::value_type>(j[i], path + "[" + std::to_string(i) + "]"));
      }
      return out;
    } else {
      try {
        return j.get<T>();
      } catch (const json::exception&) {
        fail(path, "wrong type: " + std::string(j.type_name()));
      }
    }
  }
  /** An integer of type T: nlohmann's get<int> casts a float or a wide integer unchecked (1e300
   *  as an int is undefined behaviour); a whole float in range is accepted. */
  template <typename T>
  T integer(const json& j, const std::string& path) const {
    const auto lo = static_cast<double>(std::numeric_limits<T>::min());
    const auto hi = static_cast<double>(std::numeric_limits<T>::max());
    const auto range = [&] {
      return fmt::format("out of range (allowed: an integer from {} to {})",
                         std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
    };
    constexpr auto max = std::numeric_limits<T>::max();
    if (j.is_number_unsigned()) {
      const auto v = j.get<std::uint64_t>();
      if constexpr (sizeof(T) < 8 || std::is_signed_v<T>) {
        if (v > static_cast<std::uint64_t>(max)) fail(path, range());
      }
      return static_cast<T>(v);
    }
    if (j.is_number_integer()) {
      const auto v = j.get<std::int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (v < 0) fail(path, range());
        if constexpr (sizeof(T) < 8) {
          if (static_cast<std::uint64_t>(v) > max) fail(path, range());
        }
      } else if constexpr (sizeof(T) < 8) {
        if (v < std::numeric_limits<T>::min() || v > max) fail(path, range());
      }
      return static_cast<T>(v);
    }
    if (j.is_number_float()) {
      const double d = j.get<double>();
      // hi + 1 is a power of two, exact in a double: d < hi + 1 keeps the cast defined.
      if (!(d >= lo && d < hi + 1) || std::trunc(d) != d) fail(path, range());
      return static_cast<T>(d);
    }
    fail(path, "wrong type: " + std::string(j.type_name()));
  }
  const json& list(const json& j, const char* key, const std::string& path) const {
    if (!j.is_object() || !j.contains(key)) fail(path + (path.empty() ? "" : ".") + key, "missing");
    if (!j.at(key).is_array()) fail(path + (path.empty() ? "" : ".") + key, "expected an array");
    return j.at(key);
  }
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw InputError(where_, path, what);
  }
  template <typename Fn>
  auto parse_enum(Fn fn, const json& j, const char* key, const std::string& path) const {
    const auto text = get<std::string>(j, key, path);
    try {
      return fn(text);
    } catch (const InputError& e) {
      fail(path + "." + key, e.what());
    }
  }

 private:
  std::string where_;
};

Fill parse_fill(std::string_view s) {
  for (Fill f : {Fill::kNan, Fill::kStale, Fill::kZero}) {
    if (s == to_string(f)) return f;
  }
  throw InputError("", "fill",
                   "unknown value '" + std::string(s) + "' (allowed: nan, stale, zero)");
}

/** What a rank's ops may refer to while they are read: the schedule's units, groups and labels,
 *  and the events the rank recorded so far. */
struct OpContext {
  const Schedule& schedule;
  std::unordered_set<EventId> recorded;
  std::int32_t last_step = -2;  ///< the largest step of the rank's ops so far (-2: none yet)
};

/** The one event an op refers to must have been recorded earlier on its rank. */
void check_recorded(const Reader& rd, const Op& op, const std::string& path, const OpContext& ctx) {
  if (ctx.recorded.count(op.event) == 0) {
    rd.fail(path + ".event",
            fmt::format("event {} is not recorded (event_record) earlier on this rank", op.event));
  }
}

/** The rules every engine relies on for one kind of op. */
void check_kind(const Reader& rd, const Op& op, const std::string& path, Rank rank,
                OpContext& ctx) {
  const bool on_stream = op.stream != kHostStream;
  if (is_collective(op.kind)) {
    if (!on_stream) rd.fail(path + ".stream", "a collective runs on a stream, not the host");
    const auto& groups = ctx.schedule.groups;
    if (op.group < 0 || static_cast<std::size_t>(op.group) >= groups.size())
      rd.fail(path + ".group", "no such group");
    const Group& g = groups[static_cast<std::size_t>(op.group)];
    if (!std::binary_search(g.ranks.begin(), g.ranks.end(), rank))
      rd.fail(path + ".group", fmt::format("rank {} is not in group {}", rank, g.name));
  }
  switch (op.kind) {
    case OpKind::kEventRecord:
      if (!on_stream) rd.fail(path + ".stream", "an event is recorded on a stream, not the host");
      if (op.event == kNoEvent) rd.fail(path + ".event", "missing");
      ctx.recorded.insert(op.event);
      return;
    case OpKind::kStreamWaitEvent:
      if (!on_stream) rd.fail(path + ".stream", "a stream waits for an event, not the host");
      return check_recorded(rd, op, path, ctx);
    case OpKind::kHostEventSync:
      if (on_stream) rd.fail(path + ".stream", "must be -1: the host waits for the event");
      return check_recorded(rd, op, path, ctx);
    case OpKind::kHostStreamSync:
      if (!on_stream) rd.fail(path + ".stream", "names the stream the host waits for (not -1)");
      return;
    case OpKind::kAlloc:
    case OpKind::kFree:
      if (op.buffer == kNoBuffer) rd.fail(path + ".buffer", "missing");
      return;
    case OpKind::kRecordStream:
      if (!on_stream) rd.fail(path + ".stream", "names the stream recorded on the buffer (not -1)");
      if (op.buffer == kNoBuffer) rd.fail(path + ".buffer", "missing");
      return;
    default:
      return;
  }
}

/** Range checks of the indexes an op carries. */
void check_refs(const Reader& rd, const Op& op, const std::string& path, const OpContext& ctx) {
  const Schedule& s = ctx.schedule;
  if (op.unit != kNoUnit && (op.unit < 0 || static_cast<std::size_t>(op.unit) >= s.units.size()))
    rd.fail(path + ".unit", "no such unit");
  if (op.label != kNoLabel &&
      (op.label < 0 || static_cast<std::size_t>(op.label) >= s.labels.size())) {
    rd.fail(path + ".label", fmt::format("out of range (allowed: an index into labels, 0 to {})",
                                         static_cast<long long>(s.labels.size()) - 1));
  }
}

Access read_access(const Reader& rd, const json& ja, const std::string& apath,
                   const RankSchedule& rank) {
  if (!ja.is_array() || (ja.size() != 4 && ja.size() != 6))
    rd.fail(apath,
            "expected [buffer, \"r\"|\"w\", offset, bytes] or, strided, [buffer, "
            "\"r\"|\"w\", offset, bytes, count, stride]");
  Access a;
  a.buffer = rd.as<BufferId>(ja[0], apath);
  if (a.buffer >= rank.buffers.size()) rd.fail(apath, "no such buffer");
  const auto mode = rd.as<std::string>(ja[1], apath);
  if (mode != "r" && mode != "w") rd.fail(apath, "mode must be \"r\" or \"w\"");
  a.mode = mode == "w" ? AccessMode::kWrite : AccessMode::kRead;
  a.offset = rd.as<std::uint64_t>(ja[2], apath);
  a.bytes = rd.as<std::uint64_t>(ja[3], apath);
  const Buffer& b = rank.buffers[a.buffer];
  if (ja.size() == 6) {
    a.count = rd.as<std::uint16_t>(ja[4], apath);
    a.stride = rd.as<std::uint32_t>(ja[5], apath);
    if (a.count < 2) rd.fail(apath, "a strided access has a count of 2 or more");
    if (a.stride < a.bytes || a.bytes == 0) {
      rd.fail(apath, "a strided access's slices are disjoint and not empty: 0 < bytes <= stride");
    }
    // Hull check without overflow: (count - 1) * stride + bytes <= buffer bytes - offset.
    if (a.bytes > b.bytes || a.offset > b.bytes - a.bytes ||
        a.stride > (b.bytes - a.offset - a.bytes) / (std::uint64_t{a.count} - 1)) {
      rd.fail(apath, fmt::format("past the end of buffer {} ({} bytes)", b.name, b.bytes));
    }
    return a;
  }
  if (a.bytes > b.bytes || a.offset > b.bytes - a.bytes) {
    rd.fail(apath, fmt::format("past the end of buffer {} ({} bytes)", b.name, b.bytes));
  }
  return a;
}

void read_accesses(const Reader& rd, const json& j, const std::string& path, RankSchedule& rank) {
  if (!j.contains("accesses")) return;
  const auto& list = rd.list(j, "accesses", path);
  for (std::size_t i = 0; i < list.size(); ++i) {
    rank.accesses.push_back(
        read_access(rd, list[i], path + ".accesses[" + std::to_string(i) + "]", rank));
  }
}

StreamId read_stream(const Reader& rd, const json& j, const std::string& path,
                     const RankSchedule& rank) {
  const int stream = rd.get<int>(j, "stream", path);
  if (stream != kHostStream &&
      (stream < 0 || static_cast<std::size_t>(stream) >= rank.streams.size()))
    rd.fail(path + ".stream", "no such stream");
  return static_cast<StreamId>(stream);
}

void read_op(const Reader& rd, const json& j, const std::string& path, RankSchedule& rank,
             OpContext& ctx) {
  Op op;
  op.kind = rd.parse_enum(parse_op_kind, j, "kind", path);
  op.phase = rd.parse_enum(parse_phase, j, "phase", path);
  op.purpose = rd.parse_enum(parse_purpose, j, "purpose", path);
  op.stream = read_stream(rd, j, path, rank);
  op.step = rd.get<std::int32_t>(j, "step", path);
  op.micro_step = rd.get_or<std::int32_t>(j, "micro_step", 0, path);
  // Steps come one after another from -1 (init) or 0; an op may go back to an earlier step
  // (a recording logs some init work after step 0 began) but not skip one. A stray 2147483647
  // made the step count overflow and killed the simulation child where check called the schedule
  // clean.
  const std::int32_t high = std::min(std::max(ctx.last_step + 1, 0), kMaxScheduleStep);
  if (op.step < -1 || op.step > high) {
    rd.fail(path + ".step",
            fmt::format("{} {}: a rank's steps come one after another from -1 (init) or 0 "
                        "(allowed: -1 to {})",
                        op.step,
                        ctx.last_step < -1 ? "as the first op"
                                           : fmt::format("after steps up to {}", ctx.last_step),
                        high));
  }
  ctx.last_step = std::max(ctx.last_step, op.step);
  if (op.micro_step < 0 || op.micro_step > kMaxScheduleStep) {
    rd.fail(path + ".micro_step",
            fmt::format("{} is out of range (allowed: 0 to {})", op.micro_step, kMaxScheduleStep));
  }
  op.unit = rd.get_or<UnitId>(j, "unit", kNoUnit, path);
  op.group = rd.get_or<GroupId>(j, "group", kNoGroup, path);
  op.event = rd.get_or<EventId>(j, "event", kNoEvent, path);
  op.buffer = rd.get_or<BufferId>(j, "buffer", kNoBuffer, path);
  if (op.buffer != kNoBuffer && op.buffer >= rank.buffers.size()) {
    rd.fail(path + ".buffer", "no such buffer");
  }
  op.label = rd.get_or<LabelId>(j, "label", kNoLabel, path);
  op.flops = rd.get_or<double>(j, "flops", 0.0, path);
  op.mem_bytes = rd.get_or<double>(j, "mem_bytes", 0.0, path);
  op.comm_bytes = rd.get_or<std::uint64_t>(j, "comm_bytes", 0, path);
  const double spin_us = rd.get_or<double>(j, "spin_us", 0.0, path);
  if (!(spin_us >= 0 && spin_us <= 1e6)) {
    rd.fail(path + ".spin_us", "out of range (allowed: 0 to 1000000 microseconds)");
  }
  op.spin_us = static_cast<float>(spin_us);
  if (op.kind == OpKind::kAlloc) {
    op.fill = static_cast<std::uint8_t>(rd.parse_enum(parse_fill, j, "fill", path));
  }
  check_refs(rd, op, path, ctx);
  check_kind(rd, op, path, rank.rank, ctx);
  op.access_begin = static_cast<std::uint32_t>(rank.accesses.size());
  read_accesses(rd, j, path, rank);
  op.access_count = static_cast<std::uint32_t>(rank.accesses.size() - op.access_begin);
  rank.ops.push_back(op);
}

RankSchedule read_rank(const Reader& rd, const json& j, const std::string& path,
                       const Schedule& s) {
  RankSchedule rank;
  rank.rank = rd.get<Rank>(j, "rank", path);
  for (const auto& name : rd.get<std::vector<std::string>>(j, "streams", path)) {
    rank.streams.push_back({name});
  }
  if (rank.streams.size() > static_cast<std::size_t>(std::numeric_limits<StreamId>::max())) {
    rd.fail(path + ".streams",
            fmt::format("at most {} streams", std::numeric_limits<StreamId>::max()));
  }
  const auto& buffers = rd.list(j, "buffers", path);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::string bpath = path + ".buffers[" + std::to_string(i) + "]";
    Buffer b;
    b.name = rd.get<std::string>(buffers[i], "name", bpath);
    b.role = rd.parse_enum(parse_buffer_role, buffers[i], "role", bpath);
    b.unit = rd.get_or<UnitId>(buffers[i], "unit", kNoUnit, bpath);
    if (b.unit != kNoUnit && (b.unit < 0 || static_cast<std::size_t>(b.unit) >= s.units.size()))
      rd.fail(bpath + ".unit", "no such unit");
    b.bytes = rd.get<std::uint64_t>(buffers[i], "bytes", bpath);
    b.on_host = rd.get_or<bool>(buffers[i], "on_host", false, bpath);
    rank.buffers.push_back(std::move(b));
  }
  OpContext ctx{s, {}, -2};
  const auto& ops = rd.list(j, "ops", path);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    read_op(rd, ops[i], path + ".ops[" + std::to_string(i) + "]", rank, ctx);
  }
  return rank;
}

/** The group map of a rank written like another: [[g, g2], ...], each group in range. */
std::unordered_map<GroupId, GroupId> read_group_map(const Reader& rd, const json& j,
                                                    const std::string& path, const Schedule& s) {
  std::unordered_map<GroupId, GroupId> to;
  const auto in_range = [&s](GroupId g) {
    return g >= 0 && static_cast<std::size_t>(g) < s.groups.size();
  };
  for (const auto& pair : rd.get<std::vector<std::vector<GroupId>>>(j, "groups", path)) {
    if (pair.size() != 2 || !in_range(pair[0]) || !in_range(pair[1])) {
      rd.fail(path + ".groups", "expected [[group, its replacement], ...] of existing groups");
    }
    to[pair[0]] = pair[1];
  }
  return to;
}

/** The optional "accesses" of a rank written like another: [[op, [access, ...]], ...], ops in
 *  ascending order, each with as many accesses as the op has; they replace that op's. */
void read_like_accesses(const Reader& rd, const json& j, const std::string& path,
                        RankSchedule& rank) {
  if (!j.contains("accesses")) return;
  const auto& list = rd.list(j, "accesses", path);
  std::size_t next = 0;  // the lowest op index the next entry may name
  for (std::size_t k = 0; k < list.size(); ++k) {
    const std::string at = path + ".accesses[" + std::to_string(k) + "]";
    const json& entry = list[k];
    if (!entry.is_array() || entry.size() != 2 || !entry[1].is_array()) {
      rd.fail(at, "expected [op, [access, ...]]");
    }
    const auto op = rd.as<std::uint32_t>(entry[0], at + "[0]");
    if (op < next || op >= rank.ops.size()) {
      rd.fail(at + "[0]", fmt::format("expected an op index in ascending order, {} to {}", next,
                                      rank.ops.size() - 1));
    }
    next = static_cast<std::size_t>(op) + 1;
    const Op o = rank.ops[op];
    if (entry[1].size() != o.access_count) {
      rd.fail(at + "[1]",
              fmt::format("op {} has {} accesses, not {}", op, o.access_count, entry[1].size()));
    }
    std::vector<Access>& own = rank.accesses.mut();
    for (std::uint32_t i = 0; i < o.access_count; ++i) {
      own[o.access_begin + i] =
          read_access(rd, entry[1][i], at + "[1][" + std::to_string(i) + "]", rank);
    }
  }
}

/** A rank written as {"rank": r, "like": R, "groups": [[g, g2], ...]} (how a recorder writes
 *  the ranks it did not record): rank R's schedule, which is written in full, with every op on
 *  group g moved to group g2. */
RankSchedule read_like(const Reader& rd, const json& j, const std::string& path, const Schedule& s,
                       const std::vector<bool>& full) {
  const int like = rd.get<int>(j, "like", path);
  if (like < 0 || static_cast<std::size_t>(like) >= full.size() || !full[like]) {
    rd.fail(path + ".like", "names no rank written in full");
  }
  const auto to = read_group_map(rd, j, path, s);
  RankSchedule rank = s.ranks[static_cast<std::size_t>(like)];
  rank.rank = rd.get<Rank>(j, "rank", path);
  std::vector<Op>& ops = rank.ops.mut();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    if (const auto it = to.find(op.group); it != to.end()) op.group = it->second;
    if (!is_collective(op.kind)) continue;
    const Group& g = s.groups[static_cast<std::size_t>(op.group)];
    if (!std::binary_search(g.ranks.begin(), g.ranks.end(), rank.rank)) {
      rd.fail(path + ".groups",
              fmt::format("rank {} is not in group {}, which op {} of rank {} runs on", rank.rank,
                          g.name, i, like));
    }
  }
  read_like_accesses(rd, j, path, rank);
  share_alike(rank, s.ranks[static_cast<std::size_t>(like)]);  // one copy of the ops again
  return rank;
}

/** Every rank, in order: those written in full first, then those written like one of them. */
void read_ranks(const Reader& rd, const json& j, Schedule& s) {
  const auto& ranks = rd.list(j, "ranks", "");
  if (ranks.size() != static_cast<std::size_t>(s.world_size)) {
    rd.fail("ranks", fmt::format("{} listed but world_size is {}", ranks.size(), s.world_size));
  }
  s.ranks.resize(ranks.size());
  std::vector<bool> full(ranks.size(), false);
  const auto path = [](std::size_t i) { return "ranks[" + std::to_string(i) + "]"; };
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].is_object() && ranks[i].contains("like")) continue;
    s.ranks[i] = read_rank(rd, ranks[i], path(i), s);
    full[i] = true;
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!full[i]) s.ranks[i] = read_like(rd, ranks[i], path(i), s, full);
    if (s.ranks[i].rank != static_cast<Rank>(i))
      rd.fail(path(i) + ".rank", "ranks must be listed in order 0, 1, ...");
  }
}

void read_units(const Reader& rd, const json& j, Schedule& s) {
  const auto& units = rd.list(j, "units", "");
  for (std::size_t i = 0; i < units.size(); ++i) {
    const std::string p = "units[" + std::to_string(i) + "]";
    ParamUnit u;
    u.name = rd.get<std::string>(units[i], "name", p);
    u.layer = rd.get<std::int32_t>(units[i], "layer", p);
    u.numel = rd.get<std::uint64_t>(units[i], "numel", p);
    u.padded_numel = rd.get<std::uint64_t>(units[i], "padded_numel", p);
    u.shard_numel = rd.get<std::uint64_t>(units[i], "shard_numel", p);
    u.secondary_numel = rd.get<std::uint64_t>(units[i], "secondary_numel", p);
    u.forward_flops = rd.get<double>(units[i], "forward_flops", p);
    u.persistent = rd.get<bool>(units[i], "persistent", p);
    s.units.push_back(std::move(u));
  }
}

void read_groups(const Reader& rd, const json& j, Schedule& s) {
  const auto& groups = rd.list(j, "groups", "");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string p = "groups[" + std::to_string(i) + "]";
    Group g;
    g.name = rd.get<std::string>(groups[i], "name", p);
    g.kind = rd.parse_enum(parse_group_kind, groups[i], "kind", p);
    g.ranks = rd.get<std::vector<Rank>>(groups[i], "ranks", p);
    const bool valid =
        !g.ranks.empty() && g.ranks.front() >= 0 && g.ranks.back() < s.world_size &&
        std::adjacent_find(g.ranks.begin(), g.ranks.end(), std::greater_equal<>()) == g.ranks.end();
    if (!valid) {
      rd.fail(p + ".ranks",
              fmt::format("expected ranks in ascending order, 0 to {}", s.world_size - 1));
    }
    s.groups.push_back(std::move(g));
  }
}

/** The optional top-level "labels" (strings) and "source" (an object of strings). */
void read_provenance(const Reader& rd, const json& j, Schedule& s) {
  if (j.contains("labels")) s.labels = rd.get<std::vector<std::string>>(j, "labels", "");
  if (!j.contains("source")) return;
  if (!j.at("source").is_object()) rd.fail("source", "expected an object of strings");
  for (const auto& [key, value] : j.at("source").items()) {
    if (!value.is_string()) rd.fail("source." + key, "expected a string");
    s.source[key] = value.get<std::string>();
  }
}

/** world_size, hpz_size and dtype_bytes, each in the range the engines divide by. */
void read_sizes(const Reader& rd, const json& j, Schedule& s) {
  s.world_size = rd.get<int>(j, "world_size", "");
  if (s.world_size < 1) rd.fail("world_size", "must be at least 1");
  s.hpz_size = rd.get<int>(j, "hpz_size", "");
  if (s.hpz_size < 1 || s.world_size % s.hpz_size != 0)
    rd.fail("hpz_size", fmt::format("must divide the world size {}", s.world_size));
  s.dtype_bytes = rd.get<int>(j, "dtype_bytes", "");
  if (s.dtype_bytes < 1) rd.fail("dtype_bytes", "must be at least 1");
}

}  // namespace

json schedule_to_json(const Schedule& s, bool compact) {
  json units = json::array();
  for (const auto& u : s.units) {
    units.push_back({{"name", u.name},
                     {"layer", u.layer},
                     {"numel", u.numel},
                     {"padded_numel", u.padded_numel},
                     {"shard_numel", u.shard_numel},
                     {"secondary_numel", u.secondary_numel},
                     {"forward_flops", u.forward_flops},
                     {"persistent", u.persistent}});
  }
  json groups = json::array();
  for (const auto& g : s.groups) {
    groups.push_back({{"name", g.name}, {"kind", to_string(g.kind)}, {"ranks", g.ranks}});
  }
  json ranks = json::array();
  std::vector<std::size_t> full;  // ranks written in full so far
  for (const auto& r : s.ranks) {
    const auto base = std::find_if(full.begin(), full.end(), [&](std::size_t f) {
      const RankSchedule& b = s.ranks[f];
      return r.ops.shares_with(b.ops) && r.buffers.shares_with(b.buffers) &&
             r.streams.size() == b.streams.size() &&
             std::equal(r.streams.begin(), r.streams.end(), b.streams.begin(),
                        [](const Stream& x, const Stream& y) { return x.name == y.name; });
    });
    if (compact && base != full.end()) {
      ranks.push_back(like_to_json(s, r, s.ranks[*base]));
    } else {
      ranks.push_back(rank_to_json(r));
      full.push_back(static_cast<std::size_t>(r.rank));
    }
  }
  json j = {{"format", "hpzlab-schedule"},
            {"version", kFormatVersion},
            {"scenario", s.scenario},
            {"variant", s.variant},
            {"world_size", s.world_size},
            {"hpz_size", s.hpz_size},
            {"dtype_bytes", s.dtype_bytes},
            {"units", units},
            {"groups", groups},
            {"ranks", ranks}};
  // Only recorded schedules have these: a built one's JSON stays as it was.
  if (!s.labels.empty()) j["labels"] = s.labels;
  if (!s.source.empty()) j["source"] = s.source;
  if (s.allocator) j["allocator"] = true;
  return j;
}

Schedule schedule_from_json(const json& j, const std::string& where) {
  const Reader rd(where);
  const bool ours = j.is_object() && j.contains("format") && j.at("format") == "hpzlab-schedule";
  if (!ours) {
    rd.fail("format", "not an hpzlab schedule (expected \"hpzlab-schedule\")");
  }
  if (rd.get<int>(j, "version", "") != kFormatVersion) {
    rd.fail("version", "unsupported version (allowed: " + std::to_string(kFormatVersion) + ")");
  }
  Schedule s;
  s.scenario = rd.get<std::string>(j, "scenario", "");
  s.variant = rd.get<std::string>(j, "variant", "");
  read_sizes(rd, j, s);
  read_provenance(rd, j, s);
  if (j.contains("allocator")) s.allocator = rd.get<bool>(j, "allocator", "");
  read_units(rd, j, s);
  read_groups(rd, j, s);
  read_ranks(rd, j, s);
  return s;
}

Schedule read_schedule_file(const std::string& path) {
  // A recording as traces/deepspeed/ keeps it (.json.gz) reads as it is.
  const std::string text = gunzipped_input(
      read_input_file(path, path, "", "cannot read this schedule file"), path, "schedule file");
  return schedule_from_json(parse_json_input(text, path, "not valid JSON"), path);
}

}  // namespace hpz
