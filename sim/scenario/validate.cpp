// Validation: every cross-key and range check of a scenario, in one place; the size guards that
// keep the builder's counts in range.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/model_shape.hpp"
#include "sim/scenario.hpp"
#include "sim/scenario/detail.hpp"

namespace hpz {
namespace scenario_detail {
namespace {

void require(bool ok, const WhereOf& where_of, const std::string& key, const std::string& what) {
  if (!ok) throw InputError(where_of(key), key, what);
}

void at_least(std::int64_t value, std::int64_t minimum, const WhereOf& where_of,
              const std::string& key) {
  require(value >= minimum, where_of, key,
          fmt::format("must be at least {}, got {}", minimum, value));
}

void positive(double value, const WhereOf& where_of, const std::string& key, const char* unit) {
  require(std::isfinite(value) && value > 0, where_of, key,
          fmt::format("must be a positive number of {}, got {}", unit, value));
}

void non_negative(double value, const WhereOf& where_of, const std::string& key, const char* unit) {
  require(std::isfinite(value) && value >= 0, where_of, key,
          fmt::format("must be a non-negative number of {}, got {}", unit, value));
}

/** A physical value within what hpzlab's engines handle (0 allowed when `zero_ok`): values the
 *  type allows but no machine has crashed SimGrid (1e308 GB/s, latencies of 1e-300 us) or gave
 *  nonsense (a 200-digit step time). */
void plausible(double value, double lo, double hi, bool zero_ok, const WhereOf& where_of,
               const std::string& key, const char* unit) {
  require((zero_ok && value == 0) || (value >= lo && value <= hi), where_of, key,
          fmt::format("{} is out of range (allowed: {}{:g} to {:g} {})", value,
                      zero_ok ? "0, or " : "", lo, hi, unit));
}

void check_cluster(const ClusterConfig& c, const WhereOf& where_of) {
  at_least(c.nodes, 1, where_of, "cluster.nodes");
  at_least(c.gpus_per_node, 1, where_of, "cluster.gpus_per_node");
  constexpr std::int64_t kMaxWorld = 1 << 20;
  require(std::int64_t{c.nodes} * c.gpus_per_node <= kMaxWorld, where_of, "cluster.nodes",
          fmt::format("world size {} x {} is larger than {} ranks", c.nodes, c.gpus_per_node,
                      kMaxWorld));
  positive(c.nvlink_gbytes_per_s, where_of, "cluster.nvlink_gbytes_per_s", "GB/s");
  plausible(c.nvlink_gbytes_per_s, 1e-3, 1e5, false, where_of, "cluster.nvlink_gbytes_per_s",
            "GB/s");
  non_negative(c.nvlink_latency_us, where_of, "cluster.nvlink_latency_us", "microseconds");
  plausible(c.nvlink_latency_us, 1e-6, 1e6, true, where_of, "cluster.nvlink_latency_us",
            "microseconds");
  positive(c.nic_gbps, where_of, "cluster.nic_gbps", "Gbit/s");
  plausible(c.nic_gbps, 1e-3, 1e5, false, where_of, "cluster.nic_gbps", "Gbit/s");
  at_least(c.nics_per_node, 1, where_of, "cluster.nics_per_node");
  require(c.nics_per_node <= 1024, where_of, "cluster.nics_per_node",
          fmt::format("{} is out of range (allowed: 1 to 1024 NICs per node)", c.nics_per_node));
  non_negative(c.internode_latency_us, where_of, "cluster.internode_latency_us", "microseconds");
  plausible(c.internode_latency_us, 1e-6, 1e6, true, where_of, "cluster.internode_latency_us",
            "microseconds");
  require(
      c.gpu.peak_flops > 0 && c.gpu.hbm_bytes_per_s > 0 && c.gpu.memory_bytes > 0, where_of,
      "cluster.gpu",
      "the GPU spec must have positive FLOP/s, bandwidth and memory" + allowed(gpu_preset_names()));
}

void check_model(const ModelConfig& m, const WhereOf& where_of) {
  at_least(m.layers, 1, where_of, "model.layers");
  at_least(m.hidden, 1, where_of, "model.hidden");
  at_least(m.ffn, 1, where_of, "model.ffn");
  at_least(m.heads, 1, where_of, "model.heads");
  at_least(m.kv_heads, 1, where_of, "model.kv_heads");
  at_least(m.vocab, 1, where_of, "model.vocab");
  // A head dimension of its own (head_dim, MLA's) need not divide the hidden size.
  require(m.head_dim > 0 || m.kv_lora_rank > 0 || m.hidden % m.heads == 0, where_of, "model.heads",
          fmt::format("{} heads do not divide hidden = {} (allowed: a divisor of the hidden size)",
                      m.heads, m.hidden));
  require(m.heads % m.kv_heads == 0, where_of, "model.kv_heads",
          fmt::format("{} key/value heads do not divide heads = {} (allowed: a divisor of the "
                      "number of heads)",
                      m.kv_heads, m.heads));
}

void check_training(const TrainingConfig& t, const WhereOf& where_of) {
  at_least(t.seq_len, 1, where_of, "training.seq_len");
  at_least(t.micro_batch, 1, where_of, "training.micro_batch");
  at_least(t.grad_accum, 1, where_of, "training.grad_accum");
  require(std::isfinite(t.gradient_clipping) && t.gradient_clipping >= 0, where_of,
          "training.gradient_clipping",
          fmt::format("{} is not a clipping norm (allowed: a number >= 0; 0 for none)",
                      t.gradient_clipping));
  require(std::find(kDtypeNames.begin(), kDtypeNames.end(), t.dtype) != kDtypeNames.end(), where_of,
          "training.dtype", "unknown value '" + t.dtype + "'" + allowed(kDtypeNames));
}

std::vector<std::string> divisors(int n) {
  std::vector<std::string> found;
  for (int d = 1; d <= n && found.size() < 16; ++d) {
    if (n % d == 0) found.push_back(std::to_string(d));
  }
  return found;
}

void check_zero(const ZeroConfig& z, int world, const WhereOf& where_of) {
  require(z.stage >= 0 && z.stage <= 3, where_of, "zero.stage",
          fmt::format("{} is out of range (allowed: 0, 1, 2 or 3)", z.stage));
  const std::string hpz_key = "zero.zero_hpz_partition_size";
  const std::string allowed_hpz = allowed(divisors(world));
  at_least(z.zero_hpz_partition_size, 1, where_of, hpz_key);
  require(z.zero_hpz_partition_size <= world, where_of, hpz_key,
          fmt::format("{} is larger than the world size {} (nodes x gpus_per_node){}",
                      z.zero_hpz_partition_size, world, allowed_hpz));
  require(world % z.zero_hpz_partition_size == 0, where_of, hpz_key,
          fmt::format("{} does not divide the world size {} (nodes x gpus_per_node){}",
                      z.zero_hpz_partition_size, world, allowed_hpz));
  at_least(z.stage3_prefetch_bucket_size, 0, where_of, "zero.stage3_prefetch_bucket_size");
  at_least(z.stage3_max_live_parameters, 0, where_of, "zero.stage3_max_live_parameters");
  at_least(z.stage3_max_reuse_distance, 0, where_of, "zero.stage3_max_reuse_distance");
  at_least(z.reduce_bucket_size, 0, where_of, "zero.reduce_bucket_size");
  at_least(z.sub_group_size, 0, where_of, "zero.sub_group_size");  // 0: a sub-group a parameter
  at_least(z.stage3_param_persistence_threshold, 0, where_of,
           "zero.stage3_param_persistence_threshold");
}

void check_bugs(const BugConfig& b, int world, const WhereOf& where_of) {
  require(b.secondary_mismatch_rank == -1 ||
              (b.secondary_mismatch_rank >= 0 && b.secondary_mismatch_rank < world),
          where_of, "bugs.secondary_mismatch_rank",
          fmt::format("{} is out of range (allowed: -1 for none, or a rank 0 to {} of the world "
                      "size {})",
                      b.secondary_mismatch_rank, world - 1, world));
}

void check_sim(const SimConfig& m, const WhereOf& where_of) {
  require(m.compute_efficiency > 0 && m.compute_efficiency <= 1, where_of, "sim.compute_efficiency",
          fmt::format("{} is out of range (allowed: a fraction in (0, 1])", m.compute_efficiency));
  require(m.memory_efficiency > 0 && m.memory_efficiency <= 1, where_of, "sim.memory_efficiency",
          fmt::format("{} is out of range (allowed: a fraction in (0, 1])", m.memory_efficiency));
  plausible(m.compute_efficiency, 1e-3, 1, false, where_of, "sim.compute_efficiency",
            "(a fraction)");
  plausible(m.memory_efficiency, 1e-3, 1, false, where_of, "sim.memory_efficiency", "(a fraction)");
  non_negative(m.launch_overhead_us, where_of, "sim.launch_overhead_us", "microseconds");
  plausible(m.launch_overhead_us, 1e-6, 1e6, true, where_of, "sim.launch_overhead_us",
            "microseconds");
  non_negative(m.kernel_latency_us, where_of, "sim.kernel_latency_us", "microseconds");
  plausible(m.kernel_latency_us, 1e-6, 1e6, true, where_of, "sim.kernel_latency_us",
            "microseconds");
  positive(m.pcie_gbytes_per_s, where_of, "sim.pcie_gbytes_per_s", "GB/s");
  plausible(m.pcie_gbytes_per_s, 1e-3, 1e5, false, where_of, "sim.pcie_gbytes_per_s", "GB/s");
  require(m.jitter >= 0 && m.jitter <= 1, where_of, "sim.jitter",
          fmt::format("{} is out of range (allowed: a relative standard deviation in [0, 1])",
                      m.jitter));
  positive(m.bandwidth_factor, where_of, "sim.bandwidth_factor", "a factor");
  plausible(m.bandwidth_factor, 1e-3, 1e3, false, where_of, "sim.bandwidth_factor", "(a factor)");
  positive(m.latency_factor, where_of, "sim.latency_factor", "a factor");
  plausible(m.latency_factor, 1e-3, 1e3, false, where_of, "sim.latency_factor", "(a factor)");
}

// The builder counts elements and bytes in 64 bits (and activation bytes through a double):
// beyond these sizes its sums wrapped (hidden = 2e9 gave a negative attention unit, counted as
// persistent, and "params 9223373688269700349"). Far above any model trained today.
constexpr double kMaxParams = 1e13;             ///< parameters of the whole model
constexpr double kMaxActivationBytes = 0x1p50;  ///< one activation checkpoint (a PiB)

/** The model's size as the builder will count it, before anything is built. */
void check_sizes(const Scenario& s, const WhereOf& where_of) {
  const auto& m = s.model;
  const double h = m.hidden;
  const double params = parameter_count(m);
  require(params <= kMaxParams, where_of, "model",
          fmt::format("the model would have {:.3g} parameters ({} layers, hidden {}, ffn {}, "
                      "vocab {}), more than hpzlab counts (allowed: at most {:.0e})",
                      params, m.layers, m.hidden, m.ffn, m.vocab, kMaxParams));
  const double act = static_cast<double>(s.training.seq_len) * s.training.micro_batch * h *
                     s.training.dtype_bytes();
  require(act <= kMaxActivationBytes, where_of, "training.seq_len",
          fmt::format("one activation checkpoint (seq_len x micro_batch x hidden x dtype bytes) "
                      "would be {:.3g} bytes (allowed: at most 2^50, a PiB)",
                      act));
}

}  // namespace

void check_scenario(const Scenario& s, const WhereOf& where_of) {
  check_cluster(s.cluster, where_of);
  check_model(s.model, where_of);
  check_training(s.training, where_of);
  check_zero(s.zero, s.cluster.world_size(), where_of);
  at_least(s.run.steps, 1, where_of, "run.steps");
  require(
      s.run.skipped_steps.empty() || s.run.skipped_steps.back() < s.run.steps, where_of,
      "run.skipped_steps",
      fmt::format("step {} is not built (allowed: steps from 0 to {}, run.steps - 1)",
                  s.run.skipped_steps.empty() ? 0 : s.run.skipped_steps.back(), s.run.steps - 1));
  require(s.run.spin_before_copy_us >= 0 && s.run.spin_before_copy_us <= 1e6, where_of,
          "run.spin_before_copy_us",
          fmt::format("{} is out of range (allowed: 0 to 1000000 microseconds)",
                      s.run.spin_before_copy_us));
  check_bugs(s.bugs, s.cluster.world_size(), where_of);
  check_sim(s.sim, where_of);
  check_sizes(s, where_of);
}

}  // namespace scenario_detail

void validate(const Scenario& scenario) {
  scenario_detail::check_scenario(scenario, [&](const std::string&) { return scenario.path; });
}

}  // namespace hpz
