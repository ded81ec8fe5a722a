#include "sim/replay/replay.hpp"

#include "sim/replay/data_engine.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/replay/taint_domain.hpp"

namespace hpz::replay {

bool numeric_fits(const Scenario& sc) {
  const auto& m = sc.model;
  const double params =
      2.0 * m.vocab * m.hidden + m.layers * (4.0 * m.hidden * m.hidden + 3.0 * m.hidden * m.ffn);
  // The numeric model needs full attention heads and a gated MLP (tiny_model.hpp), and every
  // rank's buffers (a few copies of the model each) in memory.
  return m.kv_heads == m.heads && m.gated_mlp && params * sc.cluster.world_size() < 4e7 &&
         sc.training.seq_len * sc.training.micro_batch <= 4096;
}

ReplayResult replay(const Scenario& scenario, const Schedule& schedule, const Timeline& timeline,
                    Mode mode) {
  ReplayResult out;
  out.mode = mode;
  if (mode == Mode::kNumeric) {
    NumericDomain d(scenario, schedule);
    out.mixed_reads = DataEngine<NumericDomain>(schedule, timeline, d).run();
    out.steps = d.steps();
  } else {
    TaintDomain d(scenario, schedule);
    out.mixed_reads = DataEngine<TaintDomain>(schedule, timeline, d).run();
    out.steps = d.steps();
  }
  return out;
}

}  // namespace hpz::replay
