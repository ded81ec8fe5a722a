// What the real executor does for each op of the schedule IR, decided once on the CPU: the
// buffer lifetime ("slot") every access refers to, the matching of collectives into instances,
// how long each kernel holds its stream, and the data every op moves, as a few element-wise
// actions. The CUDA backend and the host reference backend both carry out exactly this plan, so
// the plan is what the non-GPU tests check.
//
// Data semantics (the same rules as the data replay, sim/replay/data_engine.hpp):
//  - copies move their read range into their write range (a widening cast, which writes 2 or 4
//    times the bytes it reads, puts each value on 2 or 4 elements); a checkpoint load (a copy
//    with no read) writes the checkpoint pattern;
//  - quantize / dequantize are pass-through (real rounding would change every variant alike);
//  - an AllGather puts member k's send at its slice of the full parameter: its secondary slice
//    in an hpZ group, its primary slice otherwise; a ReduceScatter sums the members' slices (in
//    group order) and adds this rank's earlier shard when it reads one; AllReduce and AllToAll
//    sum the whole vectors;
//  - with the model's real math (--compute real on a Llama the numeric replay holds, fp32),
//    parameter init and checkpoint loads write the replay's initial weights, and the forward,
//    loss, backward, gradient-norm and Adam kernels compute what the numeric replay's do
//    (ModelOp; sim/replay/llama_model.hpp), on the rank's own buffers;
//  - otherwise kernels run as spin kernels for the time the timing engine's cost model gives them;
//  in
//    spin mode their data effect is synthetic but real: parameter init writes a pattern that
//    depends on the element's place in the full parameter, a backward kernel writes
//    grad = param / 8, an optimizer step writes primary -= grad / 16. A NaN the race lets into a
//    gathered parameter therefore reaches the gradients and, through the ReduceScatter, every
//    rank's weights, as it does in training.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "real/gemm.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/replay/llama_model.hpp"
#include "sim/scenario.hpp"

namespace hpz::real {

/** A slot: one lifetime of one buffer of one rank (each kAlloc opens a new one). */
using SlotId = std::uint32_t;

/** An element range of one rank's slot. */
struct Loc {
  Rank rank = 0;
  SlotId slot = 0;
  std::uint64_t elem = 0;  ///< first element
};

/** One element-wise data action. */
struct Action {
  enum class Kind : std::uint8_t {
    kCopy,     ///< dst[i] = src[0][i]
    kSum,      ///< dst[i] = src[0][i] + src[1][i] + ... (in this order)
    kPattern,  ///< dst[i] = pattern(salt, unit, pattern_base + i)
    kZero,     ///< dst[i] = 0
    kScale,    ///< dst[i] = src[0][i] * scale
    kAxpy,     ///< dst[i] = dst[i] + src[0][i] * scale
    kConst,    ///< dst[i] = Plan::consts[const_id][pattern_base + i] (fp32 only)
    kWiden,    ///< dst[i] = src[0][i / repeat] (a widening dtype cast's bytes, as the replay's)
  };
  Kind kind = Kind::kCopy;
  Loc dst;
  std::uint64_t n = 0;  ///< elements
  std::vector<Loc> src;
  float scale = 0;
  std::uint32_t salt = 0;
  UnitId unit = kNoUnit;
  std::uint64_t pattern_base = 0;
  std::uint32_t const_id = 0;
  std::uint32_t repeat = 1;  ///< kWiden: elements each source element lands on
};

/** `n` elements of one rank's slot from `at`. */
struct Range {
  Loc at;
  std::uint64_t n = 0;
};

/** A kernel of the model's real math: the numeric replay's function of the same op
 *  (sim/replay/numeric_domain.cpp), on fp32 buffers. Ranges are the op's accesses, chosen as
 *  the replay chooses them. */
struct ModelOp {
  enum class Kind : std::uint8_t {
    kNone,
    kGradNorm,  ///< out[0] = sum of squares over `parts` (in double, in order)
    kAdam,      ///< out = Adam step of x (the primary shard) with grad, norm, m, v
    // Transformers' Llama, one parameter's module part a kernel (sim/replay/llama_model.hpp),
    // its activations in the rank's LlamaPass of the backend.
    kLlamaForward,   ///< the part's forward (or recompute) with the weights w
    kLlamaLoss,      ///< the loss of the pass's last forward, to `loss`
    kLlamaBackward,  ///< the part's backward with the weights w; grad = dw[grad_first, ...)
  };
  Kind kind = Kind::kNone;
  std::int32_t tokens = -1;  ///< Plan::tokens index (forward, loss, backward)
  Range w, x, out, dy, grad;
  std::uint64_t numel = 0;       ///< backward: the unit's parameters (dw's size)
  std::uint64_t grad_first = 0;  ///< backward: first element of dw that `grad` receives
  std::vector<Range> parts;      ///< grad norm: the gradient shards it sums
  Range norm, m, v;              ///< Adam: the summed squares (n = 0: none), its moments
  bool fresh_state = false;      ///< Adam: the first step of this shard in the run: m = v = 0
  float scale = 0;               ///< Adam: 1 / (world size x gradient accumulation)
  int step = 0;                  ///< Adam: the op's training step (t = step + 1)
  Loc loss;                      ///< loss: where its value goes (the rank's loss slot)
  float max_grad_norm = 1.0F;    ///< Adam: clipping (0: none, DeepSpeed's default)
  // Llama kernels: the parameter, and the micro-step whose pass they belong to (a kernel of
  // another (step, micro) than the rank's last begins a new pass on `tokens`).
  std::int32_t layer = -1;
  std::uint8_t part = 0;  ///< replay::LlamaPart
  bool recompute = false;
  std::int32_t micro = 0;
};

/** Salts of the two patterns. */
inline constexpr std::uint32_t kInitSalt = 1;
inline constexpr std::uint32_t kCheckpointSalt = 2;

/** A collective as the one NCCL call each member makes on its own buffers, for runs with one
 *  process per rank, where no member can read another's memory. Derived from the same spans
 *  as `actions`, which stay the emulated form: member k's send span is what every member's
 *  actions read from member k. */
struct NativeCollective {
  enum class Kind : std::uint8_t {
    kNone,           ///< no single NCCL call does what `actions` do (the layout does not fit)
    kAllGather,      ///< member k's `count` elements land at recv + k * count
    kReduceScatter,  ///< the members' sends summed; this member gets `count` at its position
    kAllReduce,      ///< the members' sends summed, `count` elements (qgZ's all-to-all too)
    kBroadcast,      ///< member `root`'s `count` elements to every member (zero.Init's)
  };
  Kind kind = Kind::kNone;
  int root = 0;               ///< kBroadcast: the sending member's position in the instance
  Loc send;                   ///< this member's send span: what the members' actions read from it
  std::uint64_t send_n = 0;   ///< elements of the send span (0: it sends nothing)
  Loc recv;                   ///< kAllGather: member 0's part; otherwise the native staging slot
  std::uint64_t count = 0;    ///< NCCL's count (per member for kAllGather and kReduceScatter)
  std::vector<Action> after;  ///< local actions after the call: staging into place (+ this
                              ///< rank's accumulated shard)
};

/** The executor's view of one op. */
struct PlanOp {
  double spin_s = 0;              ///< stream time of a kernel / quantize kernel (cost model)
  std::optional<GemmShape> gemm;  ///< layer kernels: the GEMM they run under --compute real
  std::int32_t instance = -1;     ///< collectives: index into Plan::instances
  std::int32_t member = -1;       ///< collectives: position in the instance
  std::vector<Action> actions;    ///< data moved (for collectives: after every member arrived)
  /** Collectives: this rank's own actions before it joins (in every mode): the gradient
   *  reduction's packing of its bucket, as reduce_scatter_coalesced lays it out. */
  std::vector<Action> pre_actions;
  /** Collectives that write a buffer they also send (an in-place AllReduce): `actions` write
   *  the rank's staging slot, and these copy it into place once every member has read its
   *  inputs. */
  std::vector<Action> post_actions;
  /** Kernels under the model's real math, in order (after `actions`): one module part, or a
   *  recording's primary write-back copy's Adam step of every shard it writes. */
  std::vector<ModelOp> models;
  NativeCollective native;       ///< collectives: the same data movement as one NCCL call
  SlotId alloc_slot = 0;         ///< kAlloc: the slot it opens; kFree: the slot it closes
  bool is_gather_probe = false;  ///< an AllGather of a full parameter: its result is checked
  Loc probe;                     ///< the gathered range (is_gather_probe)
  std::uint64_t probe_n = 0;
};

/** One slot's shape. */
struct SlotInfo {
  BufferId buffer = 0;  ///< kNoBuffer for the rank's staging slot (the last one)
  std::uint64_t elements = 0;
  /** Some action, probe or final-weight read touches it. Spin kernels move no data, so most
   *  activation lifetimes are never touched: the CUDA backend gives those no memory. */
  bool touched = false;
};

/** One rank's plan. */
struct RankPlan {
  std::vector<SlotInfo> slots;  ///< first one slot per buffer id (before any alloc), then one
                                ///< per kAlloc in issue order and the plan's own (gradients),
                                ///< then the staging slot, the native staging slot, and more
                                ///< of the plan's own (packing, reduced gradients, the model's)
  SlotId staging = 0;
  SlotId native_staging = 0;    ///< where a native ReduceScatter / AllReduce lands (not `touched`:
                                ///< only the multi-process runs use it)
  SlotId losses = 0;            ///< model math: one loss value per loss kernel, in issue order
  std::vector<int> loss_steps;  ///< model math: the training step of each loss value
  std::vector<PlanOp> ops;      ///< parallel to schedule.ranks[r].ops
  std::vector<Loc> weights;     ///< the primary shards at the end of the run, per unit
  std::vector<std::uint64_t> weight_n;
};

/** The k-th collective of a group. */
struct Instance {
  GroupId group = kNoGroup;
  std::vector<Rank> group_ranks;  ///< every rank of the group: all must issue it, or it hangs
  std::vector<std::pair<Rank, std::uint32_t>> members;  ///< (rank, op) that issue it, in order
};

/** Everything the executor needs. */
struct Plan {
  int element_bytes = 2;  ///< 2 (fp16 storage) or 4 (fp32)
  bool model = false;     ///< kernels run the model's real math (ModelOp)
  /** model: the Llama's sizes (its kernels are kLlama*). */
  std::optional<replay::LlamaDims> llama;
  std::vector<std::vector<float>> consts;  ///< model: initial weights (Action::kConst)
  std::vector<std::vector<int>> tokens;    ///< model: each (rank, step, micro-step)'s batch
  std::vector<RankPlan> ranks;
  std::vector<Instance> instances;
  std::uint64_t probes = 0;  ///< gather probes over all ranks
  /** DeepSpeed's own schedules whose gradient reduction the plan cannot follow through its
   *  collectives (qgZ's quantized all-to-alls, a recording's buckets): each optimizer step
   *  sums every rank's gradient itself, which needs every rank in one process. */
  bool cross_rank_gradients = false;
};

/** Builds the plan of `schedule` (built from `scenario`). Throws InputError when the schedule's
 *  collectives do not match (a schedule that would hang is reported, not executed). `model`:
 *  kernels run the model's real math (InputError unless model_math_unfit says ""):
 *  transformers' Llama. */
Plan make_plan(const Scenario& scenario, const Schedule& schedule, bool model = false);

/** Whether the model's real math can run this schedule of the scenario: the numeric replay
 *  holds the model (replay::numeric_fits: a Llama whose parameters are the schedule's,
 *  replay::llama_unsupported) and buffers are fp32. "" when it
 *  can, else why not. */
std::string model_math_unfit(const Scenario& scenario, const Schedule& schedule);

/** The synthetic parameter value of element `i` of unit `unit` (the same on every backend). */
float pattern_value(std::uint32_t salt, UnitId unit, std::uint64_t i);

/** Every distinct GEMM shape of the plan's ops (PlanOp::gemm), of every rank or only `rank`'s,
 *  sorted by (m, n, k): what a runner is sized for and warms up before a timed run. */
std::vector<GemmShape> gemm_shapes(const Plan& plan, int rank = -1);

/** The ranks of the instance's group that never issue it, comma-separated ("" when none). */
std::string missing_ranks(const Instance& inst);

/** Bytes of device memory the plan needs if every buffer had one lifetime at a time (touched
 *  slots only: the CUDA backend allocates no others), over every rank or only `rank`'s (one
 *  process per rank, whose native collectives also need the native staging slot). */
std::uint64_t peak_bytes_estimate(const Plan& plan, const Schedule& schedule, int rank = -1);

}  // namespace hpz::real
