// libFuzzer target: the JSON readers (issue 20): gunzipped_input (gzip'd recordings),
// parse_json_input (nesting, duplicate keys, NUL bytes, numbers beyond a double), the schedule
// reader on what parses, and shown_json on every value a message may quote. Anything but InputError
// escaping, a crash or a sanitizer report is a finding.
#include <cstdint>
#include <string>
#include <string_view>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/ir/schedule_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json j = hpz::parse_json_input(
        hpz::gunzipped_input(text, "fuzz.json", "schedule file"), "fuzz.json", "not valid JSON");
    if (hpz::shown_json(j).size() > 200) __builtin_trap();  // cut short, always
    hpz::schedule_from_json(j, "fuzz.json");
  } catch (const hpz::InputError& e) {
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) __builtin_trap();
  }
  return 0;
}
