#include "sim/replay/taint_domain.hpp"

#include <algorithm>
#include <set>

namespace hpz::replay {
namespace {

constexpr Tag kVersionMask = 0x3fffffffu;

Tag make_tag(Health h, std::uint32_t version = 0) {
  return (static_cast<Tag>(h) << 30) | (version & kVersionMask);
}
Health health(Tag t) {
  return static_cast<Health>(t >> 30);
}
std::uint32_t version(Tag t) {
  return t & kVersionMask;
}
Health worse(Health a, Health b) {
  return a > b ? a : b;
}

/** A run list of one tag. */
TaintDomain::Chunk uniform(std::uint64_t n, Tag t) {
  return n == 0 ? TaintDomain::Chunk{} : TaintDomain::Chunk{{n, t}};
}

void push_run(TaintDomain::Chunk& c, std::uint64_t len, Tag t) {
  if (len == 0) return;
  if (!c.empty() && c.back().tag == t) {
    c.back().len += len;
  } else {
    c.push_back({len, t});
  }
}

}  // namespace

TaintDomain::TaintDomain(const ReplayInputs& in, const Schedule& s) : in_(in), s_(s), roles_(s) {
  act_.assign(s.ranks.size(), Health::kGood);
  bufs_.resize(s.ranks.size());
  version_.resize(s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    bufs_[r].resize(s.ranks[r].buffers.size());
    version_[r].assign(s.units.size(), 0);
  }
}

std::uint64_t TaintDomain::size(const Chunk& c) {
  std::uint64_t n = 0;
  for (const TagRun& run : c) n += run.len;
  return n;
}

TaintDomain::Chunk TaintDomain::slice(const Chunk& c, std::uint64_t off, std::uint64_t n) {
  Chunk out;
  std::uint64_t pos = 0;
  const std::uint64_t end = n == kWhole ? kWhole : off + n;
  for (const TagRun& run : c) {
    const std::uint64_t lo = std::max(pos, off), hi = std::min(pos + run.len, end);
    if (hi > lo) push_run(out, hi - lo, run.tag);
    pos += run.len;
    if (pos >= end) break;
  }
  return out;
}

void TaintDomain::splice(Chunk& dst, std::uint64_t off, const Chunk& src) {
  const std::uint64_t n = size(src), have = size(dst);
  Chunk out = slice(dst, 0, off);
  if (have < off) push_run(out, off - have, make_tag(Health::kWrong));
  for (const TagRun& run : src) push_run(out, run.len, run.tag);
  if (have > off + n) {
    for (const TagRun& run : slice(dst, off + n, have - off - n)) push_run(out, run.len, run.tag);
  }
  dst = std::move(out);
}

// The sum of two values is as bad as the worse of them; good weights keep acc's version.
void TaintDomain::accumulate(Chunk& acc, const Chunk& x) {
  Chunk out;
  std::size_t i = 0, j = 0;
  std::uint64_t left_i = acc.empty() ? 0 : acc[0].len, left_j = x.empty() ? 0 : x[0].len;
  while (i < acc.size() && j < x.size()) {
    const std::uint64_t n = std::min(left_i, left_j);
    const Tag a = acc[i].tag, b = x[j].tag;
    push_run(out, n, health(b) > health(a) ? b : a);
    left_i -= n;
    left_j -= n;
    if (left_i == 0 && ++i < acc.size()) left_i = acc[i].len;
    if (left_j == 0 && ++j < x.size()) left_j = x[j].len;
  }
  for (; i < acc.size(); ++i, left_i = i < acc.size() ? acc[i].len : 0)
    push_run(out, left_i, acc[i].tag);
  for (; j < x.size(); ++j, left_j = j < x.size() ? x[j].len : 0) push_run(out, left_j, x[j].tag);
  acc = std::move(out);
}

TaintDomain::Chunk TaintDomain::widen(const Chunk& c, std::uint64_t k) {
  Chunk out = c;
  for (TagRun& run : out) run.len *= k;
  return out;
}

void TaintDomain::quantize_int8(Chunk& c, std::uint64_t groups) {
  const std::uint64_t n = size(c);
  if (groups == 0 || n % groups != 0) return;
  const std::uint64_t g = n / groups;
  Chunk out;
  for (std::uint64_t k = 0; k < groups; ++k) {
    const Chunk part = slice(c, k * g, g);
    const bool all_nan = std::all_of(part.begin(), part.end(), [](const TagRun& run) {
      return health(run.tag) == Health::kNan;
    });
    for (const TagRun& run : part) {
      const bool zeroed = !all_nan && health(run.tag) == Health::kNan;
      push_run(out, run.len, zeroed ? make_tag(Health::kWrong) : run.tag);
    }
  }
  c = std::move(out);
}

TaintDomain::Chunk TaintDomain::read(Rank r, BufferId b, std::uint64_t begin,
                                     std::uint64_t n) const {
  Chunk out = b < bufs_[r].size() ? slice(bufs_[r][b], begin, n) : Chunk{};
  const std::uint64_t have = size(out);
  if (n != kWhole && have < n) push_run(out, n - have, make_tag(Health::kWrong));
  return out;
}

void TaintDomain::write(Rank r, BufferId b, std::uint64_t begin, const Chunk& c) {
  splice(slot(r, b), begin, c);
}

TaintDomain::Chunk& TaintDomain::slot(Rank r, BufferId b) {
  if (bufs_[r].size() <= b) bufs_[r].resize(b + 1);
  return bufs_[r][b];
}

void TaintDomain::alloc(Rank r, BufferId b, BufferId previous, Fill fill, std::uint64_t elements) {
  Chunk& c = slot(r, b);
  if (fill == Fill::kStale) c = slot(r, previous);
  if (fill == Fill::kStale) {
    const std::uint64_t have = size(c);
    if (have < elements) push_run(c, elements - have, make_tag(Health::kWrong));
    return;
  }
  c = uniform(elements, make_tag(fill == Fill::kNan ? Health::kNan : Health::kWrong));
}

TaintDomain::Chunk TaintDomain::checkpoint(Rank r, UnitId u, std::uint64_t, std::uint64_t n) {
  // A load gives the unit new weights: everything gathered before it is stale from now on.
  const std::uint32_t v = ++version_[r][u];
  return uniform(n, make_tag(Health::kGood, v));
}

// The worst of everything the op reads; parameter data of another version than the rank's
// current weights of the unit is wrong (stale).
Health TaintDomain::worst_input(Rank r, const Op& op, const ReadFn<Chunk>& read) const {
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  Health h = Health::kGood;
  for (const Access& a : s_.accesses_of(r, op)) {
    if (a.mode != AccessMode::kRead) continue;
    const BufferRole role = s_.ranks[r].buffers[a.buffer].role;
    const bool whole = role == BufferRole::kActivation || role == BufferRole::kScratch;
    const Chunk c = whole ? read(a.buffer, 0, kWhole) : read(a.buffer, a.offset / dt, a.bytes / dt);
    const bool weights = role == BufferRole::kFull;
    const UnitId u = s_.unit_of(r, op, a);
    for (const TagRun& run : c) {
      Health x = health(run.tag);
      if (weights && x == Health::kGood && u != kNoUnit && version(run.tag) != version_[r][u]) {
        x = Health::kWrong;
      }
      h = worse(h, x);
    }
  }
  return h;
}

std::vector<Write<TaintDomain::Chunk>> TaintDomain::kernel(Rank r, const Op& op,
                                                           const ReadFn<Chunk>& read) {
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  if (op.purpose == Purpose::kOptimizerStep) return optimizer(r, op, read);
  Health h = worst_input(r, op, read);
  h = flow(r, op, h);
  if (op.purpose == Purpose::kParamInit) h = Health::kGood;
  // A finite but wrong gradient norm only rescales updates through clipping: not followed.
  if (op.purpose == Purpose::kGradNorm && h == Health::kWrong) h = Health::kGood;
  const Tag tag = make_tag(h, op.unit == kNoUnit ? 0 : version_[r][op.unit]);
  std::vector<Write<Chunk>> out;
  for (const Access& a : s_.accesses_of(r, op)) {
    if (a.mode != AccessMode::kWrite) continue;
    out.push_back({a.buffer, a.offset / dt, uniform(a.bytes / dt, tag)});
  }
  return out;
}

Health TaintDomain::flow(Rank r, const Op& op, Health own) {
  switch (op.purpose) {
    case Purpose::kForwardCompute:
    case Purpose::kRecomputeForward:
    case Purpose::kLossGradient:
    case Purpose::kBackwardCompute:
      break;
    default:
      return own;
  }
  const KernelRoles k = roles_.kernel(r, op);
  if (k.new_micro) act_[r] = Health::kGood;  // a new micro-step starts from the batch's tokens
  // The loss is what the forward computed, when the micro-step's backward starts
  // (module_roles.hpp).
  if (k.loss) loss_[op.step] = worse(loss_[op.step], act_[r]);
  act_[r] = worse(act_[r], own);
  return act_[r];
}

// Each primary element is as bad as its old value, its gradient and (for NaN) the global norm;
// good elements become the new version.
std::vector<Write<TaintDomain::Chunk>> TaintDomain::optimizer(Rank r, const Op& op,
                                                              const ReadFn<Chunk>& read) {
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  const Access *grad = nullptr, *primary = nullptr, *out = nullptr;
  Health norm = Health::kGood;
  for (const Access& a : s_.accesses_of(r, op)) {
    const BufferRole role = s_.ranks[r].buffers[a.buffer].role;
    if (a.mode == AccessMode::kWrite) {
      out = &a;
    } else if (role == BufferRole::kGradShard) {
      grad = &a;
    } else if (role == BufferRole::kPrimary) {
      primary = &a;
    } else {
      for (const TagRun& run : read(a.buffer, 0, kWhole)) norm = worse(norm, health(run.tag));
    }
  }
  if (out == nullptr || primary == nullptr) return {};
  Chunk p = read(primary->buffer, primary->offset / dt, primary->bytes / dt);
  // The DeepSpeed builder's step reads no gradient bytes: the engine hands it the unit's, at the
  // primary's offsets (as update_primary).
  accumulate(p, grad != nullptr ? read(grad->buffer, grad->offset / dt, grad->bytes / dt)
                                : read(kReducedGrad, primary->offset / dt, primary->bytes / dt));
  return {{out->buffer, out->offset / dt, updated(r, op, p, norm)}};
}

std::vector<Write<TaintDomain::Chunk>> TaintDomain::update_primary(Rank r, const Op& op,
                                                                   const Access& primary,
                                                                   const ReadFn<Chunk>& read) {
  if (op.unit == kNoUnit) return {};
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  Chunk p = read(primary.buffer, primary.offset / dt, primary.bytes / dt);
  accumulate(p, read(kReducedGrad, primary.offset / dt, primary.bytes / dt));
  return {{primary.buffer, primary.offset / dt, updated(r, op, p, Health::kGood)}};
}

TaintDomain::Chunk TaintDomain::updated(Rank r, const Op& op, const Chunk& p, Health norm) {
  const std::uint32_t v = ++version_[r][op.unit];
  Chunk next;
  std::uint64_t bad = 0;
  for (const TagRun& run : p) {
    Health h = health(run.tag);
    if (norm == Health::kNan) h = Health::kNan;
    if (h != Health::kGood) bad += run.len;
    push_run(next, run.len, make_tag(h, h == Health::kGood ? v : 0));
  }
  bad_[op.step][{r, op.unit}] = bad;
  return next;
}

std::vector<StepRecord> TaintDomain::steps() const {
  std::vector<StepRecord> out(static_cast<std::size_t>(std::max(in_.steps, 0)));
  for (std::size_t k = 0; k < out.size(); ++k) {
    const int step = static_cast<int>(k);
    if (auto it = loss_.find(step); it != loss_.end()) out[k].loss_health = it->second;
    const auto it = bad_.find(step);
    if (it == bad_.end()) continue;
    std::set<Rank> ranks;
    std::set<std::string> units;
    for (const auto& [key, n] : it->second) {
      if (n == 0) continue;
      out[k].bad_elements += n;
      ranks.insert(key.first);
      units.insert(s_.units[key.second].name);
    }
    out[k].bad_ranks.assign(ranks.begin(), ranks.end());
    out[k].bad_units.assign(units.begin(), units.end());
  }
  return out;
}

}  // namespace hpz::replay
