#include "real/launch.hpp"

#include <fmt/format.h>

#include <array>
#include <cstdlib>

#include "sim/error.hpp"

namespace hpz::real {
namespace {

/** One launcher's variable names, in the order they are tried. */
struct Convention {
  const char* rank;
  const char* world;
  const char* local_rank;  ///< may be unset: then the rank is used (one node)
  const char* via;
};

constexpr std::array<Convention, 5> kConventions{{
    {"HPZLAB_RANK", "HPZLAB_WORLD_SIZE", "HPZLAB_LOCAL_RANK", "HPZLAB_*"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_* (Open MPI)"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_* (MPICH)"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_* (srun)"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE (torchrun)"},
}};

constexpr int kDefaultPort = 29517;

int number(const std::function<const char*(const char*)>& env, const char* name, int lo, int hi) {
  const char* v = env(name);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    throw InputError("environment", name,
                     fmt::format("'{}' is not a whole number from {} to {}", v, lo, hi));
  }
  return static_cast<int>(x);
}

}  // namespace

std::optional<Launch> detect_launch(const std::function<const char*(const char*)>& env) {
  for (const Convention& c : kConventions) {
    if (env(c.rank) == nullptr || env(c.world) == nullptr) continue;
    Launch l;
    l.via = c.via;
    l.world = number(env, c.world, 1, 1 << 20);
    l.rank = number(env, c.rank, 0, l.world - 1);
    l.local_rank =
        env(c.local_rank) != nullptr ? number(env, c.local_rank, 0, l.world - 1) : l.rank;
    const char* addr =
        env("HPZLAB_MASTER_ADDR") != nullptr ? env("HPZLAB_MASTER_ADDR") : env("MASTER_ADDR");
    l.store_addr = addr != nullptr && *addr != '\0' ? addr : "127.0.0.1";
    const char* port_var =
        env("HPZLAB_MASTER_PORT") != nullptr ? "HPZLAB_MASTER_PORT" : "MASTER_PORT";
    l.store_port = env(port_var) != nullptr ? number(env, port_var, 1, 65535) : kDefaultPort;
    return l;
  }
  return std::nullopt;
}

std::optional<Launch> detect_launch() {
  return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace hpz::real
