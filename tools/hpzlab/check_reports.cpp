// `hpzlab check`'s machine-readable outputs: --json (the checker's JSON with the notes, known
// defects, builder comparisons, --explain, --sensitivity and the matrix's releases), --junit (a
// test case per verdict) and --sarif (the checker's findings and the known defects).
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "sim/check/explain.hpp"
#include "sim/check/release_history.hpp"
#include "sim/check/report.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/time/sensitivity.hpp"
#include "sim/xml.hpp"
#include "tools/hpzlab/check_internal.hpp"

namespace hpz::cli {
namespace {

/** The JSON's "releases": each epoch of the matrix with its verdict, and per scenario the history
 *  of each kind of finding across them. */
nlohmann::json releases_json(const std::vector<Checked>& checked) {
  nlohmann::json epochs = nlohmann::json::array();
  std::vector<std::string> scenarios;
  for (const Checked& c : checked) {
    if (c.releases.empty()) continue;
    if (std::find(scenarios.begin(), scenarios.end(), c.result.scenario) == scenarios.end()) {
      scenarios.push_back(c.result.scenario);
    }
    nlohmann::json e = {{"scenario", c.result.scenario},
                        {"releases", c.releases},
                        {"checked", c.refused.empty()},
                        {"clean", c.clean()}};
    if (!c.refused.empty()) e["refused"] = c.refused;
    nlohmann::json defects = nlohmann::json::array();
    for (const ReleaseRule* r : c.defects) defects.push_back(r->id);
    e["defects"] = defects;
    nlohmann::json counts = nlohmann::json::object();
    for (const check::FindingKind k : check::kAllKinds) {
      if (c.refused.empty() && c.result.count(k) > 0) counts[to_string(k)] = c.result.count(k);
    }
    e["counts"] = counts;
    epochs.push_back(std::move(e));
  }
  nlohmann::json history = nlohmann::json::array();
  nlohmann::json clean_in = nlohmann::json::array();
  for (const std::string& scenario : scenarios) {
    clean_in.push_back({{"scenario", scenario}, {"releases", clean_runs(checked, scenario)}});
    for (const check::FindingHistory& h :
         check::finding_history(epochs_of_scenario(checked, scenario))) {
      history.push_back(
          {{"scenario", scenario},
           {"signature", h.signature},
           {"remedy", h.remedy},
           {"kind", to_string(h.kind)},
           {"in", h.spans},
           {"first", h.first},
           {"fixed_in", h.fixed_in.empty() ? nlohmann::json(nullptr) : nlohmann::json(h.fixed_in)},
           {"unchecked_before_fix", h.unchecked_before_fix},
           {"worst_count", h.count}});
    }
  }
  return {{"epochs", epochs}, {"findings", history}, {"clean_in", clean_in}};
}

/** The JSON's "notes": the same notes as the text (issue 17: notes everywhere). */
nlohmann::json notes_json(const std::vector<Checked>& checked) {
  nlohmann::json notes = nlohmann::json::array();
  for (const Checked& c : checked) {
    for (const std::string& n : c.notes) notes.push_back(c.result.scenario + ": " + n);
    if (const std::string n = one_step_note(c); !n.empty()) {
      notes.push_back(c.result.scenario + ": " + n);
    }
  }
  return notes;
}

/** The JSON's "defects": known DeepSpeed defects (RuleScope::kDefect), findings the checker
 *  cannot make, so the verdict is not clean where one applies. */
nlohmann::json defects_json(const std::vector<Checked>& checked) {
  nlohmann::json defects = nlohmann::json::array();
  for (const Checked& c : checked) {
    for (const ReleaseRule* r : c.defects) {
      const std::string until = until_of(*r);
      defects.push_back(
          {{"scenario", c.result.scenario},
           {"releases", !c.releases.empty() ? c.releases
                        : c.release.empty() ? std::vector<std::string>{}
                                            : std::vector<std::string>{c.release}},
           {"rule", r->id},
           {"pr", r->pr},
           {"fixed_in", until.empty() ? nlohmann::json(nullptr) : nlohmann::json(until)},
           {"what", r->what}});
    }
  }
  return defects;
}

/** The JSON's "builder_comparisons" (--record): each recording against the builder. */
nlohmann::json builders_json(const std::vector<Checked>& checked) {
  nlohmann::json builders = nlohmann::json::array();
  for (const Checked& c : checked) {
    if (!c.builder) continue;
    const RecordingComparison& b = *c.builder;
    nlohmann::json one = {{"scenario", c.result.scenario},
                          {"schedule", check::label_of(c.result)},
                          {"ranks", b.ranks},
                          {"projected_ops", b.ops},
                          {"equal", b.equal()}};
    if (!b.error.empty()) one["error"] = b.error;
    if (!b.expected_because.empty()) one["expected_because"] = b.expected_because;
    if (!b.divergence.empty()) {
      one["rank"] = b.diverging_rank;
      one["divergence"] = b.divergence;
    }
    builders.push_back(std::move(one));
  }
  return builders;
}

/** --explain's probes of one verdict, for the JSON's "keys_at_ten_times". */
nlohmann::json probes_json(const std::vector<Probe>& probes) {
  nlohmann::json out = nlohmann::json::array();
  for (const Probe& p : probes) {
    nlohmann::json q = {{"key", p.key}, {"value", p.value}};
    if (p.refused.empty()) {
      q["secondary_races"] = p.races;
      q["secondary_stale_reads"] = p.stale;
    } else {
      q["refused"] = p.refused;
    }
    out.push_back(std::move(q));
  }
  return out;
}

/** The JSON's "explain" (--explain): each explained verdict with its probes. */
nlohmann::json explained_json(const std::vector<Checked>& checked) {
  nlohmann::json explained = nlohmann::json::array();
  for (const Checked& c : checked) {
    if (!c.explanation) continue;
    nlohmann::json one = check::explain_json(*c.explanation);
    one["scenario"] = c.result.scenario;
    one["schedule"] = check::label_of(c.result);
    one["keys_at_ten_times"] = probes_json(c.probes);
    explained.push_back(std::move(one));
  }
  return explained;
}

/** The JSON's "sensitivity" (--sensitivity): each verdict's timing margin. */
nlohmann::json margins_json(const std::vector<Checked>& checked) {
  nlohmann::json margins = nlohmann::json::array();
  for (const Checked& c : checked) {
    if (!c.sensitivity) continue;
    nlohmann::json one = time::sensitivity_json(*c.sensitivity);
    one["scenario"] = c.result.scenario;
    one["schedule"] = check::label_of(c.result);
    margins.push_back(std::move(one));
  }
  return margins;
}

/** One verdict as a JUnit test case, `report` its text; counts it in `failures` or `skipped`. */
std::string junit_case(const Checked& c, const std::string& report, std::size_t& failures,
                       std::size_t& skipped) {
  // The failure's message: the verdict line, or for a schedule the checker found clean, the
  // defect that fails it (a line saying "clean" would not say why the case failed).
  std::string first = report.substr(0, report.find('\n'));
  if (c.refused.empty() && c.result.clean() && !c.defects.empty()) {
    first = defect_sentence(*c.defects.front(), false);
  }
  const std::string name =
      c.refused.empty() ? check::label_of(c.result) : "DeepSpeed " + releases_label(c.releases);
  std::string out = fmt::format("    <testcase classname=\"{}\" name=\"{}\">\n",
                                xml_escaped(c.result.scenario), xml_escaped(name));
  if (!c.refused.empty()) {
    ++skipped;
    out += fmt::format("      <skipped message=\"{}\"/>\n", xml_escaped(c.refused));
  } else if (!c.clean()) {
    ++failures;
    out += fmt::format("      <failure message=\"{}\" type=\"hpzlab.finding\">{}</failure>\n",
                       xml_escaped(first), xml_escaped(report));
  }
  return out + "    </testcase>\n";
}

}  // namespace

nlohmann::json check_json(const CheckOptions& opts, const std::vector<Checked>& checked,
                          const std::vector<check::CheckResult>& results) {
  nlohmann::json j = nlohmann::json::parse(check::JsonReporter().render(results));
  // The same notes as the text, in the JSON under "notes" (issue 17: notes everywhere).
  j["notes"] = notes_json(checked);
  const nlohmann::json defects = defects_json(checked);
  j["defects"] = defects;
  if (!defects.empty()) j["clean"] = false;
  if (nlohmann::json builders = builders_json(checked); !builders.empty()) {
    j["builder_comparisons"] = std::move(builders);
  }
  if (opts.explain) j["explain"] = explained_json(checked);
  if (opts.sensitivity) j["sensitivity"] = margins_json(checked);
  if (std::any_of(checked.begin(), checked.end(),
                  [](const Checked& c) { return !c.releases.empty(); })) {
    j["releases"] = releases_json(checked);
  }
  return j;
}

std::string junit_xml(const std::vector<Checked>& checked,
                      const std::vector<std::string>& reports) {
  // JUnit XML for CI systems (issue 19): one test case per checked schedule (scenario x
  // version), named by the verdict's bracket; a finding fails it with the verdict line as the
  // message and the whole report as the text.
  std::size_t failures = 0;
  std::size_t skipped = 0;
  std::string cases;
  for (std::size_t i = 0; i < checked.size(); ++i) {
    cases += junit_case(checked[i], reports[i], failures, skipped);
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<testsuites name=\"hpzlab check\" tests=\"{0}\" failures=\"{1}\">\n"
      "  <testsuite name=\"hpzlab check\" tests=\"{0}\" failures=\"{1}\" "
      "skipped=\"{3}\">\n"
      "{2}  </testsuite>\n</testsuites>\n",
      checked.size(), failures, cases, skipped);
}

std::string sarif_text(const std::vector<Checked>& checked,
                       const std::vector<check::CheckResult>& results) {
  // The known DeepSpeed defects of each checked release, as the text and JUnit name them.
  std::vector<check::DefectResult> defects;
  std::size_t at = 0;
  for (const Checked& c : checked) {
    if (!c.refused.empty()) continue;
    for (const ReleaseRule* r : c.defects) {
      defects.push_back({at, r->id, defect_sentence(*r, true)});
    }
    ++at;
  }
  return check::SarifReporter(version()).render(results, defects);
}

}  // namespace hpz::cli
