// `hpzlab check`'s text: each verdict's report with the lines under it (known DeepSpeed defects,
// the builder comparison, --explain, --sensitivity, notes) and, for the version matrix, a line
// per epoch of releases and each finding's history across them.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "sim/check/explain.hpp"
#include "sim/check/release_history.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/time/sensitivity.hpp"
#include "tools/hpzlab/check_internal.hpp"

namespace hpz::cli {
namespace {

/** defect_sentence as a line under a verdict. */
std::string defect_line(const ReleaseRule& r, bool whole) {
  return "  " + defect_sentence(r, whole) + "\n";
}

/** The --explain lines of a checked run ("" without --explain or for a verdict with findings). */
std::string explain_lines(const Checked& c) {
  if (!c.explanation) return "";
  std::string out = check::explain_text(*c.explanation);
  if (c.probes.empty()) return out;
  out +=
      "    each key at ten times this run's value or DeepSpeed's default (gathers further "
      "ahead):\n";
  for (const Probe& p : c.probes) {
    std::string got;
    if (!p.refused.empty()) {
      got = "not checked: " + p.refused;
    } else if (p.races + p.stale == 0) {
      got = "still clean";
    } else {
      got = fmt::format("{} secondary race{}{}", p.races, p.races == 1 ? "" : "s",
                        p.stale > 0 ? fmt::format(", {} stale reads", p.stale) : "");
    }
    out += fmt::format("      {}={}: {}\n", p.key, p.value, got);
  }
  return out;
}

/** The notes under a verdict in the text: the scenario's (what was read, ignored, defaulted),
 *  then the one-step note. */
std::string note_line(const Checked& c) {
  std::string out;
  for (const std::string& n : c.notes) out += "  note: " + n + "\n";
  const std::string note = one_step_note(c);
  return note.empty() ? out : out + "  note: " + note + "\n";
}

/** Each known defect in `scenario`'s matrix with the checked releases that have it. */
std::string defects_history(const std::vector<Checked>& checked, const std::string& scenario) {
  std::vector<std::pair<const ReleaseRule*, std::vector<std::string>>> seen;
  for (const Checked& c : checked) {
    if (c.result.scenario != scenario || !c.refused.empty()) continue;
    for (const ReleaseRule* r : c.defects) {
      auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first == r; });
      if (it == seen.end()) it = seen.insert(seen.end(), {r, {}});
      it->second.insert(it->second.end(), c.releases.begin(), c.releases.end());
    }
  }
  std::string out;
  for (const auto& [r, releases] : seen) {
    out += fmt::format("    DeepSpeed defect `{}` ({}): in {}; {}\n", r->id, r->pr,
                       releases_label(releases), fixed_label(*r));
  }
  return out;
}

/** Under a scenario's matrix of more than one epoch: each kind of finding with the releases that
 *  have it, the first that has it and the first that does not any more. */
std::string history_text(const std::vector<Checked>& checked, const std::string& scenario) {
  const std::vector<check::EpochVerdict> epochs = epochs_of_scenario(checked, scenario);
  if (epochs.size() < 2) return "";
  const std::vector<check::FindingHistory> history = check::finding_history(epochs);
  const std::string defects = defects_history(checked, scenario);
  if (history.empty() && defects.empty()) {
    return "  across these releases: nothing found in any checked release\n";
  }
  std::string out = "  across these releases:\n" + defects;
  for (const check::FindingHistory& h : history) {
    std::string spans;
    for (const std::string& s : h.spans) spans += (spans.empty() ? "" : ", ") + s;
    std::string fixed = h.fixed_in.empty() ? "not fixed in the newest checked release"
                                           : fmt::format("gone from {} on", h.fixed_in);
    if (!h.unchecked_before_fix.empty()) {
      fixed += fmt::format(" ({} not checked)", h.unchecked_before_fix);
    }
    out += fmt::format("    {}: in {}; {}\n      to do: {}\n", h.signature, spans, fixed, h.remedy);
  }
  // The remedy at the user's level: the releases this configuration is clean on.
  const std::vector<std::string> runs = clean_runs(checked, scenario);
  out += runs.empty()
             ? "  clean in: none of the checked releases\n"
             : fmt::format("  clean in: {} (the releases to run this on)\n", fmt::join(runs, ", "));
  // Where to read each finding explained: its ops, the edge that is missing, the fix.
  std::vector<std::string> firsts;
  for (const check::FindingHistory& h : history) {
    if (std::find(firsts.begin(), firsts.end(), h.first) == firsts.end()) {
      firsts.push_back(h.first);
    }
  }
  if (firsts.empty()) return out;
  out += fmt::format(
      "  each finding explained (its ops, the missing edge, what fixes it): check one release "
      "alone, --deepspeed {}\n",
      fmt::join(firsts, " or --deepspeed "));
  return out;
}

/** A matrix epoch's lines: its verdict line and, when something was found, the worst group's
 *  line (what and where); one release alone explains it (verdict_text). */
std::string matrix_epoch_text(const std::vector<Checked>& checked, std::size_t i,
                              const std::string& full) {
  std::string text = full.substr(0, full.find('\n') + 1);
  if (const auto w = full.find("\nWorst: "); w != std::string::npos) {
    text += "  " + full.substr(w + 1, full.find('\n', w + 1) - w);
  }
  for (const ReleaseRule* r : checked[i].defects) text += defect_line(*r, false);
  if (checked[i].builder) text += "  " + describe(*checked[i].builder) + "\n";
  text += explain_lines(checked[i]);
  // The scenario's notes once, under its last epoch (they are the same for every
  // release, but for a one-step note), then its findings across the releases.
  const bool last_of_scenario =
      i + 1 == checked.size() || checked[i + 1].result.scenario != checked[i].result.scenario;
  if (checked[i].releases.empty() || last_of_scenario) text += note_line(checked[i]);
  if (last_of_scenario) text += history_text(checked, checked[i].result.scenario);
  return text;
}

/** One verdict explained in full: its report `full`, then the lines under it. */
std::string verdict_text(const CheckOptions& opts, const Checked& c, const std::string& full) {
  std::string text = full;
  for (const ReleaseRule* r : c.defects) text += defect_line(*r, true);
  if (c.builder) text += "  " + describe(*c.builder) + "\n";
  text += explain_lines(c);
  if (c.sensitivity) {
    std::string sentence = time::sensitivity_sentence(*c.sensitivity);
    if (sentence.rfind("The ", 0) == 0) sentence[0] = 't';
    text += "  in the simulation: " + sentence + "\n";
  } else if (opts.sensitivity && c.refused.empty() && !c.result.clean()) {
    text += "  in the simulation: no race of this schedule to time\n";
  }
  text += note_line(c);
  return text;
}

}  // namespace

/** A known DeepSpeed defect in one sentence: short (a matrix's line, JUnit's message) or whole
 *  (one release's text, SARIF's message). */
std::string defect_sentence(const ReleaseRule& r, bool whole) {
  const std::string fixed = fixed_label(r);
  return whole ? fmt::format("DeepSpeed defect `{}` ({}, {}), not an ordering bug: {}", r.id, r.pr,
                             fixed, r.what)
               : fmt::format("DeepSpeed defect `{}` ({}): {} (`hpzlab releases` says what)", r.id,
                             condition_of(r), fixed);
}

/** A clean verdict on one step says nothing about the hpZ race: DeepSpeed copies the secondary
 *  partition in one step and reads it, racing, in the next, after the optimizer step (step 0
 *  only records the module trace, without prefetching). Built schedules of one step are clean
 *  for that reason alone. */
std::string one_step_note(const Checked& c) {
  if (!c.refused.empty() || !c.result.clean() || c.steps >= 2) return "";
  return fmt::format(
      "only {} step checked: one step of DeepSpeed's schedule cannot show the hpZ race, which "
      "needs a step after the optimizer's ({})",
      c.steps, c.from_file ? "record 2 steps or more" : "--set run.steps=2 or more");
}

/** A refused epoch's one line, in the verdict line's form. */
std::string refused_line(const Checked& c) {
  return fmt::format("{} [DeepSpeed {}]: not checked: {}\n", c.result.scenario,
                     releases_label(c.releases), c.refused);
}

/** The matrix's epochs of one scenario, for the history across releases. */
std::vector<check::EpochVerdict> epochs_of_scenario(const std::vector<Checked>& checked,
                                                    const std::string& scenario) {
  std::vector<check::EpochVerdict> out;
  for (const Checked& c : checked) {
    if (c.releases.empty() || c.result.scenario != scenario) continue;
    out.push_back({c.releases, c.refused.empty() ? &c.result : nullptr});
  }
  return out;
}

/** The releases of `scenario`'s matrix that are clean (Checked::clean: no finding, no known
 *  defect), consecutive clean epochs joined into one run ("0.13.5-0.14.2"); refused and unclean
 *  epochs break a run. */
std::vector<std::string> clean_runs(const std::vector<Checked>& checked,
                                    const std::string& scenario) {
  std::vector<std::string> runs;
  std::string first, last;
  const auto close = [&] {
    if (!first.empty()) runs.push_back(first == last ? first : first + "-" + last);
    first.clear();
  };
  for (const Checked& c : checked) {
    if (c.releases.empty() || c.result.scenario != scenario) continue;
    if (c.clean()) {
      if (first.empty()) first = c.releases.front();
      last = c.releases.back();
    } else {
      close();
    }
  }
  close();
  return runs;
}

std::string check_text(const CheckOptions& opts, const std::vector<Checked>& checked,
                       const std::vector<std::string>& reports, bool matrix) {
  // More than one release: a line per epoch. One release (--deepspeed X) is explained in full,
  // as without --deepspeed (issue 35: the explanation was lost there).
  std::string text;
  for (std::size_t i = 0; i < checked.size(); ++i) {
    if (matrix) {
      text += matrix_epoch_text(checked, i, reports[i]);
      continue;
    }
    if (i > 0) text += "\n";
    text += verdict_text(opts, checked[i], reports[i]);
  }
  return text;
}

}  // namespace hpz::cli
