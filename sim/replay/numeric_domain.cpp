#include "sim/replay/numeric_domain.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace hpz::replay {
namespace {

std::uint64_t fnv(const std::vector<float>& v, std::uint64_t h) {
  for (float f : v) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace

NumericDomain::NumericDomain(const Scenario& sc, const Schedule& s) : sc_(sc), s_(s) {
  dims_ = {sc.training.seq_len * sc.training.micro_batch, sc.model.hidden, sc.model.ffn,
           sc.model.vocab};
  bufs_.resize(s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) bufs_[r].resize(s.ranks[r].buffers.size());
}

NumericDomain::Chunk NumericDomain::slice(const Chunk& c, std::uint64_t off, std::uint64_t n) {
  if (off >= c.size()) return {};
  const std::uint64_t m = std::min<std::uint64_t>(n, c.size() - off);
  return Chunk(c.begin() + static_cast<std::ptrdiff_t>(off),
               c.begin() + static_cast<std::ptrdiff_t>(off + m));
}

void NumericDomain::splice(Chunk& dst, std::uint64_t off, const Chunk& src) {
  if (dst.size() < off + src.size()) dst.resize(off + src.size(), 0.0f);
  std::copy(src.begin(), src.end(), dst.begin() + static_cast<std::ptrdiff_t>(off));
}

void NumericDomain::accumulate(Chunk& acc, const Chunk& x) {
  if (acc.size() < x.size()) acc.resize(x.size(), 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) acc[i] += x[i];
}

NumericDomain::Chunk NumericDomain::read(Rank r, BufferId b, std::uint64_t begin,
                                         std::uint64_t n) const {
  Chunk out = b < bufs_[r].size() ? slice(bufs_[r][b], begin, n) : Chunk{};
  // Never-written bytes of a read range read as zeros (a fresh cudaMalloc block).
  if (n != kWhole && out.size() < n) out.resize(n, 0.0f);
  return out;
}

void NumericDomain::write(Rank r, BufferId b, std::uint64_t begin, const Chunk& c) {
  splice(slot(r, b), begin, c);
}

NumericDomain::Chunk& NumericDomain::slot(Rank r, BufferId b) {
  if (bufs_[r].size() <= b) bufs_[r].resize(b + 1);
  return bufs_[r][b];
}

void NumericDomain::alloc(Rank r, BufferId b, BufferId previous, Fill fill,
                          std::uint64_t elements) {
  Chunk& c = slot(r, b);
  if (fill == Fill::kStale) c = slot(r, previous);
  switch (fill) {
    case Fill::kNan:
      c.assign(elements, std::numeric_limits<float>::quiet_NaN());
      break;
    case Fill::kZero:
      c.assign(elements, 0.0f);
      break;
    case Fill::kStale:
      c.resize(std::max<std::size_t>(c.size(), elements), 0.0f);
      break;
  }
}

NumericDomain::Chunk NumericDomain::checkpoint(Rank, UnitId u, std::uint64_t first,
                                               std::uint64_t n) const {
  const ParamUnit& pu = s_.units[u];
  const Chunk w =
      initial_weights(unit_fn(pu.name), dims_, pu.numel, sc_.run.seed + kCheckpointSeedOffset, u);
  return slice(w, first, n);
}

const Access* NumericDomain::access(Rank r, const Op& op, AccessMode m, BufferRole role,
                                    int unit_sel) const {
  for (const Access& a : s_.accesses_of(r, op)) {
    const Buffer& b = s_.ranks[r].buffers[a.buffer];
    if (a.mode != m || b.role != role) continue;
    // unit_sel: 0 any, 1 a unit's buffer, -1 a buffer of no unit (act.grad, act.recompute)
    if (unit_sel == 1 && b.unit == kNoUnit) continue;
    if (unit_sel == -1 && b.unit != kNoUnit) continue;
    return &a;
  }
  return nullptr;
}

NumericDomain::Chunk NumericDomain::whole(const ReadFn<Chunk>& read, const Access* a) const {
  return a == nullptr ? Chunk{} : read(a->buffer, 0, kWhole);
}

NumericDomain::Chunk NumericDomain::part(const ReadFn<Chunk>& read, const Access& a) const {
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  return read(a.buffer, a.offset / dt, a.bytes / dt);
}

std::vector<int> NumericDomain::tokens(Rank r, const Op& op) const {
  return synthetic_tokens(dims_, sc_.run.seed, r, op.step, op.micro_step);
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::kernel(Rank r, const Op& op,
                                                               const ReadFn<Chunk>& read) {
  switch (op.purpose) {
    case Purpose::kParamInit:
      return init_kernel(r, op);
    case Purpose::kForwardCompute:
    case Purpose::kRecomputeForward:
      return forward(r, op, read);
    case Purpose::kLossGradient:
      return loss(r, op, read);
    case Purpose::kBackwardCompute:
      return backward(r, op, read);
    case Purpose::kGradNorm:
      return grad_norm(r, op, read);
    case Purpose::kOptimizerStep:
      return adam(r, op, read);
    default:
      return {};
  }
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::init_kernel(Rank r, const Op& op) {
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  std::vector<Write<Chunk>> out;
  for (const Access& a : s_.accesses_of(r, op)) {
    if (a.mode != AccessMode::kWrite) continue;
    const BufferRole role = s_.ranks[r].buffers[a.buffer].role;
    if (role == BufferRole::kFull) {
      const ParamUnit& pu = s_.units[op.unit];
      const Chunk w = initial_weights(unit_fn(pu.name), dims_, pu.numel, sc_.run.seed, op.unit);
      out.push_back({a.buffer, a.offset / dt, slice(w, a.offset / dt, a.bytes / dt)});
    } else {
      out.push_back({a.buffer, a.offset / dt, Chunk(a.bytes / dt, 0.0f)});
    }
  }
  return out;
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::forward(Rank r, const Op& op,
                                                                const ReadFn<Chunk>& read) {
  const Access* w = access(r, op, AccessMode::kRead, BufferRole::kFull, 0);
  const Access* out = access(r, op, AccessMode::kWrite, BufferRole::kActivation, 0);
  assert(w != nullptr && out != nullptr);
  const Chunk params = part(read, *w);
  const Chunk x = whole(read, access(r, op, AccessMode::kRead, BufferRole::kActivation, 1));
  const UnitFn fn = unit_fn(s_.units[op.unit].name);
  return {{out->buffer, 0, unit_forward(fn, dims_, params, x, tokens(r, op))}};
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::loss(Rank r, const Op& op,
                                                             const ReadFn<Chunk>& read) {
  const Access* in = access(r, op, AccessMode::kRead, BufferRole::kActivation, 0);
  const Access* out = access(r, op, AccessMode::kWrite, BufferRole::kActivation, 0);
  assert(in != nullptr && out != nullptr);
  Chunk logits = whole(read, in);
  logits.resize(static_cast<std::size_t>(dims_.seq) * dims_.vocab, 0.0f);
  Chunk dlogits;
  const float l = next_token_loss(dims_, logits, tokens(r, op), dlogits);
  auto& [sum, count] = loss_[op.step];
  sum += static_cast<double>(l);
  ++count;
  return {{out->buffer, 0, std::move(dlogits)}};
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::backward(Rank r, const Op& op,
                                                                 const ReadFn<Chunk>& read) {
  const Access* w = access(r, op, AccessMode::kRead, BufferRole::kFull, 0);
  const Access* dy_in = access(r, op, AccessMode::kRead, BufferRole::kActivation, -1);
  const Access* dx_out = access(r, op, AccessMode::kWrite, BufferRole::kActivation, -1);
  const Access* g_out = access(r, op, AccessMode::kWrite, BufferRole::kGradFull, 0);
  assert(w != nullptr && dy_in != nullptr && dx_out != nullptr && g_out != nullptr);
  const ParamUnit& pu = s_.units[op.unit];
  const Chunk params = part(read, *w);
  const Chunk x = whole(read, access(r, op, AccessMode::kRead, BufferRole::kActivation, 1));
  const Chunk dy = whole(read, dy_in);
  Chunk dw(pu.numel, 0.0f);
  Chunk dx = unit_backward(unit_fn(pu.name), dims_, params, x, tokens(r, op), dy, dw);
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  return {{dx_out->buffer, 0, std::move(dx)},
          {g_out->buffer, g_out->offset / dt, slice(dw, g_out->offset / dt, g_out->bytes / dt)}};
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::grad_norm(Rank r, const Op& op,
                                                                  const ReadFn<Chunk>& read) {
  double ss = 0;
  BufferId out = kNoBuffer;
  for (const Access& a : s_.accesses_of(r, op)) {
    if (a.mode == AccessMode::kWrite) {
      out = a.buffer;
      continue;
    }
    for (float g : part(read, a)) ss += static_cast<double>(g) * g;
  }
  if (out == kNoBuffer) return {};
  return {{out, 0, Chunk{static_cast<float>(ss)}}};
}

// Adam on the fp32 primary shard (the master weights), gradients averaged over ranks and
// micro-steps and clipped to a global norm of 1 (adam_step).
std::vector<Write<NumericDomain::Chunk>> NumericDomain::adam(Rank r, const Op& op,
                                                             const ReadFn<Chunk>& read) {
  const Access* g = access(r, op, AccessMode::kRead, BufferRole::kGradShard, 0);
  const Access* norm = access(r, op, AccessMode::kRead, BufferRole::kScratch, 0);
  const Access* p_in = access(r, op, AccessMode::kRead, BufferRole::kPrimary, 0);
  const Access* p_out = access(r, op, AccessMode::kWrite, BufferRole::kPrimary, 0);
  if (g == nullptr || p_in == nullptr || p_out == nullptr) return {};
  const Chunk grad = part(read, *g);
  Chunk p = part(read, *p_in);
  const float scale = 1.0f / static_cast<float>(s_.world_size * sc_.training.grad_accum);
  const Chunk nsq = norm == nullptr ? Chunk{0.0f} : read(norm->buffer, 0, 1);
  AdamState& st = adam_[{r, op.unit}];
  st.m.resize(p.size(), 0.0f);
  st.v.resize(p.size(), 0.0f);
  adam_step(p, grad, st.m, st.v, nsq.empty() ? 0.0f : nsq[0], scale, op.step);
  const std::uint64_t key =
      (static_cast<std::uint64_t>(r) << 32) ^ static_cast<std::uint64_t>(op.unit);
  hash_[op.step] ^= fnv(p, 0xcbf29ce484222325ull ^ (key * 0x9e3779b97f4a7c15ull));
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  return {{p_out->buffer, p_out->offset / dt, std::move(p)}};
}

std::vector<StepRecord> NumericDomain::steps() const {
  std::vector<StepRecord> out(static_cast<std::size_t>(std::max(sc_.run.steps, 0)));
  for (std::size_t k = 0; k < out.size(); ++k) {
    const auto it = loss_.find(static_cast<int>(k));
    const double l = it == loss_.end() || it->second.second == 0
                         ? std::numeric_limits<double>::quiet_NaN()
                         : it->second.first / it->second.second;
    out[k].loss = l;
    out[k].loss_health = std::isfinite(l) ? Health::kGood : Health::kNan;
    const auto h = hash_.find(static_cast<int>(k));
    out[k].weights_hash = h == hash_.end() ? 0 : h->second;
  }
  return out;
}

}  // namespace hpz::replay
