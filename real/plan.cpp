#include "real/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "real/pattern.hpp"
#include "real/plan_builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/shard.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/replay/replay.hpp"
#include "sim/time/cost_model.hpp"

namespace hpz::real {

using detail::PlanBuilder;

Plan make_plan(const Scenario& scenario, const Schedule& schedule, bool model) {
  if (model) {
    const std::string why = model_math_unfit(scenario, schedule);
    if (!why.empty()) throw InputError(scenario.path, "--compute", why);
  }
  // Accesses are indexed one range each here (run_real writes strided ones out first).
  if (has_strided_accesses(schedule)) {
    throw std::invalid_argument("make_plan: a strided access; pass unfold_strided(schedule)");
  }
  return PlanBuilder(scenario, schedule, model).build();
}

std::string model_math_unfit(const Scenario& scenario, const Schedule& schedule) {
  if (!replay::numeric_fits(replay_inputs_of(scenario))) {
    return "the model's real math needs a Llama the numeric replay holds (hpzlab repro --mode "
           "numeric: model.family llama, params x ranks < 4e7, seq_len x micro_batch <= 4096)";
  }
  // A recording of one rank (its other ranks copies at its byte offsets): the numeric replay
  // refuses it too.
  if (const std::string why = replay::replay_unsupported(schedule); !why.empty()) {
    return "the schedule " + why;
  }
  // A bf16 or fp16 schedule runs in fp32, as the numeric replay computes it (the plan stores
  // fp32 under the model math: PlanBuilder).
  // qwZ: the plan moves the quantized shard's int8 elements one for one, where the numeric
  // replay rounds them as DeepSpeed's quantizer kernel does (fp32::int8_symmetric_round_trip).
  for (const RankSchedule& rs : schedule.ranks) {
    for (const Op& o : rs.ops) {
      if (o.kind == OpKind::kQuantize && o.phase != Phase::kGradReduce) {
        return "the model's real math does not round qwZ's quantized weights yet (the numeric "
               "replay does: hpzlab repro)";
      }
    }
  }
  return replay::llama_unsupported(replay_inputs_of(scenario), schedule);
}

float pattern_value(std::uint32_t salt, UnitId unit, std::uint64_t i) {
  return pattern_bits(salt, unit, i);
}

std::vector<GemmShape> gemm_shapes(const Plan& plan, int rank) {
  std::vector<GemmShape> shapes;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    if (rank >= 0 && static_cast<std::size_t>(rank) != r) continue;
    for (const PlanOp& po : plan.ranks[r].ops) {
      if (po.gemm) shapes.push_back(*po.gemm);
    }
  }
  const auto key = [](const GemmShape& g) { return std::tie(g.m, g.n, g.k); };
  std::sort(shapes.begin(), shapes.end(),
            [&](const GemmShape& a, const GemmShape& b) { return key(a) < key(b); });
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  return shapes;
}

std::string missing_ranks(const Instance& inst) {
  std::string out;
  for (Rank g : inst.group_ranks) {
    const bool here = std::any_of(inst.members.begin(), inst.members.end(),
                                  [&](const auto& m) { return m.first == g; });
    if (!here) out += (out.empty() ? "" : ",") + std::to_string(g);
  }
  return out;
}

std::uint64_t peak_bytes_estimate(const Plan& plan, const Schedule& schedule, int rank) {
  std::uint64_t total = 0;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    if (rank >= 0 && static_cast<std::size_t>(rank) != r) continue;
    if (rank >= 0) {
      const RankPlan& rp = plan.ranks[r];
      total +=
          rp.slots[rp.native_staging].elements * static_cast<std::uint64_t>(plan.element_bytes);
    }
    // One entry per buffer id (its largest lifetime), plus every slot of the plan's own
    // (staging, gradient and scratch slots: buffer kNoBuffer), summed.
    const std::size_t buffers = schedule.ranks[r].buffers.size();
    std::vector<std::uint64_t> per_buffer(buffers + 1, 0);
    for (const SlotInfo& s : plan.ranks[r].slots) {
      if (!s.touched) continue;
      if (s.buffer == kNoBuffer) {
        per_buffer[buffers] += s.elements;
      } else {
        const auto k = static_cast<std::size_t>(s.buffer);
        per_buffer[k] = std::max(per_buffer[k], s.elements);
      }
    }
    for (std::uint64_t e : per_buffer) total += e * static_cast<std::uint64_t>(plan.element_bytes);
  }
  return total;
}

}  // namespace hpz::real
