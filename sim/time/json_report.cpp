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

json race_json(const RaceReport& race) {
  json j = {{"first", check::describe(race.group.example.first)},
            {"second", check::describe(race.group.example.second)},
            {"buffer_role", std::string(to_string(race.group.example.role))},
            {"instances", race.instances},
            {"manifested_per_run", race.manifested_per_run},
            {"runs_manifested", race.runs_manifested},
            {"max_overlap_s", race.max_overlap_s}};
  if (race.has_example) {
    const Manifestation& m = race.example_timing;
    j["example"] = {{"rank", race.example.rank},          {"first_op", race.example.first},
                    {"second_op", race.example.second},   {"first_end_s", m.first_end_s},
                    {"second_start_s", m.second_start_s}, {"overlap_s", m.overlap_s}};
  }
  return j;
}

}  // namespace

std::string JsonReporter::render(const Schedule&, const SimResult& r) const {
  json j = metrics_json(r.mean);
  j["scenario"] = r.scenario;
  j["variant"] = r.variant;
  j["world_size"] = r.world_size;
  j["steps"] = r.steps;
  j["network"] = {{"simgrid_model", r.network_model},
                  {"bandwidth_factor", r.bandwidth_factor},
                  {"latency_factor", r.latency_factor},
                  {"collective_model", r.collective_model}};
  j["runs"] = json::array();
  for (const StepMetrics& m : r.runs) j["runs"].push_back(metrics_json(m));
  j["races"] = json::array();
  for (const RaceReport& race : r.races) {
    if (race.group.example.kind == check::FindingKind::kRace) j["races"].push_back(race_json(race));
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
  j["engine"] = {{"transfers", r.stats.transfers}, {"execs", r.stats.execs}, {"ops", r.stats.ops}};
  return j.dump(2) + "\n";
}

}  // namespace hpz::time
