// The SARIF 2.1.0 report of `hpzlab check --sarif` (OASIS Static Analysis Results Interchange
// Format 2.1.0, errata 01), for code-scanning tools. One run; tool.driver.rules has one rule per
// finding kind (section 3.49, reportingDescriptor); each finding group is one result (3.27) with
// its rule, level "error", the explanation and the fix as message text, the scenario file as its
// physical location and the module as a logical location (3.33), and a partial fingerprint that
// stays the same while the same bug stays in the same place (3.27.17), so a code-scanning tool
// follows one alert across runs.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "sim/check/byte_history.hpp"
#include "sim/check/finding_log.hpp"
#include "sim/check/report.hpp"

namespace hpz::check {
namespace {

using nlohmann::json;

struct RuleText {
  FindingKind kind;
  const char* name;  ///< PascalCase, as SARIF's examples name rules
  const char* summary;
};

constexpr RuleText kRules[] = {
    {FindingKind::kRace, "UnorderedAccess",
     "Two GPU streams touch the same bytes with nothing ordering them, and one writes."},
    {FindingKind::kUseAfterFree, "UseAfterFreeAcrossStreams",
     "A freed tensor's memory is reused by the caching allocator while another stream still "
     "uses it (no record_stream)."},
    {FindingKind::kStaleRead, "StaleSecondaryRead",
     "A secondary (hpZ) shard is read after its primary shard was written and before it was "
     "refreshed."},
    {FindingKind::kUninitializedRead, "UninitializedRead",
     "Bytes are read that nothing wrote since their buffer was allocated."},
    {FindingKind::kCollectiveMismatch, "CollectiveMismatch",
     "The ranks of a process group issue different collectives at the same position: NCCL hangs."},
};

std::size_t rule_index(FindingKind kind) {
  for (std::size_t i = 0; i < std::size(kRules); ++i)
    if (kRules[i].kind == kind) return i;
  return 0;
}

json rules_json() {
  json rules = json::array();
  for (const RuleText& r : kRules) {
    Finding example;
    example.kind = r.kind;
    rules.push_back(json{{"id", std::string(to_string(r.kind))},
                         {"name", r.name},
                         {"shortDescription", {{"text", r.summary}}},
                         {"fullDescription", {{"text", explain(example)}}},
                         {"help",
                          {{"text", std::string(r.summary) +
                                        " Each result's message names the two operations and the "
                                        "fix; docs/checker.md in hpzlab explains the rules."}}},
                         {"defaultConfiguration", {{"level", "error"}}}});
  }
  return rules;
}

/** Where in the model: the label of the second op (the read or the later access), else the
 *  first's, else its unit. */
std::string module_of(const Finding& f) {
  for (const OpLabel* op : {&f.second, &f.first}) {
    if (op->index == kNoOp) continue;
    if (!op->label.empty()) return op->label;
    if (!op->unit.empty()) return op->unit;
  }
  return "";
}

/** Stable while the same bug stays at the same place: kind, variant and version, and the two
 *  ops by stream, purpose, phase and module (no op index, rank or step). */
std::string fingerprint(const CheckResult& r, const Finding& f) {
  auto op = [](const OpLabel& o) {
    return o.index == kNoOp ? std::string("-")
                            : fmt::format("{}/{}/{}/{}", o.stream, to_string(o.purpose),
                                          to_string(o.phase), o.label.empty() ? o.unit : o.label);
  };
  return fmt::format("{}|{}|{}|{}|{}", to_string(f.kind), label_of(r), op(f.first), op(f.second),
                     f.kind == FindingKind::kCollectiveMismatch ? f.group : f.buffer);
}

json result_json(const CheckResult& r, const FindingGroup& g) {
  const Finding& f = g.example;
  const std::string where =
      fmt::format("{} [{}]", r.scenario.empty() ? "schedule" : r.scenario, label_of(r));
  const std::string text =
      fmt::format("{}: {} ({} occurrence{}). First: {}. Second: {}. What: {}. Fix: {}. {}", where,
                  to_string(f.kind), g.count, g.count == 1 ? "" : "s", describe(f.first),
                  describe(f.second), f.detail, f.fix, explain(f));
  json location{{"physicalLocation",
                 {{"artifactLocation", {{"uri", r.scenario.empty() ? "schedule" : r.scenario}}}}}};
  if (const std::string module = module_of(f); !module.empty()) {
    location["logicalLocations"] =
        json::array({json{{"fullyQualifiedName", module}, {"kind", "module"}}});
  }
  json properties{{"count", g.count},
                  {"ranks", g.ranks},
                  {"steps", g.steps},
                  {"layers", g.layers},
                  {"variant", r.variant}};
  if (const auto v = r.source.find("deepspeed"); v != r.source.end())
    properties["deepspeed"] = v->second;
  return json{{"ruleId", std::string(to_string(f.kind))},
              {"ruleIndex", rule_index(f.kind)},
              {"level", "error"},
              {"message", {{"text", text}}},
              {"locations", json::array({location})},
              {"partialFingerprints", {{"hpzlabFinding/v1", fingerprint(r, f)}}},
              {"properties", properties}};
}

}  // namespace

std::string SarifReporter::render(std::span<const CheckResult> results) const {
  return render(results, {});
}

std::string SarifReporter::render(std::span<const CheckResult> results,
                                  std::span<const DefectResult> defects) const {
  json out = json::array();
  json artifacts = json::array();
  std::set<std::string> files;
  for (const CheckResult& r : results) {
    const std::string file = r.scenario.empty() ? "schedule" : r.scenario;
    if (files.insert(file).second) artifacts.push_back(json{{"location", {{"uri", file}}}});
    for (const FindingGroup& g : r.groups) out.push_back(result_json(r, g));
  }
  json rules = rules_json();
  if (!defects.empty()) {
    rules.push_back(
        json{{"id", "deepspeed-defect"},
             {"name", "KnownDeepSpeedDefect"},
             {"shortDescription",
              {{"text",
                "A known bug of this DeepSpeed release on this run that is not an ordering "
                "bug: its values are wrong on one stream."}}},
             {"help",
              {{"text",
                "The release table (hpzlab releases, docs/deepspeed-releases.md) names the "
                "pull request and the first release that fixes it."}}},
             {"defaultConfiguration", {{"level", "error"}}}});
  }
  for (const DefectResult& d : defects) {
    if (d.result >= results.size()) continue;
    const CheckResult& r = results[d.result];
    const std::string file = r.scenario.empty() ? "schedule" : r.scenario;
    json properties{{"defect", d.id}, {"variant", r.variant}};
    if (const auto v = r.source.find("deepspeed"); v != r.source.end()) {
      properties["deepspeed"] = v->second;
    }
    out.push_back(
        json{{"ruleId", "deepspeed-defect"},
             {"ruleIndex", rules.size() - 1},
             {"level", "error"},
             {"message", {{"text", fmt::format("{} [{}]: {}", file, label_of(r), d.text)}}},
             {"locations",
              json::array({json{{"physicalLocation", {{"artifactLocation", {{"uri", file}}}}}}})},
             {"partialFingerprints",
              {{"hpzlabFinding/v1", fmt::format("deepspeed-defect|{}|{}", d.id, label_of(r))}}},
             {"properties", properties}});
  }
  json doc{
      {"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
      {"version", "2.1.0"},
      {"runs",
       json::array({json{
           {"tool", {{"driver", {{"name", "hpzlab"}, {"version", version_}, {"rules", rules}}}}},
           {"artifacts", artifacts},
           {"results", out}}})}};
  return doc.dump(2) + "\n";
}

}  // namespace hpz::check
