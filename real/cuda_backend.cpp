// The CUDA backend: emulated ranks on device 0. Each rank has its own non-blocking streams (one
// per IR stream), its own buffers and events; collectives are carried out by the executor's
// rendezvous plus device copies and kernels on the members' streams. Memory comes from a small
// caching allocator per (rank, buffer): a freed block is reused only once every stream of its
// rank has passed the free (PyTorch's record_stream rule, conservatively), so lifetimes never
// overlap, and `fill = stale` sees what that buffer's block last held.
//
// An allocation never blocks the host: `empty()` returns at once in PyTorch, and a host that
// waited here would be paced by the GPU and never run ahead, which is what the race needs. The
// fill (NaN or zero) runs on one shared fill stream, and every stream of the rank waits for it
// before its next op, so no read of the new lifetime, on any stream, precedes the fill.
// Hardware queues: the GPU has at most 32 (CUDA_DEVICE_MAX_CONNECTIONS); streams beyond that
// share a queue and get false dependencies, which can hide a race. With at most 31 IR streams
// (race-1gpu.toml has 16) every stream, the fill stream too, can have a queue of its own.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <thread>

#include "real/backend.hpp"
#include "real/device.hpp"
#include "real/executor.hpp"
#include "real/gemm_runner.hpp"
#include "real/kernels.hpp"
#include "real/model_kernels.hpp"
#include "real/store.hpp"
#include "sim/replay/llama_model.hpp"

namespace hpz::real {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(
        fmt::format("{}: {} ({})", what, cudaGetErrorString(err), static_cast<int>(err)));
  }
}
#define HPZ_CUDA(call) check((call), #call)

void check_nccl(ncclResult_t err, const char* what) {
  if (err != ncclSuccess) {
    throw std::runtime_error(fmt::format(
        "{}: {} ({}){}", what, ncclGetErrorString(err), static_cast<int>(err),
        err == ncclSystemError || err == ncclRemoteError ? "; NCCL_DEBUG=WARN says more" : ""));
  }
}
#define HPZ_NCCL(call) check_nccl((call), #call)

/** One process's share of a run with one process per rank: its rank and its communicators. */
struct NcclRank {
  Rank rank = 0;
  ncclComm_t world = nullptr;
  std::vector<ncclComm_t> groups;  ///< per IR group; nullptr where this rank is not a member
};

cudaEvent_t new_event(bool timing) {
  cudaEvent_t e{};
  HPZ_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, std::optional<NcclRank> nccl, bool real_compute)
      : device_(device), nccl_(std::move(nccl)), real_compute_(real_compute) {
    HPZ_CUDA(cudaSetDevice(device_));
    HPZ_CUDA(cudaStreamCreateWithFlags(&fill_, cudaStreamNonBlocking));
    origin_event_ = new_event(true);
  }

  ~CudaBackend() override {
    // Best effort: the process is about to exit, errors here change nothing.
    cudaDeviceSynchronize();
    for (RankState& rs : ranks_) {
      for (auto& [b, list] : rs.free) {
        for (Block& blk : list) cudaFree(blk.ptr);
      }
      for (Block& blk : rs.live) cudaFree(blk.ptr);
    }
    if (probe_dev_ != nullptr) cudaFree(probe_dev_);
    release_model();
    release_llama();
    if (nccl_) {
      for (ncclComm_t c : nccl_->groups) {
        if (c != nullptr) ncclCommDestroy(c);
      }
      if (nccl_->world != nullptr) ncclCommDestroy(nccl_->world);
    }
  }

  std::string name() const override { return "cuda"; }
  bool native_collectives() const override { return nccl_.has_value(); }
  void bind_thread(Rank) override { HPZ_CUDA(cudaSetDevice(device_)); }

  void collective(Rank r, StreamId s, GroupId group, const PlanOp& po) override {
    using K = NativeCollective::Kind;
    if (aborted_) throw HangError("HANG: NCCL was aborted after an earlier hang");
    const NativeCollective& n = po.native;
    ncclComm_t comm = nccl_->groups.at(static_cast<std::size_t>(group));
    const ncclDataType_t type = eb_ == 2 ? ncclHalf : ncclFloat;
    cudaStream_t st = stream(r, s);
    switch (n.kind) {
      case K::kAllGather:
        HPZ_NCCL(ncclAllGather(at(n.send), at(n.recv), n.count, type, comm, st));
        break;
      case K::kReduceScatter:
        HPZ_NCCL(ncclReduceScatter(at(n.send), at(n.recv), n.count, type, ncclSum, comm, st));
        break;
      case K::kAllReduce:
        HPZ_NCCL(ncclAllReduce(at(n.send), at(n.recv), n.count, type, ncclSum, comm, st));
        break;
      case K::kBroadcast:  // only the root's send buffer is read
        HPZ_NCCL(ncclBroadcast(n.send_n > 0 ? at(n.send) : at(n.recv), at(n.recv), n.count, type,
                               n.root, comm, st));
        break;
      case K::kNone: {
        // run_real refuses complete collectives without a native form, so this one lacks
        // members: NCCL would wait for them forever.
        const Instance& inst = plan_->instances.at(static_cast<std::size_t>(po.instance));
        throw HangError(fmt::format(
            "HANG: rank {} reached a collective on group {} that only {} of its {} ranks issue "
            "(missing ranks: {}); NCCL would wait forever, so it was not issued",
            r, group, inst.members.size(), inst.group_ranks.size(), missing_ranks(inst)));
      }
    }
    run_actions(r, s, n.after);
  }
  int own_streams() const override { return 1; }  // fill_: every allocation's fill

  void begin_run(const Schedule& schedule, const Plan& plan) override {
    HPZ_CUDA(cudaSetDevice(device_));
    plan_ = &plan;
    eb_ = plan.element_bytes;
    if (ranks_.size() != plan.ranks.size()) ranks_ = std::deque<RankState>(plan.ranks.size());
    for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
      if (!mine(r)) continue;
      RankState& rs = ranks_[r];
      const RankSchedule& sched = schedule.ranks[r];
      while (rs.streams.size() < sched.streams.size()) {
        cudaStream_t s{};
        HPZ_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        rs.streams.push_back(s);
      }
      EventId max_event = -1;
      std::size_t collectives = 0;
      for (const Op& o : sched.ops) {
        max_event = std::max(max_event, o.event);
        collectives += is_collective(o.kind) ? 1 : 0;
      }
      grow(rs.ir_events, static_cast<std::size_t>(max_event + 1), false);
      grow(rs.marks, 2 * collectives, false);
      grow(rs.t_begin, sched.ops.size(), true);
      grow(rs.t_end, sched.ops.size(), true);
      rs.timed.assign(sched.ops.size(), false);
      rs.next_mark = 0;
      // Blocks still held from the last run go back to their free lists.
      for (std::size_t k = 0; k < rs.live_slot.size(); ++k) release_live(static_cast<Rank>(r), k);
      rs.slot_block.assign(plan.ranks[r].slots.size(), -1);
      rs.live.clear();
      rs.live_slot.clear();
    }
    if (real_compute_ && !gemm_) make_gemm_runner(plan);
    if (plan.model) prepare_model(plan);
    if (plan.llama) prepare_llama(plan);
    if (probe_dev_ != nullptr) HPZ_CUDA(cudaFree(probe_dev_));
    probe_dev_ = nullptr;
    if (plan.probes > 0) {
      HPZ_CUDA(cudaMalloc(&probe_dev_, plan.probes * 2 * sizeof(unsigned long long)));
      HPZ_CUDA(cudaMemset(probe_dev_, 0, plan.probes * 2 * sizeof(unsigned long long)));
    }
    HPZ_CUDA(cudaDeviceSynchronize());
    HPZ_CUDA(cudaEventRecord(origin_event_, fill_));
    HPZ_CUDA(cudaEventSynchronize(origin_event_));
    origin_host_s_ = now_s();
  }

  void alloc(Rank r, StreamId, SlotId slot, Fill fill) override {
    if (!plan_->ranks[r].slots[slot].touched) return;  // no action reads or writes it
    RankState& rs = ranks_[r];
    std::lock_guard lock(rs.mu);
    bool fresh = false;
    void* p = acquire(r, slot, fresh);
    // A stale fill keeps what a reused block held; a fresh block holds NaN, the same every run.
    if (fill == Fill::kStale && !fresh) return;
    fill_async(p, slot_bytes(r, slot), fill == Fill::kZero ? 0 : 0xff);
    order_after_fill(rs);
  }

  void free(Rank r, StreamId, SlotId slot) override {
    RankState& rs = ranks_[r];
    std::lock_guard lock(rs.mu);
    const int k = rs.slot_block[slot];
    if (k < 0) return;
    release_live(r, static_cast<std::size_t>(k));
  }

  void spin(Rank r, StreamId s, double seconds) override {
    HPZ_CUDA(kernels::spin(static_cast<std::uint64_t>(seconds * 1e9), stream(r, s)));
  }

  void model(Rank r, StreamId s, const ModelOp& m) override {
    using MK = ModelOp::Kind;
    cudaStream_t st = stream(r, s);
    float* scratch = model_scratch_.at(r).at(static_cast<std::size_t>(s));
    const auto f = [&](const Range& x) {
      return x.n > 0 ? static_cast<float*>(at(x.at)) : nullptr;
    };
    switch (m.kind) {
      case MK::kNone:
        return;
      case MK::kGradNorm: {
        std::vector<const float*> parts;
        std::vector<std::uint64_t> n;
        for (const Range& x : m.parts) {
          if (x.n == 0) continue;
          parts.push_back(f(x));
          n.push_back(x.n);
        }
        HPZ_CUDA(model::sum_squares(parts.data(), n.data(), static_cast<int>(parts.size()),
                                    f(m.out), reinterpret_cast<double*>(scratch), st));
        return;
      }
      case MK::kAdam:
        if (m.fresh_state) {
          HPZ_CUDA(cudaMemsetAsync(f(m.m), 0, m.m.n * sizeof(float), st));
          HPZ_CUDA(cudaMemsetAsync(f(m.v), 0, m.v.n * sizeof(float), st));
        }
        HPZ_CUDA(model::adam(f(m.out), f(m.x), f(m.grad), f(m.norm), f(m.m), f(m.v), m.x.n, m.scale,
                             m.step, st));
        return;
      case MK::kLlamaForward:
      case MK::kLlamaLoss:
      case MK::kLlamaBackward:
        return llama(r, s, m);
    }
  }

  std::vector<float> losses(Rank r) override {
    if (!mine(r)) return {};
    const RankPlan& rp = plan_->ranks[r];
    std::vector<float> out(rp.loss_steps.size());
    if (!out.empty()) {
      HPZ_CUDA(cudaMemcpy(out.data(), at({r, rp.losses, 0}), out.size() * sizeof(float),
                          cudaMemcpyDeviceToHost));
    }
    return out;
  }

  void gemm(Rank r, StreamId s, const GemmShape& g) override {
    gemm_->run(static_cast<int>(r), stream(r, s), g);
  }

  void run_actions(Rank r, StreamId s, const std::vector<Action>& actions) override {
    using K = Action::Kind;
    cudaStream_t st = stream(r, s);
    for (const Action& a : actions) {
      if (a.n == 0) continue;
      void* dst = at(a.dst);
      switch (a.kind) {
        case K::kCopy:
          HPZ_CUDA(cudaMemcpyAsync(dst, at(a.src[0]), a.n * static_cast<std::uint64_t>(eb_),
                                   cudaMemcpyDeviceToDevice, st));
          break;
        case K::kSum: {
          std::vector<const void*> src;
          for (const Loc& l : a.src) src.push_back(at(l));
          HPZ_CUDA(kernels::sum(dst, src.data(), static_cast<int>(src.size()), a.n, eb_, st));
          break;
        }
        case K::kPattern:
          HPZ_CUDA(kernels::pattern(dst, a.n, eb_, a.salt, a.unit, a.pattern_base, st));
          break;
        case K::kConst:
          HPZ_CUDA(cudaMemcpyAsync(dst, consts_dev_.at(a.const_id) + a.pattern_base,
                                   a.n * sizeof(float), cudaMemcpyDeviceToDevice, st));
          break;
        case K::kZero:
          HPZ_CUDA(cudaMemsetAsync(dst, 0, a.n * static_cast<std::uint64_t>(eb_), st));
          break;
        case K::kScale:
        case K::kAxpy:
          HPZ_CUDA(kernels::scale(dst, at(a.src[0]), a.scale, a.kind == K::kAxpy, a.n, eb_, st));
          break;
        case K::kWiden: {
          // Element j of every `repeat` from the source, one strided copy per j.
          const std::size_t eb = static_cast<std::size_t>(eb_), k = a.repeat;
          for (std::size_t j = 0; j < k && j < a.n; ++j) {
            HPZ_CUDA(cudaMemcpy2DAsync(static_cast<char*>(dst) + j * eb, k * eb, at(a.src[0]), eb,
                                       eb, (a.n - j + k - 1) / k, cudaMemcpyDeviceToDevice, st));
          }
          break;
        }
      }
    }
  }

  void record_event(Rank r, StreamId s, EventId e) override {
    HPZ_CUDA(cudaEventRecord(ranks_[r].ir_events.at(static_cast<std::size_t>(e)), stream(r, s)));
  }
  void wait_event(Rank r, StreamId s, EventId e) override {
    HPZ_CUDA(
        cudaStreamWaitEvent(stream(r, s), ranks_[r].ir_events.at(static_cast<std::size_t>(e)), 0));
  }

  Mark mark(Rank r, StreamId s) override {
    RankState& rs = ranks_[r];
    const std::uint32_t k = rs.next_mark++;
    HPZ_CUDA(cudaEventRecord(rs.marks.at(k), stream(r, s)));
    return {r, k};
  }
  void wait_mark(Rank r, StreamId s, Mark m) override {
    HPZ_CUDA(cudaStreamWaitEvent(stream(r, s), ranks_[m.rank].marks.at(m.index), 0));
  }

  void host_sync(Rank r, StreamId s, double timeout_s) override {
    RankState& rs = ranks_[r];
    const double deadline = now_s() + timeout_s;
    if (s != kHostStream) return drain(stream(r, s), deadline, r);
    for (cudaStream_t st : rs.streams) drain(st, deadline, r);
  }

  void op_begin(Rank r, StreamId s, std::uint32_t op) override {
    HPZ_CUDA(cudaEventRecord(ranks_[r].t_begin[op], stream(r, s)));
  }
  void op_end(Rank r, StreamId s, std::uint32_t op) override {
    HPZ_CUDA(cudaEventRecord(ranks_[r].t_end[op], stream(r, s)));
    ranks_[r].timed[op] = true;
  }

  void probe(Rank r, StreamId s, std::uint64_t index, Loc loc, std::uint64_t n) override {
    HPZ_CUDA(kernels::probe(at(loc), n, eb_, probe_dev_ + 2 * index, stream(r, s)));
  }

  void end_run(double timeout_s, double origin_s, Timeline& timeline,
               std::vector<ProbeValue>& probes,
               std::vector<std::vector<std::vector<std::uint8_t>>>& weights) override {
    const double deadline = now_s() + timeout_s;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      for (cudaStream_t st : ranks_[r].streams) drain(st, deadline, static_cast<Rank>(r));
    }
    if (aborted_) throw HangError("HANG: NCCL was aborted after an earlier hang");
    HPZ_CUDA(cudaDeviceSynchronize());
    if (!llama_error_.empty()) throw std::runtime_error(llama_error_);
    const double shift = origin_host_s_ - origin_s;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      RankState& rs = ranks_[r];
      for (std::size_t i = 0; i < rs.timed.size(); ++i) {
        if (!rs.timed[i]) continue;
        float b = 0, e = 0;
        HPZ_CUDA(cudaEventElapsedTime(&b, origin_event_, rs.t_begin[i]));
        HPZ_CUDA(cudaEventElapsedTime(&e, origin_event_, rs.t_end[i]));
        timeline.ranks[r][i].start_s = shift + b / 1e3;
        timeline.ranks[r][i].end_s = shift + e / 1e3;
      }
    }
    std::vector<unsigned long long> raw(plan_->probes * 2);
    if (!raw.empty()) {
      HPZ_CUDA(
          cudaMemcpy(raw.data(), probe_dev_, raw.size() * sizeof(raw[0]), cudaMemcpyDeviceToHost));
    }
    probes.assign(plan_->probes, {});
    for (std::size_t k = 0; k < probes.size(); ++k) probes[k] = {raw[2 * k], raw[2 * k + 1]};
    weights.assign(plan_->ranks.size(), {});
    for (std::size_t r = 0; r < plan_->ranks.size(); ++r) {
      if (!mine(r)) continue;
      const RankPlan& rp = plan_->ranks[r];
      for (std::size_t u = 0; u < rp.weights.size(); ++u) {
        std::vector<std::uint8_t> host(rp.weight_n[u] * static_cast<std::uint64_t>(eb_));
        if (!host.empty()) {
          HPZ_CUDA(cudaMemcpy(host.data(), at(rp.weights[u]), host.size(), cudaMemcpyDeviceToHost));
        }
        weights[r].push_back(std::move(host));
      }
    }
  }

 private:
  struct Block {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    std::vector<cudaEvent_t> done;  // one per stream of the rank, recorded at the free
  };
  struct RankState {
    std::vector<cudaStream_t> streams;
    cudaEvent_t filled = nullptr;  // the fill stream's last fill for this rank
    std::vector<cudaEvent_t> ir_events, marks, t_begin, t_end, spare;
    std::vector<bool> timed;
    std::uint32_t next_mark = 0;
    std::map<BufferId, std::vector<Block>> free;  // per buffer id, oldest first
    std::vector<Block> live;                      // blocks held by open lifetimes
    std::vector<SlotId> live_slot;                // live[k] belongs to this slot
    std::vector<int> slot_block;                  // slot -> index into live, or -1
    std::mutex mu;
  };

  /** The GEMMs of every layer kernel this process runs: scratch for the largest, each shape
   *  loaded and run once before any run is timed. */
  void make_gemm_runner(const Plan& plan) {
    const std::vector<GemmShape> shapes = gemm_shapes(plan, nccl_ ? nccl_->rank : -1);
    if (shapes.empty()) return;
    gemm_ = std::make_unique<GemmRunner>(static_cast<int>(plan.ranks.size()), max_shape(shapes),
                                         plan.element_bytes);
    gemm_->warm_up(shapes);
  }

  /** The model math's inputs on the device (initial weights) and a scratch area per (rank,
   *  stream), so that two streams of a rank never share one. Allocated anew for every run,
   *  before the clock starts. */
  void prepare_model(const Plan& plan) {
    release_model();
    for (const std::vector<float>& c : plan.consts) consts_dev_.push_back(upload(c));
    model_scratch_floats_ = model::scratch_floats();
    model_scratch_.assign(ranks_.size(), {});
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (!mine(r)) continue;
      for (std::size_t k = 0; k < ranks_[r].streams.size(); ++k) {
        void* p = nullptr;
        HPZ_CUDA(cudaMalloc(&p, model_scratch_floats_ * sizeof(float)));
        model_scratch_[r].push_back(static_cast<float*>(p));
      }
    }
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    void* p = nullptr;
    HPZ_CUDA(cudaMalloc(&p, std::max<std::size_t>(v.size(), 1) * sizeof(T)));
    if (!v.empty()) HPZ_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T*>(p);
  }
  void release_model() {
    for (float* p : consts_dev_) cudaFree(p);
    for (auto& per_rank : model_scratch_) {
      for (float* p : per_rank) cudaFree(p);
    }
    consts_dev_.clear();
    model_scratch_.clear();
  }

  // --- transformers' Llama on DeepSpeed's own schedules (Plan::llama) ---
  //
  // The math is the host's (llama_model.hpp: the numeric replay's own functions), run in
  // stream order: the weights the kernel reads are copied to pinned memory on its stream, a
  // host function (cudaLaunchHostFunc) runs the module part once the stream reaches it, and
  // what it writes (a loss value, the rank's slice of a gradient) is copied back on the same
  // stream. So the kernel reads the device's bytes when its stream gets there, as a CUDA kernel
  // would, and a race that corrupts the gathered weights corrupts what it computes; the stream
  // is held for the host's time instead of a GPU kernel's.

  /** One host call: its rank, op and pinned buffers. */
  struct LlamaCall {
    CudaBackend* self = nullptr;
    Rank rank = 0;
    const ModelOp* op = nullptr;
    float* in = nullptr;
    float* out = nullptr;
  };

  void prepare_llama(const Plan& plan) {
    release_llama();
    std::uint64_t floats = 1;
    for (const RankPlan& rp : plan.ranks) {
      for (const PlanOp& po : rp.ops) {
        for (const ModelOp& m : po.models) floats = std::max({floats, m.w.n, m.grad.n});
      }
    }
    llama_floats_ = floats;
    llama_pinned_.assign(ranks_.size(), {});
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (!mine(r)) continue;
      for (std::size_t k = 0; k < ranks_[r].streams.size(); ++k) {
        void* p = nullptr;  // in, then out: one pair per (rank, stream), reused in stream order
        HPZ_CUDA(cudaMallocHost(&p, 2 * floats * sizeof(float)));
        llama_pinned_[r].push_back(static_cast<float*>(p));
      }
    }
    llama_passes_.clear();
    for (std::size_t r = 0; r < ranks_.size(); ++r) llama_passes_.emplace_back(*plan.llama);
    llama_at_.assign(ranks_.size(), {-2, 0});
    llama_mu_ = std::deque<std::mutex>(ranks_.size());
    llama_calls_.clear();
    llama_error_.clear();
  }
  void release_llama() {
    for (auto& per_rank : llama_pinned_) {
      for (float* p : per_rank) cudaFreeHost(p);
    }
    llama_pinned_.clear();
  }

  void llama(Rank r, StreamId s, const ModelOp& m) {
    using MK = ModelOp::Kind;
    cudaStream_t st = stream(r, s);
    float* in = llama_pinned_.at(r).at(static_cast<std::size_t>(s));
    float* out = in + llama_floats_;
    if (m.w.n > 0) {
      HPZ_CUDA(cudaMemcpyAsync(in, at(m.w.at), m.w.n * sizeof(float), cudaMemcpyDeviceToHost, st));
    }
    LlamaCall* call = nullptr;
    {
      std::lock_guard lock(llama_calls_mu_);
      llama_calls_.push_back({this, r, &m, in, out});
      call = &llama_calls_.back();
    }
    HPZ_CUDA(cudaLaunchHostFunc(st, &CudaBackend::run_llama, call));
    if (m.kind == MK::kLlamaLoss) {
      HPZ_CUDA(cudaMemcpyAsync(at(m.loss), out, sizeof(float), cudaMemcpyHostToDevice, st));
    } else if (m.kind == MK::kLlamaBackward && m.grad.n > 0) {
      HPZ_CUDA(cudaMemcpyAsync(at(m.grad.at), out, m.grad.n * sizeof(float), cudaMemcpyHostToDevice,
                               st));
    }
  }

  /** The host function: no CUDA call may be made here. An error (a schedule that runs the
   *  Llama's modules out of order) is kept for end_run, and the call writes NaN. */
  static void CUDART_CB run_llama(void* p) {
    const LlamaCall& c = *static_cast<LlamaCall*>(p);
    try {
      c.self->llama_host(c);
    } catch (const std::exception& e) {
      std::lock_guard lock(c.self->llama_calls_mu_);
      if (c.self->llama_error_.empty()) c.self->llama_error_ = e.what();
      std::fill(c.out, c.out + c.self->llama_floats_, std::numeric_limits<float>::quiet_NaN());
    }
  }

  void llama_host(const LlamaCall& c) {
    using MK = ModelOp::Kind;
    const ModelOp& m = *c.op;
    std::lock_guard lock(llama_mu_[c.rank]);
    replay::LlamaPass& pass = llama_passes_[c.rank];
    const std::pair<std::int32_t, std::int32_t> now{m.step, m.micro};
    if (llama_at_[c.rank] != now) {
      llama_at_[c.rank] = now;
      pass.begin(plan_->tokens.at(static_cast<std::size_t>(m.tokens)));
    }
    const replay::LlamaParam param{static_cast<replay::LlamaPart>(m.part), m.layer};
    const std::span<const float> w(c.in, m.w.n);
    switch (m.kind) {
      case MK::kLlamaForward:
        pass.forward(param, w, m.recompute);
        return;
      case MK::kLlamaLoss:
        c.out[0] = pass.loss();
        return;
      case MK::kLlamaBackward: {
        const std::vector<float> dw = pass.backward(param, w);
        const std::uint64_t n = std::min<std::uint64_t>(
            m.grad.n, dw.size() - std::min<std::uint64_t>(dw.size(), m.grad_first));
        std::copy_n(dw.begin() + static_cast<std::ptrdiff_t>(m.grad_first), n, c.out);
        return;
      }
      default:
        return;
    }
  }

  /** Whether this process runs rank r (all of them unless one process per rank). */
  bool mine(std::size_t r) const { return !nccl_ || static_cast<std::size_t>(nccl_->rank) == r; }

  /** NCCL's asynchronous errors; after a timeout, aborts every communicator so that kernels
   *  stuck waiting for a peer give the GPU back. */
  void poll_nccl(bool timed_out) {
    if (!nccl_ || aborted_) return;
    for (ncclComm_t c : nccl_->groups) {
      if (c == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      HPZ_NCCL(ncclCommGetAsyncError(c, &async));
      if (async != ncclSuccess && async != ncclInProgress) check_nccl(async, "NCCL async error");
    }
    if (!timed_out) return;
    aborted_ = true;
    for (ncclComm_t& c : nccl_->groups) {
      if (c != nullptr) ncclCommAbort(c);
      c = nullptr;
    }
    ncclCommAbort(nccl_->world);
    nccl_->world = nullptr;
  }

  static void grow(std::vector<cudaEvent_t>& pool, std::size_t n, bool timing) {
    while (pool.size() < n) pool.push_back(new_event(timing));
  }

  cudaStream_t stream(Rank r, StreamId s) {
    return ranks_[r].streams.at(static_cast<std::size_t>(s));
  }

  std::size_t slot_bytes(Rank r, SlotId slot) const {
    return std::max<std::size_t>(
        plan_->ranks[r].slots[slot].elements * static_cast<std::size_t>(eb_), 16);
  }

  /** A block for `slot` (caller holds the rank's lock): the oldest free block of the same
   *  buffer whose streams have all passed its free, else a new one (`fresh`), allocated in
   *  fill-stream order: the caller fills it before any stream uses it. */
  void* acquire(Rank r, SlotId slot, bool& fresh) {
    RankState& rs = ranks_[r];
    const std::size_t bytes = slot_bytes(r, slot);
    const BufferId buffer = plan_->ranks[r].slots[slot].buffer;
    auto& list = rs.free[buffer];
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (it->bytes < bytes || !idle(*it)) continue;
      Block blk = std::move(*it);
      list.erase(it);
      for (cudaEvent_t e : blk.done) rs.spare.push_back(e);
      blk.done.clear();
      return keep(rs, slot, std::move(blk));
    }
    // Stream-ordered on the fill stream: a new block must not wait for the device (a
    // cudaMalloc / cudaDeviceSynchronize would drain every stream and hide the race).
    Block blk;
    blk.bytes = bytes;
    {
      std::lock_guard fill_lock(fill_mu_);
      HPZ_CUDA(cudaMallocAsync(&blk.ptr, bytes, fill_));
    }
    fresh = true;
    return keep(rs, slot, std::move(blk));
  }

  static bool idle(const Block& blk) {
    for (cudaEvent_t e : blk.done) {
      const cudaError_t q = cudaEventQuery(e);
      if (q == cudaErrorNotReady) return false;
      check(q, "cudaEventQuery");
    }
    return true;
  }

  void* keep(RankState& rs, SlotId slot, Block blk) {
    void* p = blk.ptr;
    rs.slot_block[slot] = static_cast<int>(rs.live.size());
    rs.live.push_back(std::move(blk));
    rs.live_slot.push_back(slot);
    return p;
  }

  /** Sets every byte of [p, p + bytes) to `byte` on the fill stream. */
  void fill_async(void* p, std::size_t bytes, int byte) {
    std::lock_guard fill_lock(fill_mu_);
    HPZ_CUDA(cudaMemsetAsync(p, byte, bytes, fill_));
  }

  /** Makes every stream of the rank wait for the fill stream's work so far (caller holds the
   *  rank's lock). */
  void order_after_fill(RankState& rs) {
    if (rs.filled == nullptr) rs.filled = new_event(false);
    {
      std::lock_guard fill_lock(fill_mu_);
      HPZ_CUDA(cudaEventRecord(rs.filled, fill_));
    }
    for (cudaStream_t st : rs.streams) HPZ_CUDA(cudaStreamWaitEvent(st, rs.filled, 0));
  }

  /** Ends the lifetime held in live[k]: events on every stream, back to the free list. */
  void release_live(Rank r, std::size_t k) {
    RankState& rs = ranks_[r];
    Block blk = std::move(rs.live[k]);
    if (blk.ptr == nullptr) return;
    rs.live[k] = Block{};
    for (cudaStream_t st : rs.streams) {
      if (rs.spare.empty()) rs.spare.push_back(new_event(false));
      cudaEvent_t e = rs.spare.back();
      rs.spare.pop_back();
      HPZ_CUDA(cudaEventRecord(e, st));
      blk.done.push_back(e);
    }
    const SlotId slot = rs.live_slot[k];
    if (slot < rs.slot_block.size()) rs.slot_block[slot] = -1;
    const BufferId buffer = plan_->ranks[r].slots[slot].buffer;
    rs.free[buffer].push_back(std::move(blk));
  }

  /** Device address of a location; a slot never allocated (a buffer used before any kAlloc,
   *  or the staging slot) gets its block on first use. */
  void* at(const Loc& l) {
    RankState& rs = ranks_[l.rank];
    std::lock_guard lock(rs.mu);
    int k = rs.slot_block.at(l.slot);
    if (k < 0) {
      // Rare (the staging slot, a buffer read before any kAlloc), and possibly another rank's
      // thread asking: the block is made ready before any stream can use it.
      bool fresh = false;
      void* p = acquire(l.rank, l.slot, fresh);
      if (fresh) {
        fill_async(p, slot_bytes(l.rank, l.slot), 0xff);
        std::lock_guard fill_lock(fill_mu_);
        HPZ_CUDA(cudaStreamSynchronize(fill_));
      }
      k = rs.slot_block[l.slot];
    }
    return static_cast<std::uint8_t*>(rs.live[static_cast<std::size_t>(k)].ptr) +
           l.elem * static_cast<std::uint64_t>(eb_);
  }

  void drain(cudaStream_t st, double deadline, Rank r) {
    wait_until([st] { return cudaStreamQuery(st); }, "cudaStreamQuery", deadline, r,
               "a stream to drain");
  }

  /** cudaEventSynchronize with the backend's timeout: polls, so that a hang is reported. */
  void host_event_sync(Rank r, EventId e, double timeout_s) override {
    cudaEvent_t ev = ranks_[r].ir_events.at(static_cast<std::size_t>(e));
    wait_until([ev] { return cudaEventQuery(ev); }, "cudaEventQuery", now_s() + timeout_s, r,
               fmt::format("event {}", e));
  }

  /** Polls `query` (cudaStreamQuery or cudaEventQuery) until it succeeds; HangError naming
   *  `what` the host waited for once `deadline` passes. */
  template <class Query>
  void wait_until(Query query, const char* api, double deadline, Rank r, const std::string& what) {
    for (int polls = 0;; ++polls) {
      const cudaError_t q = query();
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check(q, api);
      if (polls % 1000 == 999) poll_nccl(false);
      if (now_s() > deadline) {
        poll_nccl(true);
        throw HangError(
            fmt::format("HANG: rank {}'s host waited past the timeout for {}", r, what));
      }
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  int device_ = 0;
  std::optional<NcclRank> nccl_;  // one process per rank: this process's rank and communicators
  bool aborted_ = false;          // NCCL aborted after a hang: no further run can use it
  bool real_compute_ = false;     // layer kernels as cuBLAS GEMMs
  std::unique_ptr<GemmRunner> gemm_;
  const Plan* plan_ = nullptr;
  int eb_ = 2;
  std::deque<RankState> ranks_;
  cudaStream_t fill_ = nullptr;  // fills and new blocks of every rank; the timing origin
  std::mutex fill_mu_;
  cudaEvent_t origin_event_ = nullptr;
  double origin_host_s_ = 0;
  unsigned long long* probe_dev_ = nullptr;
  // The model's real math (Plan::model).
  std::vector<float*> consts_dev_;
  std::vector<std::vector<float*>> model_scratch_;  // [rank][stream]
  std::size_t model_scratch_floats_ = 0;
  // transformers' Llama (Plan::llama): pinned in/out buffers per (rank, stream), each rank's
  // pass, the host calls of the run (stable addresses) and the first error of one.
  std::vector<std::vector<float*>> llama_pinned_;
  std::uint64_t llama_floats_ = 0;
  std::vector<replay::LlamaPass> llama_passes_;
  std::vector<std::pair<std::int32_t, std::int32_t>> llama_at_;
  std::deque<std::mutex> llama_mu_;
  std::deque<LlamaCall> llama_calls_;
  std::mutex llama_calls_mu_;
  std::string llama_error_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(bool real_compute) {
  claim_hardware_queues();
  return std::make_unique<CudaBackend>(0, std::nullopt, real_compute);
}

std::unique_ptr<Backend> make_nccl_backend(const Schedule& schedule, Rank rank, int device,
                                           Store& store, bool real_compute) {
  claim_hardware_queues();
  HPZ_CUDA(cudaSetDevice(device));
  ncclUniqueId id{};
  if (store.rank() == 0) {
    HPZ_NCCL(ncclGetUniqueId(&id));
    store.set("nccl/id", std::string(reinterpret_cast<const char*>(&id), sizeof id),
              store.world() - 1);
  } else {
    const std::string bytes = store.get("nccl/id");
    if (bytes.size() != sizeof id) throw std::runtime_error("store: a malformed NCCL unique id");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  // NCCL's init blocks until every rank has joined: meet at the store first, where waiting
  // has a deadline, so that a rank that never starts is reported instead of waited for.
  store.barrier("nccl/init");
  NcclRank n;
  n.rank = rank;
  HPZ_NCCL(ncclCommInitRank(&n.world, store.world(), id, store.rank()));
  // One communicator per IR group, in the IR's group order on every rank (a split is a
  // collective of the world communicator); member order is rank order, as in the plan.
  for (std::size_t g = 0; g < schedule.groups.size(); ++g) {
    const auto& ranks = schedule.groups[g].ranks;
    const bool member = std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
    ncclComm_t c = nullptr;
    HPZ_NCCL(ncclCommSplit(n.world, member ? static_cast<int>(g) : NCCL_SPLIT_NOCOLOR,
                           static_cast<int>(rank), &c, nullptr));
    n.groups.push_back(member ? c : nullptr);
  }
  return std::make_unique<CudaBackend>(device, std::move(n), real_compute);
}

}  // namespace hpz::real
