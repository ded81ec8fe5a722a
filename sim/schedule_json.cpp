#include "sim/schedule_json.hpp"

#include "sim/error.hpp"
#include "sim/scenario.hpp"

namespace hpz {
namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;

json access_to_json(const Access& a) {
  return json::array({a.buffer, a.mode == AccessMode::kWrite ? "w" : "r", a.offset, a.bytes});
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
    try {
      return j.get<T>();
    } catch (const json::exception&) {
      fail(path, "wrong type: " + std::string(j.type_name()));
    }
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

void read_op(const Reader& rd, const json& j, const std::string& path, RankSchedule& rank) {
  Op op;
  op.kind = rd.parse_enum(parse_op_kind, j, "kind", path);
  op.phase = rd.parse_enum(parse_phase, j, "phase", path);
  op.purpose = rd.parse_enum(parse_purpose, j, "purpose", path);
  op.stream = rd.get<StreamId>(j, "stream", path);
  if (op.stream != kHostStream &&
      (op.stream < 0 || static_cast<std::size_t>(op.stream) >= rank.streams.size())) {
    rd.fail(path + ".stream", "no such stream");
  }
  op.step = rd.get<std::int32_t>(j, "step", path);
  op.micro_step = rd.get_or<std::int32_t>(j, "micro_step", 0, path);
  op.unit = rd.get_or<UnitId>(j, "unit", kNoUnit, path);
  op.group = rd.get_or<GroupId>(j, "group", kNoGroup, path);
  op.event = rd.get_or<EventId>(j, "event", kNoEvent, path);
  op.buffer = rd.get_or<BufferId>(j, "buffer", kNoBuffer, path);
  if (op.buffer != kNoBuffer && op.buffer >= rank.buffers.size()) {
    rd.fail(path + ".buffer", "no such buffer");
  }
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
  op.access_begin = static_cast<std::uint32_t>(rank.accesses.size());
  if (j.contains("accesses")) {
    const auto& list = rd.list(j, "accesses", path);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string apath = path + ".accesses[" + std::to_string(i) + "]";
      const auto& ja = list[i];
      if (!ja.is_array() || ja.size() != 4)
        rd.fail(apath, "expected [buffer, \"r\"|\"w\", offset, bytes]");
      Access a;
      a.buffer = rd.as<BufferId>(ja[0], apath);
      if (a.buffer >= rank.buffers.size()) rd.fail(apath, "no such buffer");
      const auto mode = rd.as<std::string>(ja[1], apath);
      if (mode != "r" && mode != "w") rd.fail(apath, "mode must be \"r\" or \"w\"");
      a.mode = mode == "w" ? AccessMode::kWrite : AccessMode::kRead;
      a.offset = rd.as<std::uint64_t>(ja[2], apath);
      a.bytes = rd.as<std::uint64_t>(ja[3], apath);
      rank.accesses.push_back(a);
    }
  }
  op.access_count = static_cast<std::uint32_t>(rank.accesses.size() - op.access_begin);
  rank.ops.push_back(op);
}

RankSchedule read_rank(const Reader& rd, const json& j, const std::string& path) {
  RankSchedule rank;
  rank.rank = rd.get<Rank>(j, "rank", path);
  for (const auto& s : rd.get<std::vector<std::string>>(j, "streams", path)) {
    rank.streams.push_back({s});
  }
  const auto& buffers = rd.list(j, "buffers", path);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::string bpath = path + ".buffers[" + std::to_string(i) + "]";
    Buffer b;
    b.name = rd.get<std::string>(buffers[i], "name", bpath);
    b.role = rd.parse_enum(parse_buffer_role, buffers[i], "role", bpath);
    b.unit = rd.get_or<UnitId>(buffers[i], "unit", kNoUnit, bpath);
    b.bytes = rd.get<std::uint64_t>(buffers[i], "bytes", bpath);
    b.on_host = rd.get_or<bool>(buffers[i], "on_host", false, bpath);
    rank.buffers.push_back(std::move(b));
  }
  const auto& ops = rd.list(j, "ops", path);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    read_op(rd, ops[i], path + ".ops[" + std::to_string(i) + "]", rank);
  }
  return rank;
}

}  // namespace

json schedule_to_json(const Schedule& s) {
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
  for (const auto& r : s.ranks) ranks.push_back(rank_to_json(r));
  return {{"format", "hpzlab-schedule"},
          {"version", kFormatVersion},
          {"scenario", s.scenario},
          {"variant", s.variant},
          {"world_size", s.world_size},
          {"hpz_size", s.hpz_size},
          {"dtype_bytes", s.dtype_bytes},
          {"units", units},
          {"groups", groups},
          {"ranks", ranks}};
}

Schedule schedule_from_json(const json& j, const std::string& where) {
  const Reader rd(where);
  if (rd.get<std::string>(j, "format", "") != "hpzlab-schedule") {
    rd.fail("format", "not an hpzlab schedule (expected \"hpzlab-schedule\")");
  }
  if (rd.get<int>(j, "version", "") != kFormatVersion) {
    rd.fail("version", "unsupported version (allowed: " + std::to_string(kFormatVersion) + ")");
  }
  Schedule s;
  s.scenario = rd.get<std::string>(j, "scenario", "");
  s.variant = rd.get<std::string>(j, "variant", "");
  s.world_size = rd.get<int>(j, "world_size", "");
  s.hpz_size = rd.get<int>(j, "hpz_size", "");
  s.dtype_bytes = rd.get<int>(j, "dtype_bytes", "");
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
  const auto& groups = rd.list(j, "groups", "");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string p = "groups[" + std::to_string(i) + "]";
    Group g;
    g.name = rd.get<std::string>(groups[i], "name", p);
    g.kind = rd.parse_enum(parse_group_kind, groups[i], "kind", p);
    g.ranks = rd.get<std::vector<Rank>>(groups[i], "ranks", p);
    s.groups.push_back(std::move(g));
  }
  const auto& ranks = rd.list(j, "ranks", "");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    s.ranks.push_back(read_rank(rd, ranks[i], "ranks[" + std::to_string(i) + "]"));
    if (s.ranks.back().rank != static_cast<Rank>(i))
      rd.fail("ranks[" + std::to_string(i) + "].rank", "ranks must be listed in order 0, 1, ...");
  }
  return s;
}

}  // namespace hpz
