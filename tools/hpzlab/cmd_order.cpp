// `hpzlab order SCENARIO [--rank N | --digest] [--golden FILE]`, `hpzlab order --check FILE...`,
// `hpzlab order --update FILE...`: each rank's issue order as canonical text, and golden files
// that CI compares it with (docs/orders.md).
#include <fmt/format.h>

#include <optional>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/ir/order.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

struct OrderOptions {
  std::string scenario;
  std::vector<std::string> sets;
  UserFlags user;  ///< the one-command flags (--ds-config, --hf-config, --nodes, ...)
  std::optional<int> rank;
  bool digest_only = false;
  std::string golden;               ///< --golden FILE: write a new golden file
  std::vector<std::string> check;   ///< --check FILE...
  std::vector<std::string> update;  ///< --update FILE...
};

/** "stock, DeepSpeed 0.13.4 built" (schedule_label). */
std::string built_by(const Schedule& s) {
  return schedule_label(s.variant, s.source);
}

Schedule build(const std::string& scenario, const std::vector<std::string>& sets,
               const UserFlags& user = {}) {
  ScenarioOptions opts;
  opts.scenario = scenario;
  opts.sets = sets;
  opts.user = user;
  return build_schedule(load(opts));
}

GoldenOrder golden_now(const std::string& scenario, const std::vector<std::string>& sets) {
  const Schedule s = build(scenario, sets);
  return make_golden_order(s, scenario, sets, built_by(s));
}

GoldenOrder read_golden(const std::string& file) {
  return parse_golden_order(read_input_file(file, file, "", "cannot read this golden file"), file);
}

std::string command_of(const GoldenOrder& g) {
  std::string out = "hpzlab order " + g.scenario;
  for (const std::string& s : g.sets) out += " --set " + s;
  return out;
}

/** Compares each file with the order built now; 1 when one differs. */
int check_goldens(const std::vector<std::string>& files) {
  int rc = kExitOk;
  for (const std::string& file : files) {
    const GoldenOrder golden = read_golden(file);
    const GoldenOrder now = golden_now(golden.scenario, golden.sets);
    const std::string diff = golden_order_diff(golden, now);
    if (diff.empty()) {
      std::printf("%s: equal to the golden order (%zu ranks, %s)\n", file.c_str(),
                  golden.ranks.size(), now.built_by.c_str());
      continue;
    }
    rc = kExitFindings;
    std::printf(
        "%s: the order differs from the golden one (%s; %s)\n%s"
        "  if the change is intended: hpzlab order --update %s, and commit the file with "
        "the change\n",
        file.c_str(), command_of(golden).c_str(), now.built_by.c_str(), diff.c_str(), file.c_str());
  }
  return rc;
}

void update_goldens(const std::vector<std::string>& files) {
  // Everything is read and rebuilt before anything is written: a bad file changes nothing.
  std::vector<std::pair<std::string, std::string>> texts;
  for (const std::string& file : files) {
    const GoldenOrder golden = read_golden(file);
    const GoldenOrder now = golden_now(golden.scenario, golden.sets);
    const bool changed = !golden_order_diff(golden, now).empty();
    texts.emplace_back(file, golden_order_text(now));
    std::printf("%s: %s\n", file.c_str(), changed ? "rewritten (the order changed)" : "unchanged");
  }
  for (const auto& [file, text] : texts) write_output(file, text, "--update");
}

void print_orders(const OrderOptions& opts) {
  if (!opts.golden.empty() && !flag_settings(opts.user).empty()) {
    throw InputError("", "--golden",
                     "a golden file names a scenario file and --set overrides: give the "
                     "one-command flags as --set keys (e.g. --set zero.ds_config=ds.json)");
  }
  const Schedule s = build(opts.scenario, opts.sets, opts.user);
  if (opts.rank && (*opts.rank < 0 || *opts.rank >= s.world_size)) {
    throw InputError(
        "--rank", "",
        fmt::format("rank {} does not exist (allowed: 0 to {})", *opts.rank, s.world_size - 1));
  }
  if (!opts.golden.empty()) {
    check_outputs({{opts.golden, "--golden"}}, {opts.scenario});
    const GoldenOrder g = make_golden_order(s, opts.scenario, opts.sets, built_by(s));
    write_output(opts.golden, golden_order_text(g), "--golden");
    std::printf("%s: golden order of %s (%s) written\n", opts.golden.c_str(), command_of(g).c_str(),
                g.built_by.c_str());
    return;
  }
  std::string out =
      fmt::format("# {} ({}): canonical issue order (docs/orders.md)\n", s.scenario, built_by(s));
  for (Rank r = 0; r < s.world_size; ++r) {
    if (opts.rank && r != *opts.rank) continue;
    const std::vector<std::string> lines = canonical_order(s, r);
    out += fmt::format("rank {} ops {} digest {}\n", r, lines.size(), order_digest(lines));
    if (opts.digest_only) continue;
    for (const std::string& line : lines) out += line + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void run_order(const OrderOptions& opts, int& exit_code) {
  const bool one_command = !flag_settings(opts.user).empty();
  const int modes = static_cast<int>(!opts.scenario.empty() || one_command) +
                    static_cast<int>(!opts.check.empty()) + static_cast<int>(!opts.update.empty());
  if (modes != 1) {
    throw InputError("", "order",
                     "give one of: a scenario (print its orders or, with --golden, write a golden "
                     "file), --check GOLDEN... or --update GOLDEN...");
  }
  if (opts.scenario.empty() && !one_command &&
      (!opts.sets.empty() || opts.rank || opts.digest_only || !opts.golden.empty())) {
    throw InputError("", "--check/--update",
                     "take golden files only: the scenario and its --set overrides are in them");
  }
  exit_code = kExitOk;
  if (!opts.check.empty()) {
    exit_code = check_goldens(opts.check);
  } else if (!opts.update.empty()) {
    update_goldens(opts.update);
  } else {
    print_orders(opts);
  }
}

}  // namespace

void setup_order(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<OrderOptions>();
  CLI::App* sub = app.add_subcommand(
      "order",
      "Print each rank's issue order as canonical text with a digest per rank, or write, check and "
      "update golden order files that CI compares it with (docs/orders.md)");
  sub->add_option("scenario", opts->scenario,
                  "Scenario file (TOML), e.g. scenarios/tiny.toml; optional with --hf-config FILE "
                  "--ds-config FILE");
  sub->add_option("--set", opts->sets,
                  "Override a scenario key, e.g. --set run.variant=host-sync (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  add_user_flags(*sub, opts->user, true);
  sub->add_option("--rank", opts->rank, "Print this rank's order only");
  sub->add_flag("--digest", opts->digest_only, "Print each rank's op count and digest only");
  sub->add_option("--golden", opts->golden,
                  "Write the scenario's golden order file (every rank's digest, rank 0's order)");
  sub->add_option("--check", opts->check,
                  "Compare golden files with the orders built now: exit 0 when equal, 1 with a "
                  "diff when not")
      ->take_all();
  sub->add_option("--update", opts->update, "Rewrite golden files with the orders built now")
      ->take_all();
  sub->callback([opts, &exit_code] { run_order(*opts, exit_code); });
}

}  // namespace hpz::cli
