// The numeric value domain: every rank's buffers as fp32 arrays, kernels as the tiny model's
// real forward, backward, loss, gradient norm and Adam step (tiny_model.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "sim/replay/data_engine.hpp"
#include "sim/replay/replay.hpp"
#include "sim/replay/tiny_model.hpp"

namespace hpz::replay {

class NumericDomain {
 public:
  using Chunk = std::vector<float>;

  NumericDomain(const Scenario& sc, const Schedule& s);

  static std::uint64_t size(const Chunk& c) { return c.size(); }
  static Chunk slice(const Chunk& c, std::uint64_t off, std::uint64_t n);
  static void splice(Chunk& dst, std::uint64_t off, const Chunk& src);
  static void accumulate(Chunk& acc, const Chunk& x);

  Chunk read(Rank r, BufferId b, std::uint64_t begin, std::uint64_t n) const;
  void write(Rank r, BufferId b, std::uint64_t begin, const Chunk& c);
  void alloc(Rank r, BufferId b, BufferId previous, Fill fill, std::uint64_t elements);
  Chunk checkpoint(Rank r, UnitId u, std::uint64_t first, std::uint64_t n) const;
  std::vector<Write<Chunk>> kernel(Rank r, const Op& op, const ReadFn<Chunk>& read);

  /** Per step: loss (mean over ranks and micro-steps) and primary-weights hash. */
  std::vector<StepRecord> steps() const;

 private:
  /** Adam moments of one rank's primary shard of one unit. */
  struct AdamState {
    std::vector<float> m, v;
  };

  const Access* access(Rank r, const Op& op, AccessMode m, BufferRole role, int unit_sel) const;
  std::vector<Write<Chunk>> init_kernel(Rank r, const Op& op);
  std::vector<Write<Chunk>> forward(Rank r, const Op& op, const ReadFn<Chunk>& read);
  std::vector<Write<Chunk>> backward(Rank r, const Op& op, const ReadFn<Chunk>& read);
  std::vector<Write<Chunk>> loss(Rank r, const Op& op, const ReadFn<Chunk>& read);
  std::vector<Write<Chunk>> grad_norm(Rank r, const Op& op, const ReadFn<Chunk>& read);
  std::vector<Write<Chunk>> adam(Rank r, const Op& op, const ReadFn<Chunk>& read);
  Chunk whole(const ReadFn<Chunk>& read, const Access* a) const;
  Chunk part(const ReadFn<Chunk>& read, const Access& a) const;
  std::vector<int> tokens(Rank r, const Op& op) const;

  /** The storage of slot b of rank r, created on first use. */
  Chunk& slot(Rank r, BufferId b);

  const Scenario& sc_;
  const Schedule& s_;
  TinyDims dims_;
  std::vector<std::vector<Chunk>> bufs_;  // [rank][buffer]
  std::map<std::pair<Rank, UnitId>, AdamState> adam_;
  std::map<int, std::pair<double, int>> loss_;  // step -> (sum, count)
  std::map<int, std::uint64_t> hash_;           // step -> xor of per-shard hashes
};

}  // namespace hpz::replay
