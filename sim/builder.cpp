// build_schedule: the one entry from a scenario to its schedule, DeepSpeed's (sim/deepspeed/),
// after a check that this machine can hold it. (The coarse builder that stood here, one fetch
// unit per attn/mlp, was retired: issue 31.)
#include "sim/builder.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "sim/deepspeed_builder.hpp"
#include "sim/error.hpp"

namespace hpz {
namespace {

/** Refuses, in milliseconds, a schedule this machine cannot hold (cluster.nodes = 100000 or
 *  run.steps = 1000000 ran until memory was gone): an estimate of its bytes from the scenario's
 *  sizes against half the machine's physical memory (the engines that read a schedule take more
 *  than the schedule itself, and the sanitizer build about 1.5 times a release build's).
 *  The builder keeps one copy of the ops ranks issue alike (share_alike: ~150 ops per rank, unit
 *  and step, init counted as a step, measured on llama2-7b.toml at 16 x 8 GPUs, ~100 B each)
 *  and, per rank, the accesses of its ops that differ from rank 0's (AccessList: a rank's own
 *  slice offsets): measured about 3.9 B per rank and estimated op since 2026-12-02 (llama2-70b.toml
 *  at 1,024 GPUs: 583 MiB for the whole `hpzlab check`, 145 K estimated ops a rank; before the
 *  accesses were shared, 18 B). 8 B keeps a margin; tiny.toml at 100,000 nodes, whose build the
 *  kernel killed (issue 34 item 6), stays refused. */
void check_schedule_size(const Scenario& sc) {
  const double units = (4.0 + std::max(sc.model.experts, 0)) * sc.model.layers + 3;
  constexpr double ops_per = 150;
  const double rank_ops = units * (sc.run.steps + 1.0) * sc.training.grad_accum * ops_per;
  const double world = static_cast<double>(sc.cluster.world_size());
  const double ops = world * rank_ops;
  const double bytes = rank_ops * 128 + ops * 8;
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGE_SIZE)) / 2;
  if (memory <= 0 || bytes <= memory) return;
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  throw InputError(
      sc.path, "",
      fmt::format("the schedule would need about {:.3g} GiB ({:.3g} ops: {} ranks x {} units x {} "
                  "steps (and init) x {} micro-steps x ~{} ops), more than half of this machine's "
                  "{:.3g} GiB of memory (allowed: fewer ranks, layers, steps or micro-steps)",
                  bytes / kGiB, ops, sc.cluster.world_size(), units, sc.run.steps,
                  sc.training.grad_accum, ops_per, 2 * memory / kGiB));
}

}  // namespace

Schedule build_schedule(const Scenario& sc) {
  check_schedule_size(sc);
  return build_deepspeed_schedule(sc, sc.zero.deepspeed_version);
}

}  // namespace hpz
