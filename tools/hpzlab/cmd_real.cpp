// `hpzlab real SCENARIO`: run the schedule on real GPUs. The executor is not written yet
// (issue 6); today this subcommand checks the scenario, looks for a CUDA device and says what it
// found. It never pretends to have run anything.
#include <fmt/format.h>

#include "real/device.hpp"
#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

void run_real(const ScenarioOptions& opts, int& exit_code) {
  const Scenario sc = load(opts);
  const real::DeviceInfo dev = real::probe_devices();
  if (dev.count == 0) {
    fmt::print(stderr, "hpzlab: no CUDA device found ({})\n", dev.problem);
    exit_code = kExitNoDevice;
    return;
  }
  fmt::print(stderr,
             "hpzlab: found {} CUDA device(s) ({}), but the real-GPU executor is not implemented "
             "yet (issue 6); nothing was run for {}\n",
             dev.count, dev.name, sc.path);
  exit_code = kExitInternal;
}

}  // namespace

void setup_real(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ScenarioOptions>();
  CLI::App* sub = app.add_subcommand(
      "real",
      "Run the schedule on real GPUs with CUDA streams and NCCL (not implemented yet: "
      "reports the CUDA devices found; exit 3 when there is none)");
  add_scenario_options(*sub, *opts);
  sub->callback([opts, &exit_code] { run_real(*opts, exit_code); });
}

}  // namespace hpz::cli
