// `hpzlab releases [--markdown FILE] [--json FILE]`: the DeepSpeed releases hpzlab knows, grouped
// into epochs of the same schedule, each with the rules that open it and whether the DeepSpeed
// builder models it (sim/deepspeed_releases.hpp). docs/deepspeed-releases.md is its --markdown
// output (tests/cli_cases holds them equal).
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/deepspeed_releases.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

struct ReleasesOptions {
  std::string markdown;  ///< --markdown FILE ("-" = standard output)
  std::string json;      ///< --json FILE ("-" = standard output)
};

const char* scope_name(RuleScope s) {
  switch (s) {
    case RuleScope::kModelled:
      return "modelled";
    case RuleScope::kElsewhere:
      return "not on the builder's paths";
    case RuleScope::kUnmodelled:
      return "NOT MODELLED";
    case RuleScope::kDefect:
      return "a DeepSpeed defect, named in the verdict";
    case RuleScope::kUnordered:
      return "an order within one hook, compared as a set";
  }
  return "?";
}

std::string verdict_of(const ReleaseEpoch& e) {
  return e.refused.empty() ? "modelled" : "refused: " + e.refused;
}

/** One line per epoch, for a terminal. */
std::string text_table() {
  std::string out;
  for (const ReleaseEpoch& e : deepspeed_epochs()) {
    std::string rules;
    for (const ReleaseRule* r : e.rules) rules += (rules.empty() ? "" : ", ") + std::string(r->id);
    out += fmt::format("{:<34} {}{}\n", releases_label(e.releases), verdict_of(e),
                       rules.empty() ? "" : "  [opens: " + rules + "]");
  }
  out += fmt::format(
      "\n{} releases, {} rules; conditional rules refuse only the runs they apply to "
      "(`hpzlab releases --markdown -` for the table with each rule)\n",
      deepspeed_releases().size(), deepspeed_release_rules().size());
  return out;
}

std::string markdown_table() {
  std::string out =
      "# DeepSpeed releases and what the builder models of each\n\n"
      "Made by `build/hpzlab releases --markdown docs/deepspeed-releases.md` from the tables in "
      "[sim/deepspeed_releases.cpp](../sim/deepspeed_releases.cpp); do not edit by hand. Every "
      "release from v0.10.0 (the first with `zero_hpz_partition_size`, ZeRO++, PR 3784) to the "
      "newest on PyPI. A rule is a change in DeepSpeed's ZeRO-3 code that alters what is issued "
      "or in what order, with the PR and the first release that has it (`git tag --contains`; "
      "0.19.6 to 0.19.8 read from their PyPI sdists). A release under a rule the builder does "
      "not model is refused by name (`check --deepspeed` prints it on that release's line and "
      "goes on), never approximated. Rules marked *not on the builder's paths* change a path "
      "the builder's schedules never take (said why); conditional rules refuse only the runs "
      "they apply to. Rules marked *a DeepSpeed defect* are bugs of another kind than the "
      "checker's (wrong values computed on one stream): `check` names each on the verdict of a "
      "release it applies to and counts it as a finding.\n\n## Epochs (a dense model: no gradient "
      "accumulation, qwZ or qgZ, "
      "torch 2.1.2)\n\n| releases | the builder | rules that open the epoch |\n|---|---|---|\n";
  for (const ReleaseEpoch& e : deepspeed_epochs()) {
    std::string rules;
    for (const ReleaseRule* r : e.rules) {
      rules += fmt::format("{}`{}` ({})", rules.empty() ? "" : ", ", r->id, r->pr);
    }
    out += fmt::format("| {} | {} | {} |\n", releases_label(e.releases), verdict_of(e), rules);
  }
  out +=
      "\n## Rules\n\n| rule | PR | releases | applies | the builder | what it changes |\n"
      "|---|---|---|---|---|---|\n";
  for (const ReleaseRule& r : deepspeed_release_rules()) {
    std::string what = r.what;
    if (r.scope == RuleScope::kElsewhere) what += fmt::format(" (only for {})", r.where);
    if (*r.ends != '\0') what += fmt::format(" (ends `{}`)", r.ends);
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", r.id, r.pr, window_of(r),
                       condition_of(r).empty() ? "always" : condition_of(r), scope_name(r.scope),
                       what);
  }
  out += "\n## Releases\n\n| release | date |\n|---|---|\n";
  for (const DeepSpeedRelease& r : deepspeed_releases()) {
    out += fmt::format("| {} | {} |\n", r.version, r.date);
  }
  return out;
}

nlohmann::json json_table() {
  nlohmann::json releases = nlohmann::json::array();
  for (const DeepSpeedRelease& r : deepspeed_releases()) {
    releases.push_back({{"version", r.version}, {"date", r.date}});
  }
  nlohmann::json rules = nlohmann::json::array();
  for (const ReleaseRule& r : deepspeed_release_rules()) {
    rules.push_back(
        {{"id", r.id},
         {"pr", r.pr},
         {"first", r.first},
         {"until", until_of(r).empty() ? nlohmann::json(nullptr) : nlohmann::json(until_of(r))},
         {"ends", *r.ends ? nlohmann::json(r.ends) : nlohmann::json(nullptr)},
         {"applies", condition_of(r).empty() ? "always" : condition_of(r)},
         {"scope", scope_name(r.scope)},
         {"what", r.what},
         {"where", r.where}});
  }
  nlohmann::json epochs = nlohmann::json::array();
  for (const ReleaseEpoch& e : deepspeed_epochs()) {
    nlohmann::json ids = nlohmann::json::array();
    for (const ReleaseRule* r : e.rules) ids.push_back(r->id);
    epochs.push_back({{"releases", e.releases},
                      {"modelled", e.refused.empty()},
                      {"refused", e.refused},
                      {"opened_by", ids}});
  }
  return {{"latest", latest_deepspeed_release()},
          {"releases", releases},
          {"rules", rules},
          {"epochs", epochs}};
}

}  // namespace

void setup_releases(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ReleasesOptions>();
  CLI::App* sub = app.add_subcommand(
      "releases",
      "The DeepSpeed releases hpzlab knows (from ZeRO++ to the newest), grouped into epochs that "
      "issue the same schedule, and the rules (PRs) that separate them: which the DeepSpeed "
      "builder models and which it refuses");
  sub->add_option("--markdown", opts->markdown,
                  "Write the tables as Markdown to FILE ('-' = stdout, instead of the text): "
                  "docs/deepspeed-releases.md");
  sub->add_option("--json", opts->json, "Write the tables as JSON to FILE ('-' = stdout)");
  sub->callback([opts, &exit_code] {
    check_outputs({{opts->markdown, "--markdown"}, {opts->json, "--json"}}, {});
    if (opts->markdown == "-" && opts->json == "-") {
      throw InputError("", "--markdown/--json", "only one of them can write to standard output");
    }
    if (!opts->markdown.empty()) write_output(opts->markdown, markdown_table(), "--markdown");
    if (!opts->json.empty()) write_output(opts->json, json_table().dump(2) + "\n", "--json");
    if (opts->markdown != "-" && opts->json != "-") {
      const std::string text = text_table();
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    exit_code = kExitOk;
  });
}

}  // namespace hpz::cli
