// Where this process stands in a run with one process per rank, as its launcher says: mpirun
// (Open MPI or MPICH), srun, torchrun, or tools/launch-local, which all put the rank, the world
// size and the rank on this node in the environment. hpzlab does not link MPI: ranks meet at
// rank 0's store (store.hpp), whose address comes from the environment too.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace hpz::real {

/** This process's place in the run. */
struct Launch {
  int rank = 0;
  int world = 1;
  int local_rank = 0;      ///< the rank on this node: which GPU it drives
  std::string via;         ///< which launcher's variables were read, e.g. "OMPI_COMM_WORLD_*"
  std::string store_addr;  ///< rank 0's host (HPZLAB_MASTER_ADDR, else MASTER_ADDR)
  int store_port = 0;      ///< rank 0's store port (HPZLAB_MASTER_PORT, else MASTER_PORT)
};

/** Reads the environment through `env` (std::getenv's shape: nullptr when unset). nullopt
 *  when no launcher's variables are set; throws InputError naming the variable when one is
 *  set but not a valid number, or the rank is out of range. */
std::optional<Launch> detect_launch(const std::function<const char*(const char*)>& env);

/** detect_launch on this process's environment. */
std::optional<Launch> detect_launch();

}  // namespace hpz::real
