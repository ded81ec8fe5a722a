// libFuzzer target: the scenario loader (issue 20). The input is a scenario TOML file, or, after
// a line "--set", one override per line; a ds_config and an HF config JSON named by the file are
// read too when they are the fuzzer's own ("ds.json", "hf.json": the rest of the input after a
// line "--ds" or "--hf"). Anything but InputError escaping, a crash or a sanitizer report is a
// finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "sim/error.hpp"
#include "sim/scenario.hpp"

namespace {

/** A directory of this process's own for the files the loader reads. */
const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("hpzlab-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

/** Splits `text` at the first line equal to `marker`: what comes before, and after. */
std::string_view cut(std::string_view& text, std::string_view marker) {
  const std::string line = "\n" + std::string(marker) + "\n";
  const std::size_t at = text.find(line);
  if (at == std::string_view::npos) return {};
  const std::string_view after = text.substr(at + line.size());
  text = text.substr(0, at);
  return after;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string_view hf = cut(text, "--hf");
  const std::string_view ds = cut(text, "--ds");
  const std::string_view sets = cut(text, "--set");
  const auto write = [](const std::string& name, std::string_view body) {
    std::ofstream(work_dir() / name, std::ios::binary) << body;
  };
  write("s.toml", text);
  write("ds.json", ds);
  write("hf.json", hf);
  std::vector<hpz::Override> overrides;
  try {
    std::size_t begin = 0;
    while (begin < sets.size()) {
      const std::size_t end = std::min(sets.find('\n', begin), sets.size());
      overrides.push_back(hpz::parse_override(std::string(sets.substr(begin, end - begin))));
      begin = end + 1;
    }
    hpz::load_scenario((work_dir() / "s.toml").string(), overrides);
  } catch (const hpz::InputError& e) {
    // The promise: one line.
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) __builtin_trap();
  }
  return 0;
}
