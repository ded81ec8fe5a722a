// The host backends. Every buffer lifetime (slot) has its own storage, so a lifetime never sees
// another's data except through `fill = stale`, which copies what the previous lifetime of the
// same buffer held when the new one was allocated.
//
// - Eager: every call takes effect when it is made, so each rank's ops run one after another in
//   issue order: a race-free execution, the reference.
// - Lazy: stream work is queued per stream and runs only when the host must wait for it (a
//   host sync, the end of the run), in the order a GPU whose compute stream is backed up would
//   run it: whatever any other stream can run goes first, S0's work only when nothing else can
//   move. Event and marker waits hold a stream until what they wait for has run. No clock is
//   involved, so the outcome depends only on the ordering the schedule leaves open: a race the
//   IR allows is taken the bad way.
#include <fmt/format.h>

#include <deque>
#include <functional>
#include <mutex>
#include <unordered_set>

#include "real/backend.hpp"
#include "real/elements.hpp"
#include "real/executor.hpp"
#include "real/store.hpp"
#include "sim/replay/llama_model.hpp"

namespace hpz::real {
namespace {

class HostBackend : public Backend {
 public:
  explicit HostBackend(bool lazy) : lazy_(lazy) {}
  /** One rank of a run with one process per rank (eager only). */
  HostBackend(Rank rank, Store& store) : lazy_(false), only_(rank), dist_(&store) {}

  std::string name() const override { return lazy_ ? "host-lazy" : "host"; }
  bool native_collectives() const override { return dist_ != nullptr; }

  void collective(Rank r, StreamId, GroupId, const PlanOp& po) override {
    const Instance& inst = plan_->instances[static_cast<std::size_t>(po.instance)];
    const auto member = static_cast<std::size_t>(po.member);
    if (inst.members.size() < inst.group_ranks.size()) return missing_member(r, inst);
    const auto key = [&](std::size_t m) {
      return fmt::format("run{}/c{}/m{}", run_, po.instance, m);
    };
    // A send span in a slot no action touches has no memory here (and nobody reads it): it is
    // neither sent nor received, the same on every process (the plan is).
    if (po.native.send_n > 0 && !store_[r][po.native.send.slot].empty()) {
      const Loc& l = po.native.send;
      const auto eb = static_cast<std::size_t>(eb_);
      const auto* p = store_[r][l.slot].data() + l.elem * eb;
      dist_->set(key(member), std::string(reinterpret_cast<const char*>(p), po.native.send_n * eb),
                 static_cast<int>(inst.members.size()) - 1);
    }
    // Each member's send span into this process's copy of that member's slot: the plan's
    // actions then read it where they would read the member's own memory.
    for (std::size_t k = 0; k < inst.members.size(); ++k) {
      const auto [mr, mi] = inst.members[k];
      const NativeCollective& theirs = plan_->ranks[mr].ops[mi].native;
      if (k == member || theirs.send_n == 0 || store_[mr][theirs.send.slot].empty()) continue;
      const std::string bytes = dist_->get(key(k));
      auto& slot = store_[mr][theirs.send.slot];
      const std::size_t at = theirs.send.elem * static_cast<std::size_t>(eb_);
      std::copy_n(bytes.begin(), std::min(bytes.size(), slot.size() - at),
                  slot.begin() + static_cast<std::ptrdiff_t>(at));
    }
    for (const Action& a : po.actions) run(a);
    for (const Action& a : po.post_actions) run(a);
  }

  /** A collective some member never issues: NCCL would wait forever, so this waits for a
   *  store key nobody sets, which ends in HangError after the store's timeout. */
  [[noreturn]] void missing_member(Rank r, const Instance& inst) {
    try {
      dist_->get(fmt::format("run{}/never", run_));
    } catch (const HangError&) {
    }
    throw HangError(fmt::format(
        "HANG: rank {} waited in a collective on group {} that only {} of its {} ranks issue "
        "(missing ranks: {})",
        r, inst.group, inst.members.size(), inst.group_ranks.size(), missing_ranks(inst)));
  }

  void begin_run(const Schedule& schedule, const Plan& plan) override {
    ++run_;
    plan_ = &plan;
    eb_ = plan.element_bytes;
    const std::size_t n = plan.ranks.size();
    store_.assign(n, {});
    prev_slot_.assign(n, {});
    queues_.assign(n, {});
    mark_count_.assign(n, 0);
    times_.assign(n, {});
    issued_.clear();
    done_.clear();
    for (std::size_t r = 0; r < n; ++r) {
      const std::vector<SlotInfo>& slots = plan.ranks[r].slots;
      std::vector<SlotId> last(schedule.ranks[r].buffers.size(), kNoSlot);
      for (std::size_t k = 0; k < slots.size(); ++k) {
        // A slot no action, probe or weight read touches gets no memory (as on CUDA).
        store_[r].emplace_back(
            slots[k].touched ? slots[k].elements * static_cast<std::size_t>(eb_) : 0, 0xff);
        const BufferId b = slots[k].buffer;
        prev_slot_[r].push_back(b == kNoBuffer ? kNoSlot : last[b]);
        if (b != kNoBuffer) last[b] = static_cast<SlotId>(k);
      }
      queues_[r].resize(schedule.ranks[r].streams.size());
      times_[r].assign(schedule.ranks[r].ops.size(), {kNaN, kNaN});
    }
    probes_.assign(plan.probes, {});
    passes_.clear();
    if (plan.llama) passes_.assign(n, replay::LlamaPass(*plan.llama));
    pass_at_.assign(n, {-2, 0});
  }

  void alloc(Rank r, StreamId, SlotId slot, Fill fill) override {
    std::lock_guard lock(mu_);  // a host-side call: takes effect at issue in both modes
    auto& v = store_[r][slot];
    if (fill == Fill::kNan) std::fill(v.begin(), v.end(), std::uint8_t{0xff});
    if (fill == Fill::kZero) std::fill(v.begin(), v.end(), std::uint8_t{0});
    const SlotId prev = prev_slot_[r][slot];
    if (fill == Fill::kStale && prev != kNoSlot) {
      const auto& p = store_[r][prev];
      std::copy_n(p.begin(), std::min(p.size(), v.size()), v.begin());
    }
  }
  void free(Rank, StreamId, SlotId) override {}
  void spin(Rank, StreamId, double) override {}

  void run_actions(Rank r, StreamId s, const std::vector<Action>& actions) override {
    submit(r, s, [this, &actions] {
      for (const Action& a : actions) run(a);
    });
  }

  void model(Rank r, StreamId s, const ModelOp& m) override {
    submit(r, s, [this, r, &m] { run_model(r, m); });
  }

  std::vector<float> losses(Rank r) override {
    if (only_ >= 0 && only_ != static_cast<int>(r)) return {};
    const RankPlan& rp = plan_->ranks[r];
    return get({{r, rp.losses, 0}, rp.loss_steps.size()});
  }

  void record_event(Rank r, StreamId s, EventId e) override { record(r, s, key(r, false, e)); }
  void wait_event(Rank r, StreamId s, EventId e) override { wait(r, s, key(r, false, e)); }
  Mark mark(Rank r, StreamId s) override {
    const std::uint32_t k = mark_count_[r]++;
    record(r, s, key(r, true, static_cast<std::int64_t>(k)));
    return {r, k};
  }
  void wait_mark(Rank r, StreamId s, Mark m) override {
    wait(r, s, key(m.rank, true, static_cast<std::int64_t>(m.index)));
  }

  void host_sync(Rank r, StreamId s, double) override {
    if (!lazy_) return;
    std::lock_guard lock(mu_);
    run_until([&] {
      for (std::size_t k = 0; k < queues_[r].size(); ++k) {
        if ((s == kHostStream || static_cast<StreamId>(k) == s) && !queues_[r][k].empty())
          return false;
      }
      return true;
    });
  }

  void host_event_sync(Rank r, EventId e, double) override {
    if (!lazy_) return;
    std::lock_guard lock(mu_);
    const std::uint64_t k = key(r, false, e);
    if (issued_.count(k) == 0) return;  // never recorded: nothing to wait for (CUDA)
    run_until([&] { return done_.count(k) != 0; });
  }

  void op_begin(Rank r, StreamId s, std::uint32_t op) override {
    submit(r, s, [this, r, op] { times_[r][op].first = now_s(); });
  }
  void op_end(Rank r, StreamId s, std::uint32_t op) override {
    submit(r, s, [this, r, op] { times_[r][op].second = now_s(); });
  }

  void probe(Rank r, StreamId s, std::uint64_t index, Loc at, std::uint64_t n) override {
    submit(r, s, [this, r, index, at, n] {
      const std::uint8_t* base = store_[r][at.slot].data();
      ProbeValue pv;
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint64_t bits = 0;
        std::memcpy(&bits, base + (at.elem + i) * static_cast<std::uint64_t>(eb_),
                    static_cast<std::size_t>(eb_));
        pv.hash += bits * (2 * i + 1);
        pv.nans += is_nan_bits(base, at.elem + i, eb_) ? 1 : 0;
      }
      probes_[index] = pv;
    });
  }

  void end_run(double, double origin_s, Timeline& timeline, std::vector<ProbeValue>& probes,
               std::vector<std::vector<std::vector<std::uint8_t>>>& weights) override {
    {
      std::lock_guard lock(mu_);
      run_until([&] {
        for (const auto& rank : queues_) {
          for (const auto& q : rank) {
            if (!q.empty()) return false;
          }
        }
        return true;
      });
    }
    for (std::size_t r = 0; r < times_.size(); ++r) {
      for (std::size_t i = 0; i < times_[r].size(); ++i) {
        if (std::isnan(times_[r][i].first)) continue;
        timeline.ranks[r][i].start_s = times_[r][i].first - origin_s;
        timeline.ranks[r][i].end_s = times_[r][i].second - origin_s;
      }
    }
    probes = probes_;
    weights.assign(plan_->ranks.size(), {});
    for (std::size_t r = 0; r < plan_->ranks.size(); ++r) {
      if (only_ >= 0 && static_cast<std::size_t>(only_) != r) continue;  // another process's
      const RankPlan& rp = plan_->ranks[r];
      for (std::size_t u = 0; u < rp.weights.size(); ++u) {
        const std::uint8_t* p = store_[r][rp.weights[u].slot].data() +
                                rp.weights[u].elem * static_cast<std::uint64_t>(eb_);
        weights[r].emplace_back(p, p + rp.weight_n[u] * static_cast<std::uint64_t>(eb_));
      }
    }
  }

 private:
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  static constexpr SlotId kNoSlot = 0xffffffffu;

  /** A queued piece of stream work: run `fn`, or mark `key` reached, or wait for `key`. */
  struct Item {
    enum class Kind : std::uint8_t { kRun, kRecord, kWait } kind = Kind::kRun;
    std::function<void()> fn;
    std::uint64_t key = 0;
  };

  static std::uint64_t key(Rank r, bool is_mark, std::int64_t id) {
    return (static_cast<std::uint64_t>(r) << 33) | (static_cast<std::uint64_t>(is_mark) << 32) |
           static_cast<std::uint32_t>(id);
  }

  void submit(Rank r, StreamId s, std::function<void()> fn) {
    if (!lazy_) return fn();
    std::lock_guard lock(mu_);
    queues_[r][static_cast<std::size_t>(s)].push_back({Item::Kind::kRun, std::move(fn), 0});
  }
  void record(Rank r, StreamId s, std::uint64_t k) {
    if (!lazy_) return;
    std::lock_guard lock(mu_);
    issued_.insert(k);
    done_.erase(k);  // a re-record: waits issued from now on wait for the new position
    queues_[r][static_cast<std::size_t>(s)].push_back({Item::Kind::kRecord, {}, k});
  }
  void wait(Rank r, StreamId s, std::uint64_t k) {
    if (!lazy_) return;
    std::lock_guard lock(mu_);
    if (issued_.count(k) == 0) return;  // waiting for an event never recorded: no-op (CUDA)
    queues_[r][static_cast<std::size_t>(s)].push_back({Item::Kind::kWait, {}, k});
  }

  /** Runs one queued item that can run: streams other than S0 first (ranks in order), S0 only
   *  when none of them can. False when nothing can run. Caller holds mu_. */
  bool step() {
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& rank : queues_) {
        for (std::size_t s = 0; s < rank.size(); ++s) {
          if ((s == 0) != (pass == 1) || rank[s].empty()) continue;
          Item& it = rank[s].front();
          if (it.kind == Item::Kind::kWait && done_.count(it.key) == 0) continue;
          Item item = std::move(it);
          rank[s].pop_front();
          if (item.kind == Item::Kind::kRun) item.fn();
          if (item.kind == Item::Kind::kRecord) done_.insert(item.key);
          return true;
        }
      }
    }
    return false;
  }

  template <class Done>
  void run_until(Done done) {
    while (!done()) {
      if (!step()) {
        throw HangError(
            "HANG: no stream can make progress (every queued stream op waits for an event that "
            "is never reached)");
      }
    }
  }

  /** The floats of a range (model math: fp32 storage). */
  std::vector<float> get(const Range& x) const {
    std::vector<float> v(x.n);
    if (x.n > 0) {
      std::memcpy(v.data(), store_[x.at.rank][x.at.slot].data() + x.at.elem * sizeof(float),
                  x.n * sizeof(float));
    }
    return v;
  }
  /** Writes at most `n` floats of `v` at `at`. */
  void put(const Loc& at, const std::vector<float>& v, std::uint64_t n) {
    std::memcpy(store_[at.rank][at.slot].data() + at.elem * sizeof(float), v.data(),
                std::min<std::uint64_t>(n, v.size()) * sizeof(float));
  }

  /** A kernel of the model's math, with the numeric replay's own functions. */
  void run_model(Rank r, const ModelOp& m) {
    using MK = ModelOp::Kind;
    static const std::vector<int> kNone;
    const std::vector<int>& tokens =
        m.tokens >= 0 ? plan_->tokens[static_cast<std::size_t>(m.tokens)] : kNone;
    switch (m.kind) {
      case MK::kNone:
        return;
      case MK::kGradNorm: {
        double ss = 0;  // NumericDomain::grad_norm's order: parts in turn, in double
        for (const Range& x : m.parts) {
          for (float g : get(x)) ss += static_cast<double>(g) * g;
        }
        return put(m.out.at, {static_cast<float>(ss)}, 1);
      }
      case MK::kAdam: {
        std::vector<float> p = get(m.x);
        std::vector<float> mom = m.fresh_state ? std::vector<float>(m.m.n, 0.0F) : get(m.m);
        std::vector<float> vel = m.fresh_state ? std::vector<float>(m.v.n, 0.0F) : get(m.v);
        const float norm_sq = m.norm.n > 0 ? get(m.norm)[0] : 0.0F;
        replay::adam_step(p, get(m.grad), mom, vel, norm_sq, m.scale, m.step, m.max_grad_norm);
        put(m.m.at, mom, m.m.n);
        put(m.v.at, vel, m.v.n);
        return put(m.out.at, p, m.out.n);
      }
      case MK::kLlamaForward:
        return pass(r, m, tokens).forward(llama(m), get(m.w), m.recompute);
      case MK::kLlamaLoss:
        return put(m.loss, {pass(r, m, tokens).loss()}, 1);
      case MK::kLlamaBackward: {
        const std::vector<float> dw = pass(r, m, tokens).backward(llama(m), get(m.w));
        const auto first = static_cast<std::ptrdiff_t>(m.grad_first);
        return put(m.grad.at,
                   {dw.begin() + first, dw.begin() + first + static_cast<std::ptrdiff_t>(m.grad.n)},
                   m.grad.n);
      }
    }
  }

  static replay::LlamaParam llama(const ModelOp& m) {
    return {static_cast<replay::LlamaPart>(m.part), m.layer};
  }
  /** The rank's Llama pass, begun anew on another (step, micro-step) than its last kernel's
   *  (NumericDomain::pass). */
  replay::LlamaPass& pass(Rank r, const ModelOp& m, const std::vector<int>& tokens) {
    const std::pair<std::int32_t, std::int32_t> now{m.step, m.micro};
    if (pass_at_[r] != now) {
      pass_at_[r] = now;
      passes_[r].begin(tokens);
    }
    return passes_[r];
  }

  void run(const Action& a) {
    using K = Action::Kind;
    std::uint8_t* dst = store_[a.dst.rank][a.dst.slot].data();
    const auto eb = static_cast<std::uint64_t>(eb_);
    for (std::uint64_t i = 0; i < a.n; ++i) {
      const std::uint64_t d = a.dst.elem + i;
      auto src = [&](std::size_t k) {
        return load(store_[a.src[k].rank][a.src[k].slot].data(), a.src[k].elem + i, eb_);
      };
      switch (a.kind) {
        case K::kCopy:
          std::memcpy(dst + d * eb,
                      store_[a.src[0].rank][a.src[0].slot].data() + (a.src[0].elem + i) * eb,
                      static_cast<std::size_t>(eb_));
          break;
        case K::kSum: {
          // As the CUDA kernel does: at most 16 sources a pass, rounded to storage in between.
          float acc = src(0);
          for (std::size_t k = 1; k < a.src.size(); ++k) {
            if (k % 16 == 0) {
              store(dst, d, eb_, acc);
              acc = load(dst, d, eb_);
            }
            acc += src(k);
          }
          store(dst, d, eb_, acc);
          break;
        }
        case K::kPattern:
          store(dst, d, eb_, pattern_value(a.salt, a.unit, a.pattern_base + i));
          break;
        case K::kConst:
          store(dst, d, eb_, plan_->consts[a.const_id][a.pattern_base + i]);
          break;
        case K::kZero:
          store(dst, d, eb_, 0.0F);
          break;
        case K::kScale:
          store(dst, d, eb_, src(0) * a.scale);
          break;
        case K::kAxpy:
          store(dst, d, eb_, load(dst, d, eb_) + src(0) * a.scale);
          break;
        case K::kWiden:
          std::memcpy(
              dst + d * eb,
              store_[a.src[0].rank][a.src[0].slot].data() + (a.src[0].elem + i / a.repeat) * eb,
              static_cast<std::size_t>(eb_));
          break;
      }
    }
  }

  bool lazy_;
  int only_ = -1;          // one process per rank: the rank this process runs
  Store* dist_ = nullptr;  // ... and the store its collectives go through
  int run_ = 0;            // runs so far: keeps one run's store keys from another's
  const Plan* plan_ = nullptr;
  int eb_ = 2;
  std::mutex mu_;
  std::vector<std::vector<std::vector<std::uint8_t>>> store_;  // [rank][slot]
  std::vector<std::vector<SlotId>> prev_slot_;  // [rank][slot]: previous lifetime, same buffer
  std::vector<std::vector<std::deque<Item>>> queues_;  // [rank][stream] (lazy)
  std::vector<std::uint32_t> mark_count_;
  std::unordered_set<std::uint64_t> issued_, done_;
  std::vector<std::vector<std::pair<double, double>>> times_;  // [rank][op]
  std::vector<ProbeValue> probes_;
  std::vector<replay::LlamaPass> passes_;                       // [rank] (Plan::llama)
  std::vector<std::pair<std::int32_t, std::int32_t>> pass_at_;  // [rank]: (step, micro)
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(bool lazy) {
  return std::make_unique<HostBackend>(lazy);
}

std::unique_ptr<Backend> make_host_rank_backend(Rank rank, Store& store) {
  return std::make_unique<HostBackend>(rank, store);
}

}  // namespace hpz::real
