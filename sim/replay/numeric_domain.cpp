#include "sim/replay/numeric_domain.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "sim/error.hpp"
#include "sim/replay/fp32_math.hpp"

namespace hpz::replay {
namespace {

// Every NaN hashes as the one quiet NaN: which NaN's payload an operation propagates is the
// compiler's choice (an optimized build may swap the operands of a sum), and the digest must be
// the same in every build.
std::uint64_t fnv(const std::vector<float>& v, std::uint64_t h) {
  for (float f : v) {
    std::uint32_t bits = 0x7fc00000u;
    if (!std::isnan(f)) std::memcpy(&bits, &f, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  return h;
}

// SplitMix64's finalizer: every bit of the (rank, unit) key reaches the low bits of the shard's
// seed. (A plain multiply left the low 32 bits to the unit alone, so equal shards of an even
// number of ranks, all NaN say, cancelled there in the step's xor.)
std::uint64_t mix(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

LlamaDims llama_dims(const ReplayInputs& in) {
  return {in.seq_len, in.micro_batch, in.hidden, in.ffn,
          in.heads,   in.kv_heads,    in.vocab,  in.layers};
}

std::string llama_unsupported(const ReplayInputs& m, const Schedule& s) {
  if (!m.llama_shaped || m.family != "llama") {
    return fmt::format(
        "the numeric replay computes a plain Llama (no biases, untied embeddings, "
        "a gated MLP, heads x head_dim = hidden); this model ({}) is not one",
        m.family);
  }
  if (m.heads <= 0 || m.kv_heads <= 0 || m.heads % m.kv_heads != 0 || m.hidden % m.heads != 0 ||
      (m.hidden / m.heads) % 2 != 0) {
    return "the numeric replay needs heads dividing hidden into even head sizes and kv_heads "
           "dividing heads";
  }
  const LlamaDims d = llama_dims(m);
  // Every parameter once: the embedding, nine per layer, the final norm and lm_head (a schedule
  // read from a file may name none, and then computes no loss).
  if (const std::size_t want = 3 + 9 * static_cast<std::size_t>(d.layers); s.units.size() != want) {
    return fmt::format("the schedule has {} parameters; the scenario's Llama ({} layers) has {}",
                       s.units.size(), d.layers, want);
  }
  for (const ParamUnit& u : s.units) {
    const std::optional<LlamaParam> p = llama_param(u.name);
    if (!p) return fmt::format("parameter '{}' is none of a Llama's", u.name);
    if (p->layer >= d.layers || llama_numel(d, p->part) != u.numel) {
      return fmt::format(
          "parameter '{}' has {} elements; the scenario's Llama ({} layers, hidden "
          "{}) has {} there",
          u.name, u.numel, d.layers, d.hidden, p->layer >= d.layers ? 0 : llama_numel(d, p->part));
    }
  }
  return "";
}

NumericDomain::NumericDomain(const ReplayInputs& in, const Schedule& s)
    : in_(in), s_(s), llama_(llama_dims(in)), roles_(s) {
  if (const std::string why = llama_unsupported(in, s); !why.empty()) {
    throw InputError(in.path, "model", why);
  }
  micro_.resize(s.ranks.size());
  bufs_.resize(s.ranks.size());
  filled_.resize(s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    bufs_[r].resize(s.ranks[r].buffers.size());
    filled_[r].resize(s.ranks[r].buffers.size());
  }
  passes_.assign(s.ranks.size(), LlamaPass(llama_));
  pass_at_.assign(s.ranks.size(), {-2, 0});
}

std::vector<float> NumericDomain::unit_weights(UnitId u, std::uint64_t seed) const {
  return llama_initial_weights(llama_, param(u).part, seed, u);
}

LlamaParam NumericDomain::param(UnitId u) const {
  return *llama_param(s_.units[u].name);  // every unit checked by llama_unsupported
}

LlamaPass& NumericDomain::pass(Rank r, const Op& op) {
  const std::pair<std::int32_t, std::int32_t> now{op.step, op.micro_step};
  if (pass_at_[r] != now) {
    pass_at_[r] = now;
    passes_[r].begin(synthetic_tokens(llama_, in_.seed, r, op.step, op.micro_step));
  }
  return passes_[r];
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

NumericDomain::Chunk NumericDomain::widen(const Chunk& c, std::uint64_t k) {
  Chunk out;
  out.reserve(c.size() * k);
  for (float f : c) out.insert(out.end(), k, f);
  return out;
}

void NumericDomain::quantize_int8(Chunk& c, std::uint64_t groups) {
  fp32::int8_symmetric_round_trip(c, groups);
}

// An allocation is kept as its fill and length: only what is written is stored (a recording's
// gradient bucket is reduce_bucket_size elements, 5e8 by default, of which a small model
// writes a few thousand). Elements past what is stored read as the fill up to the length and as
// zeros beyond it (bytes never allocated: a fresh cudaMalloc block).
NumericDomain::Chunk NumericDomain::read(Rank r, BufferId b, std::uint64_t begin,
                                         std::uint64_t n) const {
  Chunk out = b < bufs_[r].size() ? slice(bufs_[r][b], begin, n) : Chunk{};
  const Filled f = b < filled_[r].size() ? filled_[r][b] : Filled{};
  const std::uint64_t at = begin + out.size();  // the first element not stored
  const std::uint64_t end = n == kWhole ? std::max(f.length, at) : begin + n;
  out.resize(std::clamp(f.length, at, end) - begin, f.fill);
  out.resize(end - begin, 0.0f);
  return out;
}

void NumericDomain::write(Rank r, BufferId b, std::uint64_t begin, const Chunk& c) {
  Chunk& d = slot(r, b);
  if (d.size() < begin) {
    const Filled f = filled_[r][b];
    d.resize(std::clamp<std::uint64_t>(f.length, d.size(), begin), f.fill);
    d.resize(begin, 0.0f);
  }
  splice(d, begin, c);
}

NumericDomain::Chunk& NumericDomain::slot(Rank r, BufferId b) {
  if (bufs_[r].size() <= b) bufs_[r].resize(b + 1);
  if (filled_[r].size() <= b) filled_[r].resize(b + 1);
  return bufs_[r][b];
}

void NumericDomain::alloc(Rank r, BufferId b, BufferId previous, Fill fill,
                          std::uint64_t elements) {
  Chunk& c = slot(r, b);
  switch (fill) {
    case Fill::kNan:
      c.clear();
      filled_[r][b] = {std::numeric_limits<float>::quiet_NaN(), elements};
      break;
    case Fill::kZero:
      c.clear();
      filled_[r][b] = {0.0f, elements};
      break;
    case Fill::kStale:  // the previous block's contents, zeros past them
      c = slot(r, previous);
      filled_[r][b] = filled_[r][previous];
      break;
  }
}

NumericDomain::Chunk NumericDomain::checkpoint(Rank, UnitId u, std::uint64_t first,
                                               std::uint64_t n) const {
  return slice(unit_weights(u, in_.seed + kCheckpointSeedOffset), first, n);
}

const Access* NumericDomain::access(Rank r, const Op& op, AccessMode m, BufferRole role) const {
  for (const Access& a : s_.accesses_of(r, op)) {
    if (a.mode == m && s_.ranks[r].buffers[a.buffer].role == role) return &a;
  }
  return nullptr;
}

NumericDomain::Chunk NumericDomain::part(const ReadFn<Chunk>& read, const Access& a) const {
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  return read(a.buffer, a.offset / dt, a.bytes / dt);
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::kernel(Rank r, const Op& op,
                                                               const ReadFn<Chunk>& read) {
  switch (op.purpose) {
    case Purpose::kParamInit:
      return init_kernel(r, op);
    case Purpose::kForwardCompute:
    case Purpose::kRecomputeForward:
      return module_forward(r, op, module_roles(r, op), read);
    case Purpose::kLossGradient:
    case Purpose::kBackwardCompute:
      return module_backward(r, op, module_roles(r, op), read);
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
      // One init kernel makes every parameter of a module (DeepSpeed builder): each its own.
      const Chunk w = unit_weights(s_.unit_of(r, op, a), in_.seed);
      out.push_back({a.buffer, a.offset / dt, slice(w, a.offset / dt, a.bytes / dt)});
    } else {
      out.push_back({a.buffer, a.offset / dt, Chunk(a.bytes / dt, 0.0f)});
    }
  }
  return out;
}

std::vector<Write<NumericDomain::Chunk>> NumericDomain::loss(Rank r, const Op& op) {
  auto& [sum, count] = loss_[op.step];
  sum += static_cast<double>(pass(r, op).loss());
  ++count;
  return {};
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
// micro-steps (adam_step). The step reads no gradient bytes: the engine hands it the unit's
// reduced gradient (kReducedGrad), and it does not clip (DeepSpeed's default gradient_clipping
// 0; the global norm is not followed).
std::vector<Write<NumericDomain::Chunk>> NumericDomain::adam(Rank r, const Op& op,
                                                             const ReadFn<Chunk>& read) {
  const Access* p_in = access(r, op, AccessMode::kRead, BufferRole::kPrimary);
  const Access* p_out = access(r, op, AccessMode::kWrite, BufferRole::kPrimary);
  if (p_in == nullptr || p_out == nullptr) return {};
  std::vector<Write<Chunk>> out = update_primary(r, op, *p_in, read);
  for (Write<Chunk>& w : out) {  // the step writes where its primary write lands
    w.buffer = p_out->buffer;
    w.begin = p_out->offset / static_cast<std::uint64_t>(s_.dtype_bytes);
  }
  return out;
}

// The primary shard `primary` after Adam with the unit's reduced gradient (kReducedGrad, at the
// primary's offsets), written back where it was read: the optimizer kernel's step (adam), or a
// recording's copy that writes the primaries back from DeepSpeed's flat fp32 partition
// (data_engine.hpp primary_updates).
std::vector<Write<NumericDomain::Chunk>> NumericDomain::update_primary(Rank r, const Op& op,
                                                                       const Access& primary,
                                                                       const ReadFn<Chunk>& read) {
  if (op.unit == kNoUnit) return {};
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  Chunk p = part(read, primary);
  Chunk grad = read(kReducedGrad, primary.offset / dt, primary.bytes / dt);
  grad.resize(p.size(), 0.0f);
  return {{primary.buffer, primary.offset / dt, step_unit(r, op, std::move(p), grad, 0.0f, 0.0f)}};
}

NumericDomain::Chunk NumericDomain::step_unit(Rank r, const Op& op, Chunk p, const Chunk& grad,
                                              float norm_sq, float max_grad_norm) {
  const float scale = 1.0f / static_cast<float>(s_.world_size * in_.grad_accum);
  AdamState& st = adam_[{r, op.unit}];
  st.m.resize(p.size(), 0.0f);
  st.v.resize(p.size(), 0.0f);
  adam_step(p, grad, st.m, st.v, norm_sq, scale, op.step, max_grad_norm);
  const std::uint64_t key =
      (static_cast<std::uint64_t>(r) << 32) ^ static_cast<std::uint64_t>(op.unit);
  hash_[op.step] ^= fnv(p, 0xcbf29ce484222325ull ^ mix(key));
  return p;
}

std::vector<StepRecord> NumericDomain::steps() const {
  std::vector<StepRecord> out(static_cast<std::size_t>(std::max(in_.steps, 0)));
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
