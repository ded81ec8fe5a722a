// libFuzzer target: the readers of `hpzlab sweep --collect` and `--resume` (issue 34). The first
// byte says which file the rest is, and it goes through the functions the command reads that
// file with:
//   s  a simulation's JSON (DIR/out/pP-vV.json): parse_json_input, rows_from_sim
//   x  a repro's JSON (DIR/out/pP-repro.json): parse_json_input, fill_repro
//   r  results.jsonl: rows_from_jsonl (each line through checked_row)
//   p  sweep.json: parse_json_input, plan_from_json (the command line's limits)
//   e  a command's standard error (DIR/out/pP-vV.err): error_line_of, into a failed row
// against the plan of `hpzlab sweep scenarios/tiny.toml --vary cluster.nic_gbps=1,100 --variants
// stock,no-hpz --runs 2 --repro` (the seed corpus, tests/fuzz/sweep/, is such a sweep's files).
// Every row made is dumped as JSON (it must be UTF-8) and as a CSV line. Anything but InputError
// escaping (a nlohmann exception is "internal error", exit 70), a message of more than one line,
// a crash or a sanitizer report is a finding.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "tools/hpzlab/sweep/fields.hpp"
#include "tools/hpzlab/sweep/plan.hpp"
#include "tools/hpzlab/sweep/runner.hpp"
#include "tools/hpzlab/sweep/table.hpp"

namespace {

using namespace hpz::sweep;

const Plan& seed_plan() {
  static const Plan plan = [] {
    Plan p;
    p.scenario = "scenarios/tiny.toml";
    p.axes = {{"cluster.nic_gbps", {"1", "100"}}};
    p.variants = {variant_spec("stock"), variant_spec("no-hpz")};
    p.runs = 2;
    p.repro = true;
    return p;
  }();
  return plan;
}

void use(const Plan& plan, const std::vector<Row>& rows) {
  const std::vector<std::string> cols = columns(plan);
  for (const Row& row : rows) {
    (void)row.dump();  // throws for a string that is not UTF-8
    (void)csv_line(cols, row);
  }
}

void run(char kind, const std::string& text) {
  const Plan& plan = seed_plan();
  const SimKey key{1, 1};
  switch (kind) {
    case 's': {
      const nlohmann::json sim = hpz::parse_json_input(text, "p1-v1.json", "not JSON");
      use(plan, rows_from_sim(plan, key, sim, "p1-v1.json"));
      break;
    }
    case 'x': {
      const nlohmann::json repro = hpz::parse_json_input(text, "p1-repro.json", "not JSON");
      Field(repro, "p1-repro.json").at("variants").object();  // as --collect checks it
      std::vector<Row> rows = failed_rows(plan, key, "");
      fill_repro(rows, repro, "", "p1-repro.json");
      use(plan, rows);
      break;
    }
    case 'r':
      use(plan, rows_from_jsonl(plan, text, "results.jsonl"));
      break;
    case 'p': {
      const Plan read =
          plan_from_json(hpz::parse_json_input(text, "sweep.json", "not JSON"), "sweep.json");
      (void)read.to_json().dump();
      (void)columns(read);
      (void)read.values_at(read.points() - 1);
      break;
    }
    default:
      use(plan, failed_rows(plan, key, error_line_of(text)));
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    run(static_cast<char>(data[0]), text);
  } catch (const hpz::InputError& e) {
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) __builtin_trap();
  }
  return 0;
}
