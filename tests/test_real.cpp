// The real-GPU side: device probing works everywhere; GPU tests skip cleanly without a device
// and fail (not skip) when a device is present but broken.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "real/device.hpp"
#include "real/elements.hpp"
#include "real/executor.hpp"
#include "real/plan.hpp"
#include "real/run.hpp"
#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/shard.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz::real {
namespace {

using test::scenario_path;

TEST(RealDevice, ProbeNeverThrowsAndExplainsAnAbsence) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) {
    EXPECT_FALSE(info.problem.empty());
  } else {
    EXPECT_FALSE(info.name.empty());
  }
}

TEST(RealDevice, SpinKernelHoldsTheStreamForTheRequestedTime) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const double measured = spin_for(2000.0);
  // Clock throttling and boost both move this; a factor of 2 still catches a kernel that does
  // not spin at all or spins forever.
  EXPECT_GT(measured, 1000.0);
  EXPECT_LT(measured, 4000.0);
}

}  // namespace
}  // namespace hpz::real

// ---- The executor's plan and the host reference backend (run everywhere) ----

namespace hpz::real {
namespace {

// DeepSpeed's schedule of tiny.toml in the executor's spin mode with pattern values (its
// byte-range plan and the Llama's math: tiny_ds below).
Scenario tiny(const std::string& variant, int hpz = 2) {
  return load_scenario(scenario_path("tiny"),
                       {{"run.variant", variant},
                        {"zero.zero_hpz_partition_size", std::to_string(hpz)},
                        {"run.steps", "3"}});
}

RunOutput run_host(const Scenario& sc, bool serialize = true, double timeout_s = 30) {
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s);
  auto backend = make_host_backend();
  ExecOptions o;
  o.serialize = serialize;
  o.timeout_s = timeout_s;
  return execute(s, plan, *backend, o);
}

TEST(RealElements, HalfConversionRoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_half(1.0F), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0F), 0xc000);
  EXPECT_EQ(float_to_half(65504.0F), 0x7bff);
  EXPECT_EQ(float_to_half(1e6F), 0x7c00);                   // overflow: inf
  EXPECT_EQ(float_to_half(1.0F + 1.0F / 2048), 0x3c00);     // tie: to even
  EXPECT_EQ(float_to_half(1.0F + 3.0F / 2048), 0x3c02);     // tie: to even (up)
  EXPECT_EQ(float_to_half(std::ldexp(1.0F, -24)), 0x0001);  // smallest subnormal
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_TRUE(std::isnan(half_to_float(0xffff)));  // what fill = nan leaves in a buffer
  for (std::uint64_t i = 0; i < 1000; ++i) {       // the pattern survives fp16 exactly
    const float v = pattern_value(kInitSalt, 3, i);
    EXPECT_EQ(half_to_float(float_to_half(v)), v);
    EXPECT_GE(v, -1.0F);
    EXPECT_LT(v, 1.0F);
  }
}

// Where each member's slice lands is the byte-range plan's (RealDeepSpeed below).
TEST(RealPlan, MatchesCollectivesAndSpinsKernels) {
  const Scenario sc = tiny("stock");
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s);
  ASSERT_EQ(plan.ranks.size(), s.ranks.size());
  EXPECT_GT(plan.probes, 0U);
  std::size_t hpz_gathers = 0;
  for (const Instance& inst : plan.instances) {
    EXPECT_EQ(inst.members.size(), s.groups[inst.group].ranks.size());
    const auto [r, i] = inst.members.front();
    const Op& op = s.ranks[r].ops[i];
    if (op.kind != OpKind::kAllGather || s.groups[op.group].kind != GroupKind::kHpz) continue;
    ++hpz_gathers;
    // Every member receives what each member sends.
    EXPECT_GE(plan.ranks[r].ops[i].actions.size(), inst.members.size());
  }
  EXPECT_GT(hpz_gathers, 0U);
  // Forward kernels hold their stream for the cost model's time.
  bool spun = false;
  for (std::size_t i = 0; i < s.ranks[0].ops.size(); ++i) {
    if (s.ranks[0].ops[i].purpose == Purpose::kForwardCompute) {
      spun = spun || plan.ranks[0].ops[i].spin_s > 0;
    }
  }
  EXPECT_TRUE(spun);
}

// The memory check counts one lifetime of every touched buffer, the staging slot (no buffer
// id) too: at least the largest touched slot, at most every touched slot of every rank. Spin
// kernels move no activations, so those are untouched; every shard and gathered parameter is.
TEST(RealPlan, PeakBytesEstimateCoversEveryTouchedBufferAndTheStagingSlot) {
  for (const char* variant : {"stock", "event-wait"}) {
    const Scenario sc = tiny(variant);
    const Schedule s = build_schedule(sc);
    const Plan plan = make_plan(sc, s);
    std::uint64_t largest = 0, all = 0;
    std::size_t touched_activations = 0;
    for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
      const RankPlan& rp = plan.ranks[r];
      ASSERT_EQ(rp.slots[rp.staging].buffer, kNoBuffer);
      std::vector<bool> buffer_touched(s.ranks[r].buffers.size(), false);
      for (const SlotInfo& slot : rp.slots) {
        if (!slot.touched) continue;
        if (slot.buffer != kNoBuffer) buffer_touched[slot.buffer] = true;
        const std::uint64_t bytes = slot.elements * static_cast<std::uint64_t>(plan.element_bytes);
        largest = std::max(largest, bytes);
        all += bytes;
      }
      for (std::size_t b = 0; b < buffer_touched.size(); ++b) {
        const Buffer& buf = s.ranks[r].buffers[b];
        if (buf.role == BufferRole::kPrimary || buf.role == BufferRole::kFull ||
            buf.role == BufferRole::kSecondary) {
          EXPECT_TRUE(buffer_touched[b]) << buf.name;
        }
        touched_activations += buf.role == BufferRole::kActivation && buffer_touched[b] ? 1 : 0;
      }
    }
    EXPECT_EQ(touched_activations, 0U) << variant;
    const std::uint64_t estimate = peak_bytes_estimate(plan, s);
    EXPECT_GE(estimate, largest) << variant;
    EXPECT_LE(estimate, all) << variant;
  }
}

// hpZ only moves data: run race-free, every variant and hpZ off train to the same bits.
TEST(RealHostBackend, EveryVariantAndNoHpzGiveBitIdenticalWeights) {
  const RunOutput base = run_host(tiny("stock", 1));
  ASSERT_FALSE(base.hung) << base.hang;
  ASSERT_FALSE(base.weights.empty());
  for (const char* v : {"stock", "host-sync", "event-wait"}) {
    const RunOutput out = run_host(tiny(v));
    ASSERT_FALSE(out.hung) << out.hang;
    EXPECT_EQ(out.weights, base.weights) << v;
  }
}

TEST(RealHostBackend, TrainingChangesTheWeightsAndLeavesNoNaN) {
  const Scenario sc = tiny("event-wait");
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s);
  const RunOutput out = run_host(sc);
  std::uint64_t changed = 0, nans = 0, n = 0;
  for (std::size_t r = 0; r < out.weights.size(); ++r) {
    EXPECT_EQ(plan.ranks[r].weights.size(), s.units.size()) << "one primary shard per unit";
    for (std::size_t u = 0; u < out.weights[r].size(); ++u) {
      const auto& w = out.weights[r][u];
      const Loc& loc = plan.ranks[r].weights[u];
      const BufferId b = plan.ranks[r].slots[loc.slot].buffer;
      const UnitId unit = s.ranks[r].buffers[b].unit;
      const ShardLayout lay(s.units[unit].numel, s.world_size, s.hpz_size);
      const std::uint64_t first = lay.valid(lay.primary_slice(static_cast<Rank>(r))).begin;
      for (std::uint64_t i = 0; i < w.size() / 4; ++i) {
        const float v = load(w.data(), i, 4);
        nans += std::isnan(v) ? 1 : 0;
        changed += v != pattern_value(kInitSalt, unit, first + i) ? 1 : 0;
        ++n;
      }
    }
  }
  EXPECT_GT(n, 0U);
  EXPECT_EQ(nans, 0U);
  // Three optimizer steps move almost every weight of the primary shards the run ends with:
  // 114,918 of 115,008 here (the 90 others keep their init bits; why is not established).
  // The plan once listed zero.Init's primary shards too, which DeepSpeed's defragment() leaves
  // behind unwritten: half the weights looked unmoved.
  EXPECT_GT(changed, n * 99 / 100);
}

TEST(RealHostBackend, RunsAreDeterministic) {
  const Scenario sc = tiny("stock");
  const RunOutput a = run_host(sc, false);
  const RunOutput b = run_host(sc, false);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.probes, b.probes);
}

TEST(RealCompare, CountsCorruptedElementsNaNsAndTheFirstBadGather) {
  const Scenario sc = tiny("stock");
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s);
  const RunOutput ref = run_host(sc);
  EXPECT_FALSE(compare_runs(plan, ref, ref).corrupted());
  RunOutput bad = ref;
  const float nan = std::nanf("");
  std::memcpy(bad.weights[1][0].data(), &nan, 4);  // one NaN weight on rank 1
  bad.probes[3].nans = 7;                          // two gathers saw other bits
  bad.probes[5].hash ^= 1;
  const Corruption c = compare_runs(plan, ref, bad);
  EXPECT_TRUE(c.corrupted());
  EXPECT_EQ(c.corrupted_elements, 1U);
  EXPECT_EQ(c.nan_elements, 1U);
  EXPECT_EQ(c.bad_probes, 2U);
  EXPECT_EQ(
      c.probe_nans, 7U + [&] {
        std::uint64_t n = 0;
        for (const ProbeValue& p : ref.probes) n += p.nans;
        return n - ref.probes[3].nans;
      }());
  ASSERT_TRUE(c.has_first);
  EXPECT_TRUE(plan.ranks[c.first_rank].ops[c.first_op].is_gather_probe);
}

// fp16 storage (what the GPU runs use): a NaN counts, an infinity does not, -0 differs from +0.
TEST(RealCompare, CountsHalfPrecisionNaNsAndDifferingBits) {
  const Scenario sc = tiny("stock");
  Plan plan = make_plan(sc, build_schedule(sc));
  plan.element_bytes = 2;
  const std::vector<std::uint16_t> ref_bits = {0x3c00, 0x0000, 0x7c00, 0x1234, 0x7e00};
  const std::vector<std::uint16_t> run_bits = {0x3c00, 0x8000, 0x7c00, 0x7e01, 0x7e00};
  auto bytes = [](const std::vector<std::uint16_t>& v) {
    std::vector<std::uint8_t> out(v.size() * 2);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  RunOutput ref, run;
  ref.weights = {{bytes(ref_bits)}};
  run.weights = {{bytes(run_bits)}};
  const Corruption c = compare_runs(plan, ref, run);
  EXPECT_EQ(c.corrupted_elements, 2U);  // -0 and the new NaN
  EXPECT_EQ(c.nan_elements, 2U);        // 0x7e01 and 0x7e00, not the infinity
}

TEST(RealHostBackend, MismatchedCollectivesTimeOutAsAHang) {
  const Scenario sc = load_scenario(scenario_path("mismatched-collectives"));
  const RunOutput out = run_host(sc, true, 1.0);
  EXPECT_TRUE(out.hung);
  EXPECT_NE(out.hang.find("HANG"), std::string::npos) << out.hang;
  EXPECT_NE(out.hang.find("missing ranks"), std::string::npos) << out.hang;
}

// The lazy host backend runs stream work as late as the host allows and the compute stream
// last: the order in which a backed-up compute stream lets stock hpZ's gathers overtake the
// secondary copies. The whole pipeline (plan, executor, rendezvous, probes, comparison) must
// then find the corruption in stock and none with either fix or without hpZ.
RealResult run_lazy(const Scenario& sc) {
  RealOptions o;
  o.runs = 1;
  o.backend = "host-lazy";
  o.timeout_s = 30;
  return run_real(sc, build_schedule(sc), o);
}

/** `schedule` (host-sync) with fix A as torch's Event.synchronize(): each of its host stream
 *  syncs after a secondary copy becomes an event record on that stream and a host event sync. */
Schedule with_event_syncs(Schedule schedule) {
  for (RankSchedule& rs : schedule.ranks) {
    EventId next = 0;
    for (const Op& op : rs.ops) next = std::max(next, op.event + 1);
    std::vector<Op> ops;
    for (const Op& op : rs.ops) {
      if (op.purpose != Purpose::kFixHostSync) {
        ops.push_back(op);
        continue;
      }
      Op record = op;
      record.kind = OpKind::kEventRecord;
      record.purpose = Purpose::kFixEventRecord;
      record.event = next++;
      Op sync = record;
      sync.kind = OpKind::kHostEventSync;
      sync.purpose = Purpose::kFixHostSync;
      sync.stream = kHostStream;
      ops.push_back(record);
      ops.push_back(sync);
    }
    rs.ops.mut() = std::move(ops);
  }
  return schedule;
}

RealResult run_lazy(const Scenario& sc, const Schedule& schedule) {
  RealOptions o;
  o.runs = 1;
  o.backend = "host-lazy";
  o.timeout_s = 30;
  return run_real(sc, schedule, o);
}

// The lazy backend runs S0's work only when the host must wait for it: a host event sync on the
// event recorded after each secondary copy must run the copy then, or stock's corruption shows.
TEST(RealLazyHost, AHostEventSyncRunsTheRecordedWorkFirst) {
  const Scenario sc = tiny("host-sync");
  const Schedule synced = with_event_syncs(build_schedule(sc));
  const auto syncs = std::count_if(synced.ranks[0].ops.begin(), synced.ranks[0].ops.end(),
                                   [](const Op& op) { return op.kind == OpKind::kHostEventSync; });
  ASSERT_GT(syncs, 0);
  const RealResult r = run_lazy(sc, synced);
  ASSERT_FALSE(r.reference_hung) << r.reference_hang;
  EXPECT_EQ(r.corrupted_runs, 0);
  Schedule unsynced = synced;  // the records alone order nothing
  for (RankSchedule& rs : unsynced.ranks) {
    std::erase_if(rs.ops.mut(), [](const Op& op) { return op.kind == OpKind::kHostEventSync; });
  }
  EXPECT_EQ(run_lazy(sc, unsynced).corrupted_runs, 1);
}

TEST(RealLazyHost, StockReadsNaNSecondariesAndPoisonsTheWeights) {
  const RealResult r = run_lazy(tiny("stock"));
  ASSERT_FALSE(r.reference_hung) << r.reference_hang;
  ASSERT_EQ(r.runs.size(), 1U);
  const Corruption& c = r.runs[0].corruption;
  EXPECT_EQ(r.corrupted_runs, 1);
  EXPECT_GT(c.bad_probes, 0U);
  EXPECT_GT(c.probe_nans, 0U);    // the gathers read fill = nan secondaries
  EXPECT_GT(c.nan_elements, 0U);  // and the NaN reached the weights
  ASSERT_TRUE(c.has_first);
  const Schedule s = build_schedule(tiny("stock"));
  const Op& first = s.ranks[c.first_rank].ops[c.first_op];
  EXPECT_EQ(first.kind, OpKind::kAllGather);
  EXPECT_EQ(s.groups[first.group].kind, GroupKind::kHpz);  // an hpZ gather of a secondary
  EXPECT_GT(r.timing.mean.races_manifested, 0U);
}

TEST(RealLazyHost, BothFixesAndNoHpzStayExact) {
  for (const auto& [variant, hpz] :
       {std::pair<const char*, int>{"host-sync", 2}, {"event-wait", 2}, {"stock", 1}}) {
    const RealResult r = run_lazy(tiny(variant, hpz));
    ASSERT_FALSE(r.reference_hung) << r.reference_hang;
    EXPECT_EQ(r.corrupted_runs, 0) << variant << " hpz " << hpz;
    EXPECT_EQ(r.runs[0].corruption.nan_elements, 0U) << variant;
  }
}

// ---- The tiny model's real math (--compute real on a model the numeric replay holds) ----

RealResult run_model(const Scenario& sc, const std::string& backend, int runs = 1) {
  RealOptions o;
  o.runs = runs;
  o.backend = backend;
  o.compute = "real";
  o.timeout_s = 30;
  return run_real(sc, build_schedule(sc), o);
}

bool any_nan(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}

// ---- On a GPU (skipped without one) ----

// cudaEventQuery polled to completion: fix A as host event syncs corrupts no run either.
TEST(RealGpu, HostEventSyncsFixTheRaceLikeStreamSyncs) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const Scenario sc =
      load_scenario(scenario_path("race-1gpu-deepspeed"), {{"run.variant", "host-sync"}});
  RealOptions o;
  o.runs = 3;
  o.timeout_s = 120;
  const RealResult r = run_real(sc, with_event_syncs(build_schedule(sc)), o);
  ASSERT_FALSE(r.reference_hung) << r.reference_hang;
  EXPECT_EQ(r.corrupted_runs, 0);
}

// The CUDA kernels compute the same bits as the host reference, op for op.
/** `sc` run serialized on the GPU and on the host backend: the same weights and gathers. */
void expect_gpu_run_equals_host(const Scenario& sc, const std::string& what) {
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s);
  ExecOptions o;
  o.serialize = true;
  auto gpu = make_cuda_backend();
  const RunOutput g = execute(s, plan, *gpu, o);
  auto host = make_host_backend();
  const RunOutput h = execute(s, plan, *host, o);
  ASSERT_FALSE(g.hung) << what << ": " << g.hang;
  EXPECT_EQ(g.weights, h.weights) << what;
  EXPECT_EQ(g.probes, h.probes) << what;
}

TEST(RealGpu, SerializedGpuRunEqualsTheHostReference) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  for (int hpz : {1, 2}) {
    expect_gpu_run_equals_host(tiny("event-wait", hpz), "hpz " + std::to_string(hpz));
  }
}

}  // namespace
}  // namespace hpz::real

// ---- DeepSpeed's own schedule (the DeepSpeed builder; plan_ranges.cpp) ----

namespace hpz::real {
namespace {

Scenario tiny_ds(const std::string& variant, const std::vector<Override>& extra = {}) {
  std::vector<Override> keys = {
      {"run.builder", "deepspeed"}, {"run.variant", variant}, {"run.steps", "3"}};
  keys.insert(keys.end(), extra.begin(), extra.end());
  return load_scenario(scenario_path("tiny"), keys);
}

RealResult run_ds(const Scenario& sc, const std::string& backend) {
  RealOptions o;
  o.runs = 1;
  o.backend = backend;
  o.timeout_s = 30;
  return run_real(sc, build_schedule(sc), o);
}

// Gathers land where the replay puts them: member k's send at k x comm_bytes of the write, and
// each is a probe. Gradients go through the reduce-scatters as reduce_scatter_coalesced lays the
// bucket out: each member packs its bucket before it joins, the sum lands in its output, and
// each parameter's chunk in the rank's reduced partition, which the optimizer step reads on
// its own rank (plan_gradients.cpp).
TEST(RealDeepSpeed, PlanFollowsByteRangesAsTheReplayDoes) {
  const Scenario sc = tiny_ds("stock");
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s);
  EXPECT_FALSE(plan.cross_rank_gradients);
  const std::uint64_t world = s.ranks.size();
  std::size_t gathers = 0, steps_with_gradient = 0, reductions = 0;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
      const Op& op = s.ranks[r].ops[i];
      const PlanOp& po = plan.ranks[r].ops[i];
      if (op.kind == OpKind::kAllGather && !po.actions.empty()) {
        ++gathers;
        EXPECT_TRUE(po.is_gather_probe);
        const std::uint64_t count = op.comm_bytes / static_cast<std::uint64_t>(s.dtype_bytes);
        for (std::size_t k = 0; k < po.actions.size(); ++k) {
          EXPECT_EQ(po.actions[k].dst.elem, po.probe.elem + k * count);
        }
      }
      if (op.kind == OpKind::kReduceScatter && op.phase == Phase::kGradReduce) {
        ++reductions;
        EXPECT_FALSE(po.pre_actions.empty());
        EXPECT_EQ(po.native.kind, NativeCollective::Kind::kReduceScatter);
        EXPECT_EQ(po.native.send_n, world * po.native.count);
        ASSERT_EQ(po.actions.size(), 1U);
        EXPECT_EQ(po.actions[0].kind, Action::Kind::kSum);
        EXPECT_EQ(po.actions[0].src.size(), world);
        // Member m sums the members' m-th part of their packed buckets.
        for (const Loc& l : po.actions[0].src) {
          EXPECT_EQ(l.elem, static_cast<std::uint64_t>(po.member) * po.native.count);
        }
        EXPECT_FALSE(po.post_actions.empty());
        EXPECT_EQ(po.native.after.size(), po.post_actions.size() + 1);  // + staging into place
      }
      if (op.purpose == Purpose::kOptimizerStep && op.unit != kNoUnit) {
        // primary -= reduced / 16, from this rank's own reduced partition.
        ASSERT_EQ(po.actions.size(), 1U) << "rank " << r << " op " << i;
        EXPECT_EQ(po.actions[0].kind, Action::Kind::kAxpy);
        ASSERT_EQ(po.actions[0].src.size(), 1U);
        EXPECT_EQ(po.actions[0].src[0].rank, static_cast<Rank>(r));
        ++steps_with_gradient;
      }
    }
  }
  EXPECT_GT(gathers, 0U);
  EXPECT_GT(reductions, 0U);
  EXPECT_GT(steps_with_gradient, 0U);
  EXPECT_EQ(plan.probes, gathers);
}

// On the host reference every release and variant that orders the copy trains to the same bits
// as hpZ off; the lazy host (every race bites) corrupts stock 0.13.4 and neither fix nor 0.13.5;
// 0.13.1's stale secondaries give other weights even serialized (the replay says "wrong" too).
TEST(RealDeepSpeed, LazyHostCorruptsOnlyStockAndFixesTrainAsHpzOff) {
  const RealResult off = run_ds(tiny_ds("stock", {{"zero.zero_hpz_partition_size", "1"}}), "host");
  ASSERT_FALSE(off.reference_hung) << off.reference_hang;
  EXPECT_EQ(off.corrupted_runs, 0);
  const RealResult stock = run_ds(tiny_ds("stock"), "host-lazy");
  EXPECT_EQ(stock.corrupted_runs, 1);
  EXPECT_GT(stock.runs[0].corruption.bad_probes, 0U);
  EXPECT_GT(stock.runs[0].corruption.nan_elements, 0U);  // the NaN reached the weights
  EXPECT_EQ(stock.reference_weights_hash, off.reference_weights_hash);
  for (const auto& [variant, version] : {std::pair<const char*, const char*>{"host-sync", "0.13.4"},
                                         {"event-wait", "0.13.4"},
                                         {"stock", "0.13.5"}}) {
    const RealResult r =
        run_ds(tiny_ds(variant, {{"zero.deepspeed_version", version}}), "host-lazy");
    EXPECT_EQ(r.corrupted_runs, 0) << variant << " " << version;
    EXPECT_EQ(r.reference_weights_hash, off.reference_weights_hash) << variant << " " << version;
  }
  const RealResult stale =
      run_ds(tiny_ds("event-wait", {{"zero.deepspeed_version", "0.13.1"}}), "host");
  EXPECT_NE(stale.reference_weights_hash, off.reference_weights_hash);
}

// Three steps train: the weights hash moves with every step (gradients reach the optimizer).
TEST(RealDeepSpeed, EveryStepMovesTheWeights) {
  std::uint64_t last = 0;
  for (const char* steps : {"1", "2", "3"}) {
    const RealResult r = run_ds(tiny_ds("event-wait", {{"run.steps", steps}}), "host");
    EXPECT_NE(r.reference_weights_hash, last) << steps;
    last = r.reference_weights_hash;
  }
}

// race-1gpu-deepspeed.toml's four ranks fit one 80 GB GPU (H100), with room for the pool.
TEST(RealDeepSpeed, OneGpuScenarioFitsAnH100) {
  const Scenario sc = load_scenario(scenario_path("race-1gpu-deepspeed"));
  const Schedule s = unfold_strided(build_schedule(sc));
  const Plan plan = make_plan(sc, s);
  const double gib = static_cast<double>(peak_bytes_estimate(plan, s)) / (1 << 30);
  EXPECT_GT(gib, 1.0);
  EXPECT_LT(gib, 0.8 * 79.0) << gib << " GiB";  // run.cpp refuses more than 80% of the device
}

// On a GPU (skipped without one): the serialized GPU run of DeepSpeed's schedule moves the data
// the host reference moves, bit for bit.
TEST(RealGpuDeepSpeed, SerializedGpuRunEqualsTheHostReference) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  for (const char* hpz : {"1", "2"}) {
    expect_gpu_run_equals_host(tiny_ds("event-wait", {{"zero.zero_hpz_partition_size", hpz}}),
                               std::string("hpz ") + hpz);
  }
}

// race-1gpu-deepspeed.toml on a GPU: both fixes and DeepSpeed 0.13.5 never corrupt and train to
// hpZ off's bits. Whether stock 0.13.4 corrupts without a spin kernel is the finding
// tools/gpu-selftest reports; it is not asserted here.
TEST(RealGpuDeepSpeed, BothFixesAnd0135NeverCorrupt) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const auto run = [](const std::vector<Override>& keys) {
    const Scenario sc = load_scenario(scenario_path("race-1gpu-deepspeed"), keys);
    RealOptions o;
    o.runs = 2;
    o.timeout_s = 120;
    return run_real(sc, build_schedule(sc), o);
  };
  const RealResult off = run({{"zero.zero_hpz_partition_size", "1"}});
  ASSERT_FALSE(off.reference_hung) << off.reference_hang;
  EXPECT_EQ(off.corrupted_runs, 0);
  for (const std::vector<Override>& keys : {std::vector<Override>{{"run.variant", "host-sync"}},
                                            {{"run.variant", "event-wait"}},
                                            {{"zero.deepspeed_version", "0.13.5"}}}) {
    const RealResult r = run(keys);
    ASSERT_FALSE(r.reference_hung) << r.reference_hang;
    EXPECT_EQ(r.corrupted_runs, 0) << keys[0].first << "=" << keys[0].second;
    EXPECT_EQ(r.reference_weights_hash, off.reference_weights_hash) << keys[0].second;
  }
}

// ---- transformers' Llama on DeepSpeed's own schedule (--compute real; llama_model.hpp) ----

// Every parameter's forward, recompute and backward kernel and every loss kernel becomes a Llama
// op carrying its parameter and micro-step, every optimizer step of a unit an Adam without
// clipping, whose moments start from zero once per (rank, unit); no model kernel also spins.
TEST(RealDeepSpeedModel, EveryParameterKernelIsALlamaOp) {
  const Scenario sc = tiny_ds("event-wait");
  const Schedule s = build_schedule(sc);
  const Plan plan = make_plan(sc, s, true);
  ASSERT_TRUE(plan.llama.has_value());
  std::map<ModelOp::Kind, int> kinds;
  std::map<Purpose, int> with_param;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    std::map<UnitId, int> fresh;
    for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
      const Op& op = s.ranks[r].ops[i];
      const PlanOp& po = plan.ranks[r].ops[i];
      if (op.kind == OpKind::kKernel &&
          (op.unit != kNoUnit || op.purpose == Purpose::kLossGradient)) {
        ++with_param[op.purpose];
      }
      if (po.models.empty()) continue;
      EXPECT_EQ(po.spin_s, 0.0);
      EXPECT_EQ(po.models.size(), 1U) << "the builder's kernels: one module part each";
      for (const ModelOp& m : po.models) {
        ++kinds[m.kind];
        if (m.kind == ModelOp::Kind::kLlamaForward || m.kind == ModelOp::Kind::kLlamaBackward) {
          EXPECT_EQ(m.w.n, s.units[op.unit].numel) << "the whole gathered parameter";
          EXPECT_EQ(m.step, op.step);
          EXPECT_EQ(m.micro, op.micro_step);
          EXPECT_EQ(m.recompute, op.purpose == Purpose::kRecomputeForward);
        }
        if (m.kind == ModelOp::Kind::kAdam) {
          EXPECT_EQ(m.max_grad_norm, 0.0F);
          EXPECT_EQ(m.norm.n, 0U);
          if (m.fresh_state) ++fresh[op.unit];
        }
      }
    }
    for (const auto& [unit, n] : fresh) EXPECT_EQ(n, 1) << "rank " << r << " unit " << unit;
    EXPECT_EQ(fresh.size(), s.units.size()) << "rank " << r;
  }
  EXPECT_EQ(kinds[ModelOp::Kind::kLlamaForward],
            with_param[Purpose::kForwardCompute] + with_param[Purpose::kRecomputeForward]);
  EXPECT_GT(with_param[Purpose::kRecomputeForward], 0);
  EXPECT_EQ(kinds[ModelOp::Kind::kLlamaBackward], with_param[Purpose::kBackwardCompute]);
  EXPECT_EQ(kinds[ModelOp::Kind::kLlamaLoss], with_param[Purpose::kLossGradient]);
  EXPECT_EQ(kinds[ModelOp::Kind::kAdam], with_param[Purpose::kOptimizerStep]);
  EXPECT_GT(kinds[ModelOp::Kind::kAdam], 0);
}

// The host reference of DeepSpeed 0.13.4's schedule trains exactly as the numeric replay does
// (its loss bit for bit, falling), and every release and variant, hpZ off too, ends on the same
// weights: zero.Init's broadcast, the gathers, the bucket copies and Adam all move the replay's
// numbers.
TEST(RealDeepSpeedModel, HostReferenceTrainsExactlyAsTheNumericReplay) {
  std::set<std::uint64_t> hashes;
  for (const std::vector<Override>& keys : {std::vector<Override>{},
                                            {{"run.variant", "host-sync"}},
                                            {{"zero.deepspeed_version", "0.13.5"}},
                                            {{"zero.zero_hpz_partition_size", "1"}}}) {
    const std::string what = keys.empty() ? "stock" : keys[0].first + "=" + keys[0].second;
    const RealResult r = run_model(tiny_ds("stock", keys), "host");
    ASSERT_FALSE(r.reference_hung) << r.reference_hang;
    ASSERT_TRUE(r.model);
    ASSERT_EQ(r.reference_loss.size(), 3U);
    EXPECT_EQ(r.reference_loss, r.replay_loss) << what;
    EXPECT_FALSE(any_nan(r.reference_loss)) << what;
    EXPECT_LT(r.reference_loss.back(), r.reference_loss.front()) << what;
    EXPECT_EQ(r.corrupted_runs, 0) << what;
    hashes.insert(r.reference_weights_hash);
  }
  EXPECT_EQ(hashes.size(), 1U);
}

// On the lazy host (every race the schedule allows bites), stock 0.13.4's forward gathers read
// the NaN of fresh secondaries and its loss turns NaN; both fixes and 0.13.5 train exactly as
// their reference, which is hpZ off's.
TEST(RealDeepSpeedModel, LazyStockTurnsTheLossNaNAndTheFixesTrainExactly) {
  const RealResult stock = run_model(tiny_ds("stock"), "host-lazy");
  ASSERT_FALSE(stock.reference_hung) << stock.reference_hang;
  EXPECT_EQ(stock.corrupted_runs, 1);
  EXPECT_TRUE(any_nan(stock.runs[0].loss));
  EXPECT_FALSE(any_nan(stock.reference_loss));
  EXPECT_EQ(stock.runs[0].loss[0], stock.reference_loss[0]) << "step 0 reads no secondary";
  for (const auto& [variant, version] : {std::pair<const char*, const char*>{"host-sync", "0.13.4"},
                                         {"event-wait", "0.13.4"},
                                         {"stock", "0.13.5"}}) {
    const RealResult r =
        run_model(tiny_ds(variant, {{"zero.deepspeed_version", version}}), "host-lazy");
    ASSERT_FALSE(r.reference_hung) << r.reference_hang;
    EXPECT_EQ(r.corrupted_runs, 0) << variant << " " << version;
    EXPECT_EQ(r.runs[0].loss, r.reference_loss) << variant << " " << version;
    EXPECT_EQ(r.reference_weights_hash, stock.reference_weights_hash) << variant << " " << version;
  }
}

// A model the Llama's math cannot hold is refused with the reason; --compute real then means
// GEMMs of the layer shapes, which only the cuda backend runs. A bf16 schedule runs in fp32, as
// the numeric replay computes it: the same losses.
TEST(RealDeepSpeedModel, ModelsTheMathCannotHoldAreRefusedWithTheReason) {
  const Scenario half = tiny_ds("stock", {{"training.dtype", "bf16"}});
  const Schedule hs = build_schedule(half);
  ASSERT_EQ(hs.dtype_bytes, 2);
  EXPECT_EQ(model_math_unfit(half, hs), "");
  EXPECT_EQ(make_plan(half, hs, true).element_bytes, 4);
  const RealResult hr = run_model(half, "host");
  ASSERT_EQ(hr.reference_loss.size(), 3U);
  EXPECT_EQ(hr.reference_loss, hr.replay_loss);
  EXPECT_FALSE(any_nan(hr.reference_loss));
  const Scenario sc = tiny_ds("stock");
  const Schedule s = build_schedule(sc);
  EXPECT_EQ(model_math_unfit(sc, s), "");
  Schedule renamed = s;
  renamed.units[0].name = "transformer.wte.weight";  // GPT-2's: no Llama parameter
  EXPECT_NE(model_math_unfit(sc, renamed).find("transformer.wte.weight"), std::string::npos)
      << model_math_unfit(sc, renamed);
}

// On a GPU (skipped without one): the Llama's math on DeepSpeed's schedule, run in stream order
// through host functions, trains serialized exactly as the host reference; both fixes and
// 0.13.5 never corrupt. Whether stock corrupts is what tools/gpu-selftest reports.
TEST(RealGpuDeepSpeedModel, SerializedRunTrainsAsTheHostAndTheFixesNeverCorrupt) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const RealResult host = run_model(tiny_ds("stock"), "host");
  for (const auto& [variant, version] : {std::pair<const char*, const char*>{"stock", "0.13.4"},
                                         {"host-sync", "0.13.4"},
                                         {"event-wait", "0.13.4"},
                                         {"stock", "0.13.5"}}) {
    const RealResult r =
        run_model(tiny_ds(variant, {{"zero.deepspeed_version", version}}), "cuda", 2);
    ASSERT_FALSE(r.reference_hung) << r.reference_hang;
    EXPECT_EQ(r.reference_loss, host.reference_loss) << variant << " " << version;
    EXPECT_EQ(r.reference_weights_hash, host.reference_weights_hash) << variant << " " << version;
    if (std::string(variant) == "stock" && std::string(version) == "0.13.4") continue;
    EXPECT_EQ(r.corrupted_runs, 0) << variant << " " << version;
  }
}

}  // namespace
}  // namespace hpz::real
