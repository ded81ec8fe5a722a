// The platform the engines model, below the scenario layer: the cluster's hardware ([cluster]),
// the timing model's parameters ([sim]), TimingInputs, everything the timing engine (sim/time/)
// reads besides the schedule, and ReplayInputs, everything the data replay (sim/replay/) reads.
// Plain data with no dependency: scenario.hpp includes it (so `scenario.cluster.nodes` reads as
// before) and hpz::timing_inputs_of(scenario) and replay_inputs_of(scenario) there make the
// engines' inputs from a scenario, while the engines themselves never see a Scenario.
#pragma once

#include <cstdint>
#include <string>

namespace hpz {

/** Peak numbers of one GPU model; chosen by the `cluster.gpu` preset. */
struct GpuSpec {
  std::string name;            ///< preset name, e.g. "a100-80g"
  double peak_flops = 0;       ///< dense bf16 FLOP/s
  double hbm_bytes_per_s = 0;  ///< HBM bandwidth, bytes/s
  double memory_bytes = 0;     ///< device memory, bytes
  bool operator==(const GpuSpec&) const = default;
};

/** [cluster]: nodes, GPUs and the links between them. */
struct ClusterConfig {
  int nodes = 2;                     ///< number of nodes
  int gpus_per_node = 8;             ///< GPUs (ranks) per node
  GpuSpec gpu;                       ///< resolved from the `gpu` preset
  double nvlink_gbytes_per_s = 600;  ///< NVLink bandwidth per GPU to the node switch, GB/s
  double nvlink_latency_us = 0.7;    ///< NVLink hop latency, microseconds
  double nic_gbps = 12.5;            ///< bandwidth of one NIC, Gbit/s
  int nics_per_node = 1;             ///< NICs per node
  double internode_latency_us = 10;  ///< one-way latency between nodes, microseconds

  int world_size() const { return nodes * gpus_per_node; }
  bool operator==(const ClusterConfig&) const = default;
};

/** [sim]: the timing engine's model parameters (`hpzlab sim`, docs/timing.md). */
struct SimConfig {
  double compute_efficiency = 0.6;  ///< fraction of peak FLOP/s a kernel reaches (0, 1]
  double memory_efficiency = 0.8;   ///< fraction of HBM bandwidth kernels and copies reach (0, 1]
  double launch_overhead_us = 5;    ///< host time to issue one stream op, microseconds
  double kernel_latency_us = 2;     ///< minimum duration of a kernel or copy, microseconds
  double pcie_gbytes_per_s = 25;    ///< host <-> device copy bandwidth, GB/s
  double jitter = 0.02;             ///< relative standard deviation of op durations (0 = none)
  std::string collective_model = "fine";  ///< fine (ring steps) | coarse (one transfer per edge)
  std::string network_model = "CM02";     ///< SimGrid network model: CM02 | LV08
  double bandwidth_factor = 0.97;         ///< SimGrid network/bandwidth-factor
  double latency_factor = 1.0;            ///< SimGrid network/latency-factor
  bool operator==(const SimConfig&) const = default;
};

/** What the timing engine reads besides the schedule: the hardware, the [sim] parameters and
 *  the few [run] and [training] values it reports or counts with. Each field has the meaning
 *  of the scenario key it is named after (scenarios/README.md). */
struct TimingInputs {
  ClusterConfig cluster;   ///< [cluster]
  SimConfig sim;           ///< [sim]
  int steps = 2;           ///< run.steps: the schedule's optimizer steps (the last one is measured)
  std::uint64_t seed = 1;  ///< run.seed: the first run's jitter seed (run i uses seed + i)
  double spin_before_copy_us = 0;  ///< run.spin_before_copy_us: reported, the schedule has it
  int seq_len = 2048;              ///< training.seq_len: tokens per sequence
  int micro_batch = 1;             ///< training.micro_batch: sequences per rank per micro-step
  int grad_accum = 1;              ///< training.grad_accum: micro-steps per optimizer step
  bool operator==(const TimingInputs&) const = default;
};

/** What the data replay reads besides the schedule: the model's shape as the numeric replay's
 *  Llama needs it, the batch, the world, the steps and the seed. Each field has the meaning of
 *  the scenario key it is named after (scenarios/README.md). */
struct ReplayInputs {
  std::string path;           ///< the scenario's file, named in messages
  std::string family;         ///< model.family
  bool llama_shaped = false;  ///< no biases, untied embeddings, a gated MLP, heads x head_dim =
                              ///< hidden (sim/model_shape.hpp llama_shaped)
  int layers = 0;             ///< model.layers
  int hidden = 0;             ///< model.hidden
  int ffn = 0;                ///< model.ffn
  int heads = 0;              ///< model.heads
  int kv_heads = 0;           ///< model.kv_heads
  int vocab = 0;              ///< model.vocab
  int world_size = 0;         ///< cluster.nodes x cluster.gpus_per_node
  int seq_len = 2048;         ///< training.seq_len
  int micro_batch = 1;        ///< training.micro_batch
  int grad_accum = 1;         ///< training.grad_accum
  int steps = 2;              ///< run.steps
  std::uint64_t seed = 1;     ///< run.seed: the synthetic tokens' and the initial weights' seed
  bool operator==(const ReplayInputs&) const = default;
};

}  // namespace hpz
