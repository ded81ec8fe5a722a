// Where the tests find the source tree's files. HPZLAB_SOURCE_DIR in the environment overrides
// the path compiled in, so that a test binary built on one machine runs on another with the tree
// elsewhere (tools/gpu-selftest runs prebuilt tests on the GPU machine).
#pragma once

#include <cstdlib>
#include <string>

namespace hpz::test {

/** The repository root. */
inline std::string source_dir() {
  const char* env = std::getenv("HPZLAB_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(HPZLAB_SOURCE_DIR);
}

/** A shipped scenario: "tiny" or "tiny.toml" -> ROOT/scenarios/tiny.toml. */
inline std::string scenario_path(const std::string& name) {
  const bool has_ext = name.size() > 5 && name.compare(name.size() - 5, 5, ".toml") == 0;
  return source_dir() + "/scenarios/" + name + (has_ext ? "" : ".toml");
}

}  // namespace hpz::test
