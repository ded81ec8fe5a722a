#include "sim/summary.hpp"

#include <fmt/format.h>

#include <array>
#include <map>

#include "sim/model_shape.hpp"

namespace hpz {
namespace {

std::string stream_name(const RankSchedule& rank, StreamId s) {
  return s == kHostStream ? "host" : rank.streams.at(s).name;
}

std::string label(const Schedule& s, const Op& op) {
  std::string out = fmt::format("step {}", op.step);
  if (op.micro_step != 0) out += fmt::format(".{}", op.micro_step);
  out += fmt::format(" {}", to_string(op.phase));
  if (op.unit != kNoUnit) out += " " + s.units[op.unit].name;
  if (op.label != kNoLabel) out += " at " + s.labels[op.label];
  return out;
}

std::string human_bytes(double b) {
  constexpr std::array<const char*, 5> units = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t i = 0;
  while (b >= 1024 && i + 1 < units.size()) {
    b /= 1024;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f} {}", b, units[i]) : fmt::format("{:.2f} {}", b, units[i]);
}

}  // namespace

std::string schedule_summary(const Scenario& sc, const Schedule& s) {
  std::string out;
  const auto& c = sc.cluster;
  const auto& m = sc.model;
  out += fmt::format("scenario   {} (variant {}, fill {}, {} step(s), seed {})\n",
                     sc.path.empty() ? "(built in code)" : sc.path, s.variant,
                     to_string(sc.run.fill), sc.run.steps, sc.run.seed);
  if (sc.run.spin_before_copy_us > 0) {
    out += fmt::format("repro      a {} us spin kernel on S0 ahead of every secondary copy\n",
                       sc.run.spin_before_copy_us);
  }
  if (sc.run.load == "pretrained") {
    out += "load       from_pretrained: each module's weights loaded on rank 0 after zero.Init\n";
  } else if (sc.run.load == "checkpoint") {
    out += "load       load_checkpoint: a ZeRO checkpoint's shards loaded before step 0\n";
  }
  out += fmt::format(
      "cluster    {} node(s) x {} {}; NVLink {} GB/s per GPU; {} x {} Gbit/s NIC per node\n",
      c.nodes, c.gpus_per_node, c.gpu.name, c.nvlink_gbytes_per_s, c.nics_per_node, c.nic_gbps);
  out += fmt::format(
      "model      {}: {} layers, hidden {}, ffn {}, {} heads ({} kv), vocab {}, {}\n", m.name,
      m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, m.vocab, sc.training.dtype);
  out += fmt::format(
      "zero       world {}, hpZ {}, qwZ {}, qgZ {}, overlap_comm {}, offload_param {}\n",
      s.world_size, s.hpz_size, sc.zero.zero_quantized_weights ? "on" : "off",
      sc.zero.zero_quantized_gradients ? "on" : "off", sc.zero.overlap_comm ? "on" : "off",
      sc.zero.offload_param ? "on" : "off");
  std::uint64_t partitioned = 0, persistent = 0, padding_only = 0;
  std::size_t n_partitioned = 0;
  for (const auto& u : s.units) {
    if (u.persistent) {
      persistent += u.numel;
      continue;
    }
    partitioned += u.numel;
    ++n_partitioned;
    if (s.hpz_size > 1) {
      for (int g = 0; g < s.hpz_size; ++g) {
        if (static_cast<std::uint64_t>(g) * u.secondary_numel >= u.numel) ++padding_only;
      }
    }
  }
  // The units can hold more than the model: a tied output layer's weight is a unit at each of
  // its uses (coarse builder), or the weight zero.Init made for lm_head before the tie stays a
  // unit of its own (DeepSpeed builder).
  out += fmt::format(
      "params     {:.0f} in the model; units: {} partitioned in {}, {} persistent{}; {} secondary "
      "slice(s) entirely in padding\n",
      parameter_count(m), partitioned, n_partitioned, persistent,
      m.tied_embeddings ? " (the tied output layer's weight counted twice)" : "", padding_only);
  std::map<std::string, std::size_t> by_kind;
  std::size_t ops = 0;
  for (const auto& op : s.ranks.at(0).ops) by_kind[std::string(to_string(op.kind))]++;
  for (const auto& r : s.ranks) ops += r.ops.size();
  out += fmt::format("ops        {} in all ranks; rank 0: {}", ops, s.ranks.at(0).ops.size());
  for (const auto& [kind, n] : by_kind) out += fmt::format(", {} {}", n, kind);
  out += "\n";
  std::size_t copies = 0, hpz_gathers = 0, world_gathers = 0;
  for (const auto& op : s.ranks.at(0).ops) {
    if (op.purpose == Purpose::kSecondaryPartitionCopy && op.phase != Phase::kInit) ++copies;
    if (op.kind == OpKind::kAllGather) {
      (s.groups.at(op.group).kind == GroupKind::kHpz ? hpz_gathers : world_gathers)++;
    }
  }
  out += fmt::format(
      "hpZ        rank 0: {} secondary partition copies after init, {} hpZ-group gathers, {} "
      "world gathers\n",
      copies, hpz_gathers, world_gathers);
  for (const auto& note : sc.notes) out += "note       " + note + "\n";
  for (const auto& [key, value] : s.source) out += fmt::format("source     {}: {}\n", key, value);
  return out;
}

std::string format_rank(const Schedule& s, Rank r) {
  const RankSchedule& rank = s.ranks.at(r);
  std::string out = fmt::format(
      "# rank {}: {} ops (index stream kind purpose | labels | accesses)\n", r, rank.ops.size());
  for (std::size_t i = 0; i < rank.ops.size(); ++i) {
    const Op& op = rank.ops[i];
    std::string line = fmt::format("{:6} {:<6} {:<17} {:<24} | {}", i, stream_name(rank, op.stream),
                                   to_string(op.kind), to_string(op.purpose), label(s, op));
    if (op.group != kNoGroup) {
      line += fmt::format(" | group {} {}", s.groups[op.group].name,
                          human_bytes(static_cast<double>(op.comm_bytes)));
    }
    if (op.event != kNoEvent) line += fmt::format(" | event {}", op.event);
    if (op.spin_us > 0) line += fmt::format(" | spin {} us", op.spin_us);
    if (op.buffer != kNoBuffer) {
      line += fmt::format(" | {}", rank.buffers[op.buffer].name);
      if (op.kind == OpKind::kAlloc)
        line += fmt::format(" fill {}", to_string(static_cast<Fill>(op.fill)));
    }
    for (const Access& a : s.accesses_of(r, op)) {
      line += fmt::format(" | {} {}[{}, {})", a.mode == AccessMode::kWrite ? "W" : "R",
                          rank.buffers[a.buffer].name, a.offset, a.offset + a.bytes);
      if (a.strided()) line += fmt::format(" x{} every {}", a.count, a.stride);
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace hpz
