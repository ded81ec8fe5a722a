// The machine-readable report of `hpzlab check --json`.
#include <nlohmann/json.hpp>

#include "sim/check/byte_history.hpp"
#include "sim/check/finding_log.hpp"
#include "sim/check/report.hpp"

namespace hpz::check {
namespace {

using nlohmann::json;

json op_json(const OpLabel& op) {
  if (op.index == kNoOp) return nullptr;
  return json{{"rank", op.rank},
              {"op", op.index},
              {"stream", op.stream},
              {"kind", to_string(op.kind)},
              {"purpose", to_string(op.purpose)},
              {"phase", to_string(op.phase)},
              {"step", op.step},
              {"micro_step", op.micro_step},
              {"unit", op.unit.empty() ? json(nullptr) : json(op.unit)},
              {"layer", op.layer},
              {"label", op.label.empty() ? json(nullptr) : json(op.label)},
              {"text", describe(op)}};
}

json group_json(const CheckResult& r, const FindingGroup& g) {
  const Finding& f = g.example;
  json j{{"kind", to_string(f.kind)},
         {"scenario", r.scenario},
         {"variant", r.variant},
         {"count", g.count},
         {"ranks", g.ranks},
         {"layers", g.layers},
         {"steps", g.steps},
         {"first", op_json(f.first)},
         {"second", op_json(f.second)},
         {"detail", f.detail},
         {"fix", f.fix},
         {"remedy", remedy(f)}};
  if (f.kind == FindingKind::kCollectiveMismatch) {
    j["group"] = f.group;
    j["position"] = f.position;
  } else {
    j["buffer"] = json{
        {"name", f.buffer}, {"role", to_string(f.role)}, {"offset", f.offset}, {"bytes", f.bytes}};
    if (f.kind == FindingKind::kUseAfterFree) {
      j["reused_by"] = json{{"name", f.reused}, {"role", to_string(f.reused_role)}};
    }
    if (f.kind == FindingKind::kRace || f.kind == FindingKind::kUseAfterFree) {
      j["first"]["mode"] = f.first_mode == AccessMode::kRead ? "read" : "write";
      j["second"]["mode"] = f.second_mode == AccessMode::kRead ? "read" : "write";
    }
  }
  return j;
}

}  // namespace

std::string JsonReporter::render(std::span<const CheckResult> results) const {
  json scenarios = json::array();
  json findings = json::array();
  bool clean = true;
  for (const CheckResult& r : results) {
    clean = clean && r.clean();
    json counts = json::object();
    for (FindingKind k : kAllKinds) {
      // Counted only where it was checked: a schedule without the allocator's events.
      if (k == FindingKind::kUseAfterFree && !r.allocator) continue;
      counts[std::string(to_string(k))] = r.count(k);
    }
    scenarios.push_back(json{{"scenario", r.scenario},
                             {"variant", r.variant},
                             {"world_size", r.world_size},
                             {"clean", r.clean()},
                             {"counts", counts},
                             {"ops", r.stats.ops},
                             {"accesses", r.stats.accesses},
                             {"collectives", r.stats.collectives},
                             {"same_data_rewrites", r.stats.same_data_rewrites}});
    if (!r.source.empty()) scenarios.back()["source"] = r.source;
    if (r.allocator) scenarios.back()["allocator"] = true;
    for (const FindingGroup& g : r.groups) findings.push_back(group_json(r, g));
  }
  json doc{{"clean", clean}, {"scenarios", scenarios}, {"findings", findings}};
  return doc.dump(2) + "\n";
}

}  // namespace hpz::check
