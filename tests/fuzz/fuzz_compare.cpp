// libFuzzer target: the compare reader (issue 20). The input is the simulated run's JSON (what
// `hpzlab sim --op-times --json` writes), a line "--real", then the measured run's (what
// `hpzlab real --json` writes); both are parsed as `hpzlab compare` parses its files, compared,
// and the comparison rendered as text and JSON. Anything but InputError escaping, a crash or a
// sanitizer report is a finding.
#include <cstdint>
#include <string>
#include <string_view>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/time/compare.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kMarker = "\n--real\n";
  const std::size_t at = text.find(kMarker);
  const std::string sim_text(text.substr(0, at));
  const std::string real_text(at == std::string_view::npos ? std::string_view(sim_text)
                                                           : text.substr(at + kMarker.size()));
  try {
    const nlohmann::json sim = hpz::parse_json_input(sim_text, "sim.json", "not valid JSON");
    const nlohmann::json real = hpz::parse_json_input(real_text, "real.json", "not valid JSON");
    hpz::time::CompareOptions options;
    options.top = 5;
    const hpz::time::Comparison c = hpz::time::compare(sim, "sim.json", real, "real.json", options);
    (void)hpz::time::render_text(c);
    (void)hpz::time::comparison_json(c).dump();
  } catch (const hpz::InputError& e) {
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) __builtin_trap();
  }
  return 0;
}
