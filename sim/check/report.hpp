// Output formats for check results, behind one interface: one implementation per format, each
// in its own file (text_report.cpp, json_report.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "sim/check/checker.hpp"

namespace hpz::check {

/** Turns the results of one `hpzlab check` run (one per scenario) into a document. */
class Reporter {
 public:
  virtual ~Reporter() = default;
  /** The whole document for these results. */
  virtual std::string render(std::span<const CheckResult> results) const = 0;
};

/** For people: per scenario, a verdict line, the worst finding explained for a DeepSpeed user,
 *  then every other group of findings with its count and span. */
class TextReporter final : public Reporter {
 public:
  std::string render(std::span<const CheckResult> results) const override;
  /** The report of one result. */
  std::string render_one(const CheckResult& result) const;
};

/** For tools: {"clean", "scenarios": [...], "findings": [{"kind", "count", ...}]}. */
class JsonReporter final : public Reporter {
 public:
  std::string render(std::span<const CheckResult> results) const override;
};

/** For code-scanning tools (GitHub, GitLab): SARIF 2.1.0, one run of tool "hpzlab" with a rule
 *  per finding kind and a result per finding group (sarif_report.cpp, docs/ci.md). */
/** A known DeepSpeed defect of one checked release (a bug that is not an ordering bug, which the
 *  checker cannot find: `hpzlab releases`, RuleScope::kDefect), for the SARIF report. */
struct DefectResult {
  std::size_t result = 0;  ///< index of the CheckResult (the release) it holds for
  std::string id;          ///< the rule's id, "qwz-quantizer-reads-half"
  std::string text;        ///< one line: what it is, where it holds, what fixes it
};

class SarifReporter final : public Reporter {
 public:
  /** `version`: hpzlab's, for tool.driver.version. */
  explicit SarifReporter(std::string version) : version_(std::move(version)) {}
  std::string render(std::span<const CheckResult> results) const override;
  /** With a result of rule "deepspeed-defect" for each known DeepSpeed defect, so that a tool
   *  reading the SARIF sees what makes the exit status 1 where the checker found nothing. */
  std::string render(std::span<const CheckResult> results,
                     std::span<const DefectResult> defects) const;

 private:
  std::string version_;
};

/** What a finding means, for someone who knows DeepSpeed but not happens-before: a paragraph. */
std::string explain(const Finding& finding);

/** What a user does about a finding, in one sentence at their level: the DeepSpeed release that
 *  fixes it, or the config key that avoids it and what that costs; for a finding no release
 *  fixes, to report it (`fix` is the edge DeepSpeed itself would need). The rows of the README's
 *  "what now" table. */
std::string remedy(const Finding& finding);

/** What a verdict line names in brackets: the variant and, for a recording or the DeepSpeed
 *  builder, the DeepSpeed version ("stock, DeepSpeed 0.13.4 built"). */
std::string label_of(const CheckResult& result);

/** "0-7,9,12-15,20,22,...,40": a sorted set of integers as ranges, and runs of ranges of one
 *  width one stride apart ("8-9,16-17,...,64-65") as their first two and last where that is
 *  shorter. */
std::string format_ranges(const std::set<int>& values);

}  // namespace hpz::check
