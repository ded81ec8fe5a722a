#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "sim/check/finding_log.hpp"
#include "sim/time/report.hpp"

namespace hpz::time {
namespace {

using nlohmann::json;

json metrics_json(const StepMetrics& m) {
  return {{"step_time_s", m.step_time_s},
          {"tokens_per_s_per_node", m.tokens_per_s_per_node},
          {"exposed_comm_s", m.exposed_comm_s},
          {"host_stall_s", m.host_stall_s},
          {"host_sync_s", m.host_sync_s},
          {"races_manifested", m.races_manifested},
          {"hung", m.hung}};
}

/** Each run's smallest margin, null where no instance ran (JSON has no NaN). */
json per_run_margins(const RaceReport& race) {
  json out = json::array();
  for (double m : race.min_margin_per_run) out.push_back(std::isnan(m) ? json(nullptr) : json(m));
  return out;
}

// `names` labels ops for the example (one FindingLog for every race of the report).
json race_json(const check::FindingLog& names, const RaceReport& race) {
  json j = {{"first", check::describe(race.group.example.first)},
            {"second", check::describe(race.group.example.second)},
            {"buffer_role", std::string(to_string(race.group.example.role))},
            {"instances", race.instances},
            {"manifested_per_run", race.manifested_per_run},
            {"runs_manifested", race.runs_manifested},
            {"max_overlap_s", race.max_overlap_s}};
  if (race.has_margin) {
    // Second start - first end in the first run: negative where the race bit.
    j["margin_s"] = {
        {"min", race.min_margin_s},
        {"median", race.median_margin_s},
        {"min_per_run", per_run_margins(race)},
        {"at",
         {{"rank", race.closest.rank},
          {"first_op", race.closest.first},
          {"second_op", race.closest.second},
          {"first", check::describe(names.label(race.closest.rank, race.closest.first))},
          {"second", check::describe(names.label(race.closest.rank, race.closest.second))}}}};
  }
  if (race.has_example) {
    const Manifestation& m = race.example_timing;
    // The pair that overlapped, in words: a group's `first` and `second` describe its first
    // instance, which need not be the one that bit.
    j["example"] = {
        {"rank", race.example.rank},
        {"first_op", race.example.first},
        {"second_op", race.example.second},
        {"first", check::describe(names.label(race.example.rank, race.example.first))},
        {"second", check::describe(names.label(race.example.rank, race.example.second))},
        {"first_end_s", m.first_end_s},
        {"second_start_s", m.second_start_s},
        {"overlap_s", m.overlap_s}};
  }
  return j;
}

json number_or_null(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

/** [issue_s, start_s, end_s], or null for an op that never ran: the engine leaves -1 there and
 *  the real executor NaN. */
json op_time_json(const OpTime& t) {
  if (!std::isfinite(t.end_s) || t.end_s < 0) return nullptr;
  return {number_or_null(t.issue_s), number_or_null(t.start_s), number_or_null(t.end_s)};
}

/** "kind/purpose/unit" ("-" for no unit): what `hpzlab compare` aligns two runs by. */
std::string op_label(const Schedule& schedule, const Op& op) {
  return fmt::format("{}/{}/{}", to_string(op.kind), to_string(op.purpose),
                     op.unit == kNoUnit ? "-" : schedule.units[op.unit].name);
}

}  // namespace

nlohmann::json to_json(const Schedule& schedule, const SimResult& r, bool op_times) {
  json j = metrics_json(r.mean);
  j["source"] = "sim";
  j["scenario"] = r.scenario;
  j["variant"] = r.variant;
  j["world_size"] = r.world_size;
  j["steps"] = r.steps;
  j["spin_before_copy_us"] = r.spin_before_copy_us;
  j["network"] = {{"simgrid_model", r.network_model},
                  {"bandwidth_factor", r.bandwidth_factor},
                  {"latency_factor", r.latency_factor},
                  {"collective_model", r.collective_model}};
  j["runs"] = json::array();
  for (const StepMetrics& m : r.runs) j["runs"].push_back(metrics_json(m));
  j["races"] = json::array();
  const check::FindingLog names(schedule);
  for (const RaceReport& race : r.races) {
    if (race.group.example.kind == check::FindingKind::kRace)
      j["races"].push_back(race_json(names, race));
  }
  j["links"] = json::array();
  for (const LinkReport& l : r.links) {
    j["links"].push_back({{"name", l.spec.name},
                          {"bytes_per_s", l.spec.bytes_per_s},
                          {"latency_s", l.spec.latency_s},
                          {"bytes", l.bytes},
                          {"bytes_last_step", l.bytes_last_step},
                          {"utilisation", l.utilisation}});
  }
  j["engine"] = {{"transfers", r.stats.transfers},
                 {"simgrid_comms", r.stats.simgrid_comms},
                 {"execs", r.stats.execs},
                 {"ops", r.stats.ops},
                 {"by_class", r.by_class()}};
  if (op_times) {
    json times = json::array();
    json labels = json::array();
    for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
      json t = json::array();
      json l = json::array();
      const auto& ops = schedule.ranks[rank].ops;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        t.push_back(op_time_json(r.timeline.ranks.at(rank).at(i)));
        l.push_back(op_label(schedule, ops[i]));
      }
      times.push_back(std::move(t));
      labels.push_back(std::move(l));
    }
    j["op_times"] = std::move(times);
    j["op_labels"] = std::move(labels);
  }
  return j;
}

std::string JsonReporter::render(const Schedule& schedule, const SimResult& r) const {
  nlohmann::json j = to_json(schedule, r, op_times_);
  // The hardware the times assumed (issue 35: a "what if" answer must say what it supposed).
  // Here and not in to_json: `hpzlab real` times the GPU it ran on, not this cluster.
  const ClusterConfig& c = r.cluster;
  j["cluster"] = {{"nodes", c.nodes},
                  {"gpus_per_node", c.gpus_per_node},
                  {"gpu", c.gpu.name},
                  {"nics_per_node", c.nics_per_node},
                  {"nic_gbps", c.nic_gbps},
                  {"nvlink_gbytes_per_s", c.nvlink_gbytes_per_s},
                  {"internode_latency_us", c.internode_latency_us},
                  {"nvlink_latency_us", c.nvlink_latency_us}};
  j["notes"] = notes_;
  return j.dump(2) + "\n";
}

}  // namespace hpz::time
