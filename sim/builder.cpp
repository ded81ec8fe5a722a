// build_schedule: the one entry from a scenario to its schedule, DeepSpeed's (sim/deepspeed/),
// after a check that this machine can hold it. (The coarse builder that stood here, one fetch
// unit per attn/mlp, was retired: issue 31.)
#include "sim/builder.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "sim/deepspeed_builder.hpp"
#include "sim/error.hpp"

namespace hpz {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

/** The ranks built past the first hpZ group before the build projects the whole schedule's
 *  bytes from them (guard_build). */
constexpr int kProbeRanks = 16;
/** The process's resident bytes per byte schedule_bytes counts (the allocator's overhead, the
 *  buffers' names' capacity): 1.16 measured on llama2-70b.toml at 1,024 GPUs (544 MiB resident,
 *  467 MiB counted, `hpzlab check`), 1.47 on tiny.toml at 20,000 ranks (`hpzlab schedule`,
 *  before each rank's group table was a short list: 5.8 GB, 3.9 GiB). */
constexpr double kResidentPerByte = 1.5;
/** Resident bytes of each rank beside what schedule_bytes counts: its RankSchedule, streams and
 *  group list, its share of the groups (one hpZ group a node) and the world index: 190 MB
 *  resident for 200,000 ranks of tiny.toml (`hpzlab schedule --set cluster.nodes=100000`),
 *  28 MB of it counted. */
constexpr double kPerRank = 1024;

/** Bytes an estimated op may take: 8 for engines that keep state per rank and op, 3 for those
 *  that work one rank per class and guard their own walks of every rank (guard_engine_memory).
 *  3 B: llama2-70b.toml at 16,384 GPUs, 2.38 G estimated ops, built in 3.85 GB resident (1.6
 *  B an op, `hpzlab schedule --set cluster.nodes=2048`, 2026-12-02). */
double bytes_per_op(Engines engines) {
  return engines == Engines::kByClass ? 3 : 8;
}

/** Refuses, in milliseconds, a schedule this machine certainly cannot hold (cluster.nodes =
 *  100000 or run.steps = 1000000 ran until memory was gone): an estimate of its bytes from the
 *  scenario's sizes. Rank 0's op list is counted in full (~150 ops per rank, unit and step, init
 *  counted as a step, measured on llama2-7b.toml at 16 x 8 GPUs, ~100 B each, 128 B counted),
 *  each further rank at kPerRank and bytes_per_op(engines) per estimated op. What a rank keeps of
 * its own when it shares what it issues alike (share_alike) measured 3.2 B on llama2-70b.toml at
 * 1,024 GPUs (467 MiB schedule_bytes for 145 K estimated ops a rank), so 8 B is a margin for the
 * engines, not for the schedule: 1 B let llama2-70b.toml at 16,384 GPUs through (a schedule of a
 * few GiB), whose hpZ positions issue different ops, so the checker walked every rank and ran out
 *  of an 18 GB limit after 19 minutes (2026-12-02). The checker now walks such a world by class
 *  (ranks that differ only in copies of the padding: symmetric_world.hpp), and `check` and
 *  `sim` guard their walks of every rank themselves, so they build with 3 B. What the estimate
 *  lets through, the build measures (guard_build). */
void check_schedule_size(const Scenario& sc, double memory, Engines engines) {
  const double units = (4.0 + std::max(sc.model.experts, 0)) * sc.model.layers + 3;
  constexpr double ops_per = 150;
  const double rank_ops = units * (sc.run.steps + 1.0) * sc.training.grad_accum * ops_per;
  const double world = static_cast<double>(sc.cluster.world_size());
  const double ops = world * rank_ops;
  const double bytes = rank_ops * 128 + world * kPerRank + ops * bytes_per_op(engines);
  if (memory <= 0 || bytes <= memory) return;
  throw InputError(
      sc.path, "",
      fmt::format("the schedule would need about {:.3g} GiB ({:.3g} ops: {} ranks x {} units x {} "
                  "steps (and init) x {} micro-steps x ~{} ops), more than half of this machine's "
                  "{:.3g} GiB of memory (allowed: fewer ranks, layers, steps or micro-steps)",
                  bytes / kGiB, ops, sc.cluster.world_size(), units, sc.run.steps,
                  sc.training.grad_accum, ops_per, 2 * memory / kGiB));
}

}  // namespace

// Stops a build whose schedule outgrows `memory`, measured as it is built (schedule_bytes,
// taken to resident bytes by kResidentPerByte and kPerRank):
// - early, where the bytes projected from the ranks built so far exceed twice `memory` (the
//   whole machine): once kProbeRanks ranks past the first hpZ group are built (its ranks may
//   each keep a whole copy of their own: build_deepspeed_schedule), the first group's bytes
//   and the average of the ranks after it for each rank still to come. A projection, so only
//   far past the budget: on tiny.toml at 1,000,000 ranks the first ranks' slices hold
//   elements and later ones none, and the average of the first 65 was 13.5 KiB a rank where
//   the whole build holds about 30 MB;
// - whatever the projection says, once what the built ranks hold exceeds `memory`.
// tiny.toml at 100,000 nodes, let through with a 5 B estimate, ran out of memory after 194 s
// (each rank shared nothing with rank 0 and kept a table over every group id); built with a
// 1 B estimate, it now holds 190 MB (the 8 B estimate refuses it before building).
void guard_build(const Scenario& sc, double memory, const BuildProgress& p) {
  if (memory <= 0) return;
  const int world = sc.cluster.world_size();
  const auto resident = [](std::size_t bytes, int ranks) {
    return static_cast<double>(bytes) * kResidentPerByte + ranks * kPerRank;
  };
  const double held = resident(p.held, p.ranks_built);
  const double lead = resident(p.lead_bytes, std::min(p.ranks_built, p.lead_ranks));
  const int after = p.ranks_built - p.lead_ranks;  // ranks built past the first group
  const double per_rank = after > 0 ? (held - lead) / after : 0;
  const std::string allowed = "(allowed: fewer ranks, layers, steps or micro-steps)";
  if (after > 0 && after >= std::min(kProbeRanks, world - p.lead_ranks)) {
    const double projected = lead + per_rank * (world - p.lead_ranks);
    if (projected > 2 * memory) {
      throw InputError(
          sc.path, "",
          fmt::format("the schedule would need about {:.3g} GiB (projected from the first {} of "
                      "its {} ranks: {:.3g} MiB for the first {}, {:.3g} KiB for each rank after "
                      "them), more than this machine's {:.3g} GiB of memory {}",
                      projected / kGiB, p.ranks_built, world, lead / (1024 * 1024), p.lead_ranks,
                      per_rank / 1024, 2 * memory / kGiB, allowed));
    }
  }
  if (held <= memory) return;
  throw InputError(sc.path, "",
                   fmt::format("the schedule outgrew half of this machine's {:.3g} GiB of memory: "
                               "about {:.3g} GiB after {} of its {} ranks {}",
                               2 * memory / kGiB, held / kGiB, p.ranks_built, world, allowed));
}

double schedule_budget() {
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
         static_cast<double>(::sysconf(_SC_PAGE_SIZE)) / 2;
}

void guard_engine_memory(const std::string& file, double bytes, double memory,
                         const std::string& what, const std::string& how) {
  if (memory <= 0 || bytes <= memory) return;
  throw InputError(file, "",
                   fmt::format("{} would need about {:.3g} GiB ({}), more than half of this "
                               "machine's {:.3g} GiB of memory (allowed: fewer ranks, layers, "
                               "steps or micro-steps)",
                               what, bytes / kGiB, how, 2 * memory / kGiB));
}

Schedule build_schedule(const Scenario& sc, Engines engines) {
  return build_schedule(sc, schedule_budget(), engines);
}

Schedule build_schedule(const Scenario& sc, double memory, Engines engines) {
  check_schedule_size(sc, memory, engines);
  return build_deepspeed_schedule(sc, sc.zero.deepspeed_version,
                                  [&](const BuildProgress& p) { guard_build(sc, memory, p); });
}

}  // namespace hpz
