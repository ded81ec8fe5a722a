// The host reference backend: every call takes effect when it is made, so each rank's ops run
// one after another in issue order and the result is what a race-free execution gives. Buffers
// are per buffer id (a new lifetime reuses the previous one's storage, which is what
// `fill = stale` means in the IR).
#include <chrono>
#include <cstring>
#include <mutex>

#include "real/backend.hpp"
#include "real/elements.hpp"
#include "real/executor.hpp"

namespace hpz::real {
namespace {

class HostBackend : public Backend {
 public:
  std::string name() const override { return "host"; }

  void begin_run(const Schedule& schedule, const Plan& plan) override {
    plan_ = &plan;
    eb_ = plan.element_bytes;
    if (store_.size() != plan.ranks.size()) {
      store_.assign(plan.ranks.size(), {});
      for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
        store_[r].resize(schedule.ranks[r].buffers.size() + 1);  // + staging
        for (const SlotInfo& s : plan.ranks[r].slots) {
          auto& v = storage(static_cast<Rank>(r), s.buffer);
          v.resize(std::max<std::size_t>(v.size(), s.elements * static_cast<std::size_t>(eb_)),
                   0xff);
        }
      }
    }
    times_.assign(plan.ranks.size(), {});
    for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
      times_[r].assign(schedule.ranks[r].ops.size(), {kNaN, kNaN});
    }
    probes_.assign(plan.probes, {});
  }

  void alloc(Rank r, StreamId, SlotId slot, Fill fill) override {
    auto& v = storage(r, plan_->ranks[r].slots[slot].buffer);
    if (fill == Fill::kNan) std::memset(v.data(), 0xff, v.size());
    if (fill == Fill::kZero) std::memset(v.data(), 0, v.size());
  }
  void free(Rank, StreamId, SlotId) override {}
  void spin(Rank, StreamId, double) override {}

  void run_actions(Rank, StreamId, const std::vector<Action>& actions) override {
    for (const Action& a : actions) run(a);
  }

  void record_event(Rank, StreamId, EventId) override {}
  void wait_event(Rank, StreamId, EventId) override {}
  Mark mark(Rank r, StreamId) override { return {r, 0}; }
  void wait_mark(Rank, StreamId, Mark) override {}
  void host_sync(Rank, StreamId, double) override {}

  void op_begin(Rank r, StreamId, std::uint32_t op) override { times_[r][op].first = now_s(); }
  void op_end(Rank r, StreamId, std::uint32_t op) override { times_[r][op].second = now_s(); }

  void probe(Rank r, StreamId, std::uint64_t index, Loc at, std::uint64_t n) override {
    const std::uint8_t* base = ptr(r, at.slot);
    ProbeValue pv;
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, base + (at.elem + i) * static_cast<std::uint64_t>(eb_),
                  static_cast<std::size_t>(eb_));
      pv.hash += bits * (2 * i + 1);
      pv.nans += is_nan_bits(base, at.elem + i, eb_) ? 1 : 0;
    }
    probes_[index] = pv;
  }

  void end_run(double, double origin_s, Timeline& timeline, std::vector<ProbeValue>& probes,
               std::vector<std::vector<std::vector<std::uint8_t>>>& weights) override {
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
      const RankPlan& rp = plan_->ranks[r];
      for (std::size_t u = 0; u < rp.weights.size(); ++u) {
        const std::uint8_t* p = ptr(static_cast<Rank>(r), rp.weights[u].slot) +
                                rp.weights[u].elem * static_cast<std::uint64_t>(eb_);
        weights[r].emplace_back(p, p + rp.weight_n[u] * static_cast<std::uint64_t>(eb_));
      }
    }
  }

 private:
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

  std::vector<std::uint8_t>& storage(Rank r, BufferId b) {
    return b == kNoBuffer ? store_[r].back() : store_[r][b];
  }
  std::uint8_t* ptr(Rank r, SlotId slot) {
    return storage(r, plan_->ranks[r].slots[slot].buffer).data();
  }

  void run(const Action& a) {
    using K = Action::Kind;
    std::uint8_t* dst = ptr(a.dst.rank, a.dst.slot);
    for (std::uint64_t i = 0; i < a.n; ++i) {
      const std::uint64_t d = a.dst.elem + i;
      auto src = [&](std::size_t k) {
        return load(ptr(a.src[k].rank, a.src[k].slot), a.src[k].elem + i, eb_);
      };
      switch (a.kind) {
        case K::kCopy:
          std::memcpy(dst + d * eb_, ptr(a.src[0].rank, a.src[0].slot) + (a.src[0].elem + i) * eb_,
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
        case K::kZero:
          store(dst, d, eb_, 0.0F);
          break;
        case K::kScale:
          store(dst, d, eb_, src(0) * a.scale);
          break;
        case K::kAxpy:
          store(dst, d, eb_, load(dst, d, eb_) + src(0) * a.scale);
          break;
      }
    }
  }

  const Plan* plan_ = nullptr;
  int eb_ = 2;
  std::vector<std::vector<std::vector<std::uint8_t>>> store_;  // [rank][buffer]
  std::vector<std::vector<std::pair<double, double>>> times_;  // [rank][op]
  std::vector<ProbeValue> probes_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() {
  return std::make_unique<HostBackend>();
}

}  // namespace hpz::real
