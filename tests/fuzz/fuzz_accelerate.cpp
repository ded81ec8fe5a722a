// libFuzzer target: accelerate's config YAML (sim/accelerate_config.hpp, issue 35). The input is
// an accelerate config ("acc.yaml"); after a line "--ds", the rest is "ds.json", which the YAML
// may name as deepspeed_config_file (opened from the current directory, as accelerate opens it:
// each input runs in a directory of the target's own). A config that reads is then loaded as
// `--ds-config acc.yaml --hf-config hf.json` with a tiny Llama, which applies it to a scenario.
// Anything but InputError escaping, a crash or a sanitizer report is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "sim/accelerate_config.hpp"
#include "sim/error.hpp"
#include "sim/scenario.hpp"

namespace {

/** A directory of this process's own, with the tiny model's config. */
const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    auto d =
        std::filesystem::temp_directory_path() / ("hpzlab-fuzz-acc-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::ofstream(d / "hf.json") << R"({"model_type": "llama", "num_hidden_layers": 2,
      "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 4, "vocab_size": 128})";
    return d;
  }();
  return dir;
}

/** The work directory as the current one while it lives (libFuzzer reads its corpus by paths
 *  relative to the directory it started in, between inputs). */
class InWorkDir {
 public:
  InWorkDir() : before_(std::filesystem::current_path()) {
    std::filesystem::current_path(work_dir());
  }
  ~InWorkDir() { std::filesystem::current_path(before_); }
  InWorkDir(const InWorkDir&) = delete;
  InWorkDir& operator=(const InWorkDir&) = delete;

 private:
  std::filesystem::path before_;
};

/** Splits `text` at the first line equal to `marker`: what comes before, and after. */
std::string_view cut(std::string_view& text, std::string_view marker) {
  const std::string line = "\n" + std::string(marker) + "\n";
  const std::size_t at = text.find(line);
  if (at == std::string_view::npos) return {};
  const std::string_view after = text.substr(at + line.size());
  text = text.substr(0, at);
  return after;
}

/** The promise: one line. */
void check_one_line(const hpz::InputError& e) {
  if (std::string_view(e.what()).find('\n') != std::string_view::npos) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const InWorkDir here;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string_view ds = cut(text, "--ds");
  std::ofstream("acc.yaml", std::ios::binary) << text;
  std::ofstream("ds.json", std::ios::binary) << ds;
  try {
    const hpz::AccelerateConfig config = hpz::read_accelerate_config("acc.yaml");
    for (const std::string& note : config.notes) {
      if (note.find('\n') != std::string::npos) __builtin_trap();
    }
  } catch (const hpz::InputError& e) {
    check_one_line(e);
    return 0;
  }
  try {
    hpz::load_scenario("", {},
                       {{"--ds-config", "zero.ds_config", "acc.yaml"},
                        {"--hf-config", "model.hf_config", "hf.json"}});
  } catch (const hpz::InputError& e) {
    check_one_line(e);
  }
  return 0;
}
