// The replay engine, generic over a value domain (numeric_domain.hpp, taint_domain.hpp): it
// walks the timeline's start and end events in time order and carries out each op's data
// movement (copies, gathers, reductions, (de)quantization as pass-through) itself, handing
// kernels to the domain. See replay.hpp for the read/write timing rule.
//
// A Domain provides:
//   using Chunk;                                  values of a contiguous element range
//   static std::uint64_t size(const Chunk&);
//   static Chunk slice(const Chunk&, std::uint64_t off, std::uint64_t n);
//   static void splice(Chunk& dst, std::uint64_t off, const Chunk& src);   overwrite in place
//   static void accumulate(Chunk& acc, const Chunk& x);                    element-wise sum
//   static Chunk widen(const Chunk&, std::uint64_t k);      each element k times (a dtype cast)
//   Chunk read(Rank, BufferId, std::uint64_t begin, std::uint64_t n);      n = kWhole: to the end
//   void write(Rank, BufferId, std::uint64_t begin, const Chunk&);
//   void alloc(Rank, BufferId slot, BufferId previous_slot, Fill, std::uint64_t elements);
//   static void quantize_int8(Chunk&, std::uint64_t groups);    qwZ's rounding, in place
// Storage is per buffer *lifetime* (a slot): each kAlloc opens a new slot, and an op refers to
// the lifetime current when its rank's host issued it (the IR's buffer ids are reused across
// lifetimes). A slot is created and filled when its kAlloc is issued: empty() is a host-side
// allocator call, so a fresh buffer read before its stream reached the alloc already holds the
// fill; `stale` carries over what the previous lifetime held at that moment.
//   Chunk checkpoint(Rank, UnitId, std::uint64_t first_element, std::uint64_t n);
//   std::vector<Write<Chunk>> kernel(Rank, const Op&, ReadFn);   ReadFn(BufferId, begin, n)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "sim/ir/fill.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/shard.hpp"
#include "sim/ir/timeline.hpp"

namespace hpz::replay {

/** Read "to the end of the buffer". */
inline constexpr std::uint64_t kWhole = std::numeric_limits<std::uint64_t>::max();

/** A buffer id a kernel's ReadFn answers for an optimizer step that reads no gradient of its
 *  own (the DeepSpeed builder's): the unit's reduced gradient for this rank's primary slice,
 *  elements from the slice's start (empty when the engine has none to give). */
inline constexpr BufferId kReducedGrad = kNoBuffer - 1;

/** Values an op writes into an element range of one of its rank's buffers. */
template <class Chunk>
struct Write {
  BufferId buffer = 0;
  std::uint64_t begin = 0;  ///< first element
  Chunk data;
};

/** Reads an element range of one of the op's rank's buffers, as the op sees it. */
template <class Chunk>
using ReadFn = std::function<Chunk(BufferId, std::uint64_t, std::uint64_t)>;

template <class Domain>
class DataEngine {
 public:
  using Chunk = typename Domain::Chunk;

  DataEngine(const Schedule& s, const Timeline& t, Domain& d) : s_(s), t_(t), d_(d) {
    for (const ParamUnit& u : s.units) layouts_.emplace_back(u.numel, s.world_size, s.hpz_size);
    assign_slots();
  }

  /** Replays every op that ran; returns how many reads overlapped a write in flight. */
  std::uint64_t run() {
    match_collectives();
    in_flight_.assign(s_.ranks.size(), {});
    for (const Event& e : events()) (e.is_start ? on_start(e) : on_end(e));
    return mixed_reads_;
  }

 private:
  struct Event {
    double t;
    bool is_start;
    Rank r;
    std::uint32_t i;
  };
  struct Pending {
    double start = 0, end = 0;
    std::vector<Write<Chunk>> writes;
    bool ready = false;  // writes computed (collectives: every member started)
    bool ended = false;  // end event seen
  };
  /** The k-th collective of a group: every member's send data, gathered as members start. */
  struct Instance {
    std::vector<std::pair<Rank, std::uint32_t>> members;  // (rank, op), group order
    std::vector<std::vector<Chunk>> sends;                // by member: what it contributed
    std::size_t started = 0;
  };

  Op op(Rank r, std::uint32_t i) const { return s_.ranks[r].ops[i]; }
  const OpTime& time(Rank r, std::uint32_t i) const { return t_.ranks[r][i]; }
  BufferRole role(Rank r, BufferId b) const { return s_.ranks[r].buffers[b].role; }
  std::pair<Rank, std::uint32_t> key(Rank r, std::uint32_t i) const { return {r, i}; }

  std::vector<Event> events() const {
    std::vector<Event> ev;
    for (std::size_t r = 0; r < s_.ranks.size(); ++r) {
      for (std::uint32_t i = 0; i < s_.ranks[r].ops.size(); ++i) {
        const OpTime& ot = time(static_cast<Rank>(r), i);
        if (op(static_cast<Rank>(r), i).kind == OpKind::kAlloc) {
          if (std::isfinite(ot.issue_s)) ev.push_back({ot.issue_s, true, static_cast<Rank>(r), i});
          continue;
        }
        if (!std::isfinite(ot.start_s) || !std::isfinite(ot.end_s)) continue;  // never ran
        ev.push_back({ot.start_s, true, static_cast<Rank>(r), i});
        ev.push_back({ot.end_s, false, static_cast<Rank>(r), i});
      }
    }
    // Ends before starts at the same instant: a stream successor starts when its predecessor
    // ends and must see its writes. An op's own end never precedes its start (atomic below).
    std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
      if (a.t != b.t) return a.t < b.t;
      if (a.is_start != b.is_start) return !a.is_start;
      return a.r != b.r ? a.r < b.r : a.i < b.i;
    });
    return ev;
  }

  // Host order decides which lifetime of a buffer each access refers to.
  void assign_slots() {
    slots_.resize(s_.ranks.size());
    alloc_prev_.resize(s_.ranks.size());
    alloc_count_.resize(s_.ranks.size());
    for (std::size_t r = 0; r < s_.ranks.size(); ++r) {
      const RankSchedule& rs = s_.ranks[r];
      std::vector<BufferId> cur(rs.buffers.size());
      for (std::size_t b = 0; b < cur.size(); ++b) cur[b] = static_cast<BufferId>(b);
      auto next = static_cast<BufferId>(cur.size());
      slots_[r].resize(rs.accesses.size());
      for (const Op& o : rs.ops) {
        alloc_count_[r].push_back(static_cast<std::uint32_t>(alloc_prev_[r].size()));
        if (o.kind == OpKind::kAlloc) {
          alloc_prev_[r].push_back(cur[o.buffer]);
          cur[o.buffer] = next++;
        }
        for (std::uint32_t k = 0; k < o.access_count; ++k) {
          slots_[r][o.access_begin + k] = cur[rs.accesses[o.access_begin + k].buffer];
        }
      }
    }
  }

  /** The slot an access of rank r refers to. */
  BufferId slot(Rank r, const Access& a) const {
    return slots_[r][s_.ranks[r].accesses.index_of(&a)];
  }
  /** The slot buffer `b` refers to for op `o` (b is one of its accesses' buffers). */
  BufferId slot(Rank r, const Op& o, BufferId b) const {
    for (const Access& a : s_.accesses_of(r, o)) {
      if (a.buffer == b) return slot(r, a);
    }
    return b;
  }

  void match_collectives() {
    std::map<std::pair<GroupId, std::int64_t>, std::size_t> index;
    std::vector<std::map<GroupId, std::int64_t>> count(s_.ranks.size());
    for (std::size_t r = 0; r < s_.ranks.size(); ++r) {
      for (std::uint32_t i = 0; i < s_.ranks[r].ops.size(); ++i) {
        const Op& o = op(static_cast<Rank>(r), i);
        if (!is_collective(o.kind)) continue;
        const auto k = std::make_pair(o.group, count[r][o.group]++);
        auto [it, fresh] = index.try_emplace(k, instances_.size());
        if (fresh) instances_.emplace_back();
        Instance& inst = instances_[it->second];
        inst.members.emplace_back(static_cast<Rank>(r), i);
        instance_of_[key(static_cast<Rank>(r), i)] = it->second;
      }
    }
    for (Instance& inst : instances_) inst.sends.resize(inst.members.size());
  }

  // What the op sees of [begin, begin + n) of buffer b on rank r at time t: committed values
  // overlaid with the written prefix of every write still in flight.
  Chunk read_at(Rank r, BufferId b, std::uint64_t begin, std::uint64_t n, double t) {
    Chunk c = d_.read(r, b, begin, n);
    const std::uint64_t end = begin + Domain::size(c);
    for (const auto& k : in_flight_[r]) {
      const Pending& p = pending_.at(k);
      if (!p.ready || !(p.start <= t && t < p.end)) continue;
      const double f = (t - p.start) / (p.end - p.start);
      for (const auto& w : p.writes) {
        const std::uint64_t wend = w.begin + Domain::size(w.data);
        if (w.buffer != b || wend <= begin || end <= w.begin) continue;
        ++mixed_reads_;
        const auto done = static_cast<std::uint64_t>(f * static_cast<double>(Domain::size(w.data)));
        const std::uint64_t lo = std::max(begin, w.begin);
        const std::uint64_t hi = std::min(end, w.begin + done);
        if (hi > lo) Domain::splice(c, lo - begin, Domain::slice(w.data, lo - w.begin, hi - lo));
      }
    }
    return c;
  }

  const Access* find(Rank r, const Op& o, AccessMode m, int nth = 0) const {
    for (const Access& a : s_.accesses_of(r, o)) {
      if (a.mode == m && nth-- == 0) return &a;
    }
    return nullptr;
  }
  void on_start(const Event& e) {
    const Op& o = op(e.r, e.i);
    const OpTime& ot = time(e.r, e.i);
    if (is_collective(o.kind)) return collective_start(e, o);
    if (o.kind == OpKind::kAlloc) return alloc(e.r, e.i, o);
    std::vector<Write<Chunk>> w = effects_by_ranges(e.r, o, ot.start_s);
    for (auto& x : w) x.buffer = slot(e.r, o, x.buffer);
    if (w.empty()) return;
    if (ot.end_s <= ot.start_s) {
      for (const auto& x : w) d_.write(e.r, x.buffer, x.begin, x.data);
      return;
    }
    Pending& p = pending_[key(e.r, e.i)];
    p.start = ot.start_s;
    p.end = ot.end_s;
    p.writes = std::move(w);
    p.ready = true;
    in_flight_[e.r].push_back(key(e.r, e.i));
  }

  void on_end(const Event& e) {
    auto it = pending_.find(key(e.r, e.i));
    if (it == pending_.end()) return;
    it->second.ended = true;
    if (it->second.ready) commit(e.r, it);
  }

  void commit(Rank r, typename std::map<std::pair<Rank, std::uint32_t>, Pending>::iterator it) {
    for (const auto& x : it->second.writes) d_.write(r, x.buffer, x.begin, x.data);
    auto& fl = in_flight_[r];
    fl.erase(std::remove(fl.begin(), fl.end(), it->first), fl.end());
    pending_.erase(it);
  }

  void alloc(Rank r, std::uint32_t i, const Op& o) {
    const Buffer& b = s_.ranks[r].buffers[o.buffer];
    const std::uint64_t n = b.bytes / esize(r, o.buffer);
    const std::uint32_t k = alloc_count_[r][i];
    const BufferId fresh = static_cast<BufferId>(s_.ranks[r].buffers.size() + k);
    d_.alloc(r, fresh, alloc_prev_[r][k], static_cast<Fill>(o.fill), n);
  }

  // A write that reads nothing: a load writes the primary shard, or the whole parameter, from
  // storage; elements [at, at + n) of buffer b.
  std::vector<Write<Chunk>> from_storage(Rank r, const Op& o, BufferId b, std::uint64_t at,
                                         std::uint64_t n) {
    if (o.unit == kNoUnit) return {};
    const bool whole = role(r, b) == BufferRole::kFull;
    const std::uint64_t first = (whole ? 0 : layouts_[o.unit].primary_slice(r).begin) + at;
    return {{b, at, d_.checkpoint(r, o.unit, first, n)}};
  }

  void collective_start(const Event& e, const Op& o) {
    Instance& inst = instances_[instance_of_.at(key(e.r, e.i))];
    std::size_t m = 0;
    while (inst.members[m] != key(e.r, e.i)) ++m;
    const double t = time(e.r, e.i).start_s;
    for (int nth = 0;; ++nth) {
      const Access* a = find(e.r, o, AccessMode::kRead, nth);
      if (a == nullptr || moves_no_data(o)) break;
      inst.sends[m].push_back(read_range(e.r, *a, t));
    }
    Pending& p = pending_[key(e.r, e.i)];
    p.start = t;
    p.end = time(e.r, e.i).end_s;
    in_flight_[e.r].push_back(key(e.r, e.i));
    if (++inst.started == inst.members.size()) complete(inst);
  }

  // Every member has started: compute what each receives, and commit for those already ended.
  void complete(Instance& inst) {
    for (std::size_t m = 0; m < inst.members.size(); ++m) {
      const auto [r, i] = inst.members[m];
      auto it = pending_.find(key(r, i));
      it->second.writes = receive(inst, m);
      for (auto& x : it->second.writes) x.buffer = slot(r, op(r, i), x.buffer);
      it->second.ready = true;
      if (it->second.ended) commit(r, it);
    }
    inst.sends.clear();
  }

  std::vector<Write<Chunk>> receive(const Instance& inst, std::size_t m) {
    const auto [r, i] = inst.members[m];
    const Op& o = op(r, i);
    const Access* dst = find(r, o, AccessMode::kWrite);
    if (dst == nullptr) return {};
    return receive_by_ranges(inst, m, o, *dst);
  }

  // ---- By ranges: DeepSpeed's schedules, built or recorded ---------------------------------
  //
  // Every access is followed by its byte range, whatever unit the op is labelled with: a buffer
  // holds elements of dtype_bytes, an int8 (kQuantized) buffer one-byte elements. A copy moves
  // its i-th read into its i-th write, or, with one write, its reads one after another into it
  // (torch.cat). A collective carries what its members' reads hold into their writes (an
  // all-gather places member k's at k * comm_bytes). Quantization is a pass-through, as above.
  // Gradients are the exception: the builder's gradient reduction writes each bucket's
  // reduce-scatter output at the start of one flat buffer and its optimizer step reads none of
  // it (the IR does not say which bytes are which parameter's), so its ops move no data here;
  // each rank's gradient of a unit is taken where the bucket copy reads it, summed over the
  // ranks, and handed to the unit's optimizer step sliced to the rank's primary slice, as
  // DeepSpeed partitions each gradient: reduce_scatter_coalesced cuts every gradient into
  // ceil(numel / world) chunks, rank r's being [r * chunk, (r + 1) * chunk)
  // (runtime/comm/coalesced_collectives.py:93-99 at v0.13.4), and partition_grads copies it into
  // the parameter's gradient partition at micro-step 0 and adds it after
  // (runtime/zero/stage3.py:1418-1439 at v0.13.4).

  /** Element size of buffer b of rank r in bytes. */
  std::uint64_t esize(Rank r, BufferId b) const {
    return role(r, b) == BufferRole::kQuantized ? 1 : static_cast<std::uint64_t>(s_.dtype_bytes);
  }
  /** Reads what an access covers, in its buffer's elements. */
  Chunk read_range(Rank r, const Access& a, double t) {
    const std::uint64_t es = esize(r, a.buffer);
    return read_at(r, slot(r, a), a.offset / es, a.bytes / es, t);
  }
  /** Gradient reduction ops other than the bucket copy: see above. */
  static bool moves_no_data(const Op& o) { return o.phase == Phase::kGradReduce; }
  std::vector<const Access*> accesses(Rank r, const Op& o, AccessMode m) const {
    std::vector<const Access*> out;
    for (const Access& a : s_.accesses_of(r, o)) {
      if (a.mode == m) out.push_back(&a);
    }
    return out;
  }

  std::vector<Write<Chunk>> effects_by_ranges(Rank r, const Op& o, double t) {
    switch (o.kind) {
      case OpKind::kCopy:
        if (is_gradient_copy(r, o)) take_gradient(r, o, t);
        if (s_.is_primary_write_back(r, o)) return primary_updates(r, o, t);
        return moves_no_data(o) ? std::vector<Write<Chunk>>{} : gather_into(r, o, t);
      case OpKind::kQuantize:
        return moves_no_data(o) ? std::vector<Write<Chunk>>{} : quantize_by_ranges(r, o, t);
      case OpKind::kDequantize:
        return moves_no_data(o) ? std::vector<Write<Chunk>>{} : dequantize_by_ranges(r, o, t);
      case OpKind::kKernel: {
        const ReadFn<Chunk> rd = [this, r, t, &o](BufferId b, std::uint64_t begin,
                                                  std::uint64_t n) {
          if (b == kReducedGrad) return reduced_gradient(r, o, begin, n);
          return read_at(r, slot(r, o, b), begin, n, t);
        };
        return d_.kernel(r, o, rd);
      }
      default:
        return {};
    }
  }

  /** Elements the reads cover, and elements of the buffers they read from (whole). */
  std::pair<std::uint64_t, std::uint64_t> read_extent(
      Rank r, const std::vector<const Access*>& reads) const {
    std::uint64_t read_elems = 0, buffer_elems = 0;
    for (const Access* a : reads) {
      const std::uint64_t es = esize(r, a->buffer);
      read_elems += a->bytes / es;
      buffer_elems += s_.ranks[r].buffers[a->buffer].bytes / es;
    }
    return {read_elems, buffer_elems};
  }

  // A copy (or qwZ's quantize: int8 values one for one): the i-th read into the i-th write when
  // they pair up; else every read into the one write, one after another. When the reads cover
  // less than the write (a shard's padding is never read), each read keeps the place its
  // buffer has in the concatenation (torch.cat of whole shards, offsets from the buffer's
  // start). A copy between buffers of different element sizes moves nothing (there is none).
  std::vector<Write<Chunk>> gather_into(Rank r, const Op& o, double t) {
    const std::vector<const Access*> reads = accesses(r, o, AccessMode::kRead);
    const std::vector<const Access*> writes = accesses(r, o, AccessMode::kWrite);
    if (writes.empty()) return {};
    std::vector<Write<Chunk>> out;
    if (reads.empty()) {
      const Access& w = *writes.front();
      const std::uint64_t es = esize(r, w.buffer);
      return from_storage(r, o, w.buffer, w.offset / es, w.bytes / es);
    }
    if (reads.size() == writes.size() && o.kind == OpKind::kCopy) {
      for (std::size_t i = 0; i < reads.size(); ++i) {
        const std::uint64_t es = esize(r, writes[i]->buffer);
        if (es != esize(r, reads[i]->buffer)) continue;
        Chunk c = read_range(r, *reads[i], t);
        // A widening cast (a recording's `.float()` of a bf16 tensor: the recorder logs the
        // bytes each side holds, the schedule counts them in one element size) writes k times
        // the bytes it reads, k = 2 (16 to 32 bits) or 4 (8 to 32): each value lands on k
        // elements, so the whole destination is written.
        const std::uint64_t rb = reads[i]->bytes, wb = writes[i]->bytes;
        if (rb > 0 && (wb == 2 * rb || wb == 4 * rb)) c = Domain::widen(c, wb / rb);
        out.push_back({writes[i]->buffer, writes[i]->offset / es,
                       Domain::slice(c, 0, std::min(Domain::size(c), writes[i]->bytes / es))});
      }
      return out;
    }
    const Access& w = *writes.front();
    const std::uint64_t wes = esize(r, w.buffer);
    const std::uint64_t capacity = w.bytes / wes;
    // Counted in elements of the reads (a quantize's int8 values are one for one with them).
    const auto [read_elems, buffer_elems] = read_extent(r, reads);
    const bool by_buffer = read_elems != capacity && buffer_elems == capacity;
    std::uint64_t at = 0;
    for (const Access* a : reads) {
      const std::uint64_t es = esize(r, a->buffer);
      const std::uint64_t pos = by_buffer ? at + a->offset / es : at;
      at += by_buffer ? s_.ranks[r].buffers[a->buffer].bytes / es : a->bytes / es;
      if (pos >= capacity || (o.kind == OpKind::kCopy && es != wes)) continue;
      Chunk c = read_range(r, *a, t);
      out.push_back({w.buffer, w.offset / wes + pos,
                     Domain::slice(c, 0, std::min(Domain::size(c), capacity - pos))});
    }
    return out;
  }

  // qwZ's quantize: the values one for one into the int8 buffer (gather_into), then rounded
  // group by group as the quantizer rounds them (Domain::quantize_int8); the groups are the
  // scales the op writes after the values (4 bytes each). The scales themselves are not
  // written: the rounded values already carry them, and dequantize passes them through.
  std::vector<Write<Chunk>> quantize_by_ranges(Rank r, const Op& o, double t) {
    std::vector<Write<Chunk>> pieces = gather_into(r, o, t);
    const std::vector<const Access*> writes = accesses(r, o, AccessMode::kWrite);
    if (pieces.empty() || writes.size() != 1) return pieces;
    const Access& w = *writes.front();
    const std::uint64_t wes = esize(r, w.buffer), begin = w.offset / wes;
    const auto [read_elems, buffer_elems] = read_extent(r, accesses(r, o, AccessMode::kRead));
    const std::uint64_t capacity = w.bytes / wes;
    const std::uint64_t values =
        read_elems != capacity && buffer_elems < capacity ? buffer_elems : read_elems;
    if (values >= capacity || (capacity - values) % 4 != 0) return pieces;
    const std::uint64_t groups = (capacity - values) / 4;
    Chunk all = read_at(r, slot(r, o, w.buffer), begin, values, t);
    for (const Write<Chunk>& p : pieces) {
      if (p.buffer == w.buffer && p.begin >= begin) Domain::splice(all, p.begin - begin, p.data);
    }
    all = Domain::slice(all, 0, values);
    Domain::quantize_int8(all, groups);
    return {{w.buffer, begin, std::move(all)}};
  }

  // qwZ's dequantize: the gathered int8 values, one for one, into the parameter or flat tensor
  // it writes (the scales are not followed: quantization is a pass-through).
  std::vector<Write<Chunk>> dequantize_by_ranges(Rank r, const Op& o, double t) {
    const Access* src = find(r, o, AccessMode::kRead);
    const Access* dst = find(r, o, AccessMode::kWrite);
    if (src == nullptr || dst == nullptr) return {};
    const std::uint64_t es = esize(r, dst->buffer);
    Chunk c = read_range(r, *src, t);
    return {{dst->buffer, dst->offset / es,
             Domain::slice(c, 0, std::min(Domain::size(c), dst->bytes / es))}};
  }

  std::vector<Write<Chunk>> receive_by_ranges(const Instance& inst, std::size_t m, const Op& o,
                                              const Access& dst) {
    const Rank r = inst.members[m].first;
    if (moves_no_data(o)) return {};
    const std::uint64_t es = esize(r, dst.buffer);
    const Access* own = find(r, o, AccessMode::kRead);
    // A broadcast is an all-reduce that only its root sends to (a load's, DeepSpeed builder):
    // the other members receive without reading.
    if (own == nullptr && o.kind != OpKind::kAllReduce) return {};
    if (own != nullptr && esize(r, own->buffer) != es) return {};  // qwZ's scales
    const std::uint64_t begin = dst.offset / es, end = begin + dst.bytes / es;
    if (own == nullptr && o.purpose == Purpose::kCheckpointLoad && o.unit != kNoUnit) {
      // The load's weights, as the root read them: this rank's unit has new weights too.
      return {{dst.buffer, begin, d_.checkpoint(r, o.unit, begin, end - begin)}};
    }
    std::vector<Write<Chunk>> out;
    switch (o.kind) {
      case OpKind::kAllGather:
        for (std::size_t k = 0; k < inst.members.size(); ++k) {
          if (inst.sends[k].empty()) continue;
          const std::uint64_t pos = begin + k * (o.comm_bytes / es);
          if (pos >= end) continue;
          const Chunk& c = inst.sends[k][0];
          out.push_back(
              {dst.buffer, pos, Domain::slice(c, 0, std::min(Domain::size(c), end - pos))});
        }
        return out;
      case OpKind::kReduceScatter: {
        const std::uint64_t n = o.comm_bytes / es, from = m * n;
        Chunk sum = Domain::slice(inst.sends[0].at(0), from, n);
        for (std::size_t k = 1; k < inst.members.size(); ++k)
          Domain::accumulate(sum, Domain::slice(inst.sends[k].at(0), from, n));
        return {
            {dst.buffer, begin, Domain::slice(sum, 0, std::min(Domain::size(sum), end - begin))}};
      }
      case OpKind::kAllReduce: {
        // zero.Init's broadcast from rank 0 (_zero_init_param, PP:1011 at v0.13.4), logged as an
        // all-reduce that every rank reads (as the recorder logs it): rank 0's tensor, not the sum.
        const bool broadcast = o.purpose == Purpose::kParamInit;
        std::optional<Chunk> sum;
        for (std::size_t k = 0; k < inst.members.size(); ++k) {
          if (inst.sends[k].empty()) continue;  // a broadcast's receiver
          if (!sum) {
            sum = inst.sends[k][0];
            if (broadcast) break;
          } else {
            Domain::accumulate(*sum, inst.sends[k][0]);
          }
        }
        if (!sum) return {};
        return {
            {dst.buffer, begin, Domain::slice(*sum, 0, std::min(Domain::size(*sum), end - begin))}};
      }
      default:  // all-to-all: only qgZ's, in the gradient reduction
        return {};
    }
  }

  // A recording's optimizer step lands in the copy that writes every primary shard back from
  // DeepSpeed's flat fp32 partition (Schedule::is_primary_write_back). Each shard it writes is
  // updated there by the domain, with the unit's reduced gradient, as the builder's per-unit
  // step is; the partition's own bytes are not followed (fp32 values in a schedule of
  // dtype_bytes elements).
  std::vector<Write<Chunk>> primary_updates(Rank r, const Op& o, double t) {
    std::vector<Write<Chunk>> out;
    for (const Access& a : s_.accesses_of(r, o)) {
      if (a.mode != AccessMode::kWrite || role(r, a.buffer) != BufferRole::kPrimary) continue;
      Op unit_op = o;
      unit_op.unit = s_.ranks[r].buffers[a.buffer].unit;
      if (unit_op.unit == kNoUnit) continue;
      const ReadFn<Chunk> rd = [this, r, t, &o, &unit_op](BufferId b, std::uint64_t begin,
                                                          std::uint64_t n) {
        if (b == kReducedGrad) return reduced_gradient(r, unit_op, begin, n);
        return read_at(r, slot(r, o, b), begin, n, t);
      };
      for (Write<Chunk>& w : d_.update_primary(r, unit_op, a, rd)) out.push_back(std::move(w));
    }
    return out;
  }

  /** A bucket copy: this rank's gradient of a unit (a kGradFull buffer) into the bucket. */
  bool is_gradient_copy(Rank r, const Op& o) const {
    const Access* src = find(r, o, AccessMode::kRead);
    return o.phase == Phase::kGradReduce && src != nullptr &&
           role(r, src->buffer) == BufferRole::kGradFull &&
           s_.ranks[r].buffers[src->buffer].unit != kNoUnit;
  }
  void take_gradient(Rank r, const Op& o, double t) {
    const Access& src = *find(r, o, AccessMode::kRead);
    const UnitId u = s_.ranks[r].buffers[src.buffer].unit;
    // The rank's k-th gradient of the unit in this step is micro-step k's.
    auto& micro = gradients_[{o.step, u}];
    std::size_t k = 0;
    while (k < micro.size() && micro[k][r]) ++k;
    if (k == micro.size()) micro.emplace_back(s_.ranks.size());
    micro[k][r] = read_range(r, src, t);
  }
  // The unit's gradient in this step, elements [begin, begin + n) of rank r's primary slice, in
  // DeepSpeed's order: each micro-step's reduce-scatter sums the ranks (in rank order), and
  // partition_grads adds each micro-step's sum to the partition (stage3.py:1418-1445 at
  // v0.13.4).
  Chunk reduced_gradient(Rank r, const Op& o, std::uint64_t begin, std::uint64_t n) {
    if (o.unit == kNoUnit) return {};
    const auto it = gradients_.find({o.step, o.unit});
    if (it == gradients_.end()) return {};
    const std::uint64_t first = layouts_[o.unit].primary_slice(r).begin + begin;
    std::optional<Chunk> total;
    for (const auto& ranks : it->second) {
      std::optional<Chunk> sum;
      for (const auto& g : ranks) {
        if (!g) continue;
        Chunk c = Domain::slice(*g, first, n);
        if (!sum) {
          sum = std::move(c);
        } else {
          Domain::accumulate(*sum, c);
        }
      }
      if (!sum) continue;
      if (!total) {
        total = std::move(*sum);
      } else {
        Domain::accumulate(*total, *sum);
      }
    }
    return total ? std::move(*total) : Chunk{};
  }

  const Schedule& s_;
  const Timeline& t_;
  Domain& d_;
  std::vector<ShardLayout> layouts_;
  std::vector<Instance> instances_;
  std::map<std::pair<Rank, std::uint32_t>, std::size_t> instance_of_;
  std::map<std::pair<Rank, std::uint32_t>, Pending> pending_;
  std::vector<std::vector<std::pair<Rank, std::uint32_t>>> in_flight_;
  std::vector<std::vector<BufferId>> slots_;             // [rank][access]: lifetime slot
  std::vector<std::vector<BufferId>> alloc_prev_;        // [rank][k-th alloc]: previous slot
  std::vector<std::vector<std::uint32_t>> alloc_count_;  // [rank][op]: allocs before it
  std::uint64_t mixed_reads_ = 0;
  /** By ranges: (step, unit) -> per micro-step, each rank's gradient of the unit. */
  std::map<std::pair<std::int32_t, UnitId>, std::vector<std::vector<std::optional<Chunk>>>>
      gradients_;
};

}  // namespace hpz::replay
