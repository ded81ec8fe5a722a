// A hand-built schedule for checker tests: ranks of three streams, buffers, ops and syncs.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "sim/check/checker.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::check {

inline Access R(BufferId b, std::uint64_t offset, std::uint64_t bytes) {
  return {b, AccessMode::kRead, offset, bytes};
}
inline Access W(BufferId b, std::uint64_t offset, std::uint64_t bytes) {
  return {b, AccessMode::kWrite, offset, bytes};
}

/** Appends ops, buffers and accesses to a hand-built Schedule. */
class Builder {
 public:
  /** `ranks` ranks of three streams each (S0, S1, S2) and the world group (id 0). */
  explicit Builder(int ranks) {
    s_.scenario = "hand-built";
    s_.variant = "test";
    s_.world_size = ranks;
    s_.groups.push_back({"world", GroupKind::kWorld, {}});
    for (Rank r = 0; r < ranks; ++r) {
      RankSchedule rs;
      rs.rank = r;
      rs.streams = {{"S0"}, {"S1"}, {"S2"}};
      s_.ranks.push_back(rs);
      s_.groups[0].ranks.push_back(r);
    }
    s_.units.push_back({"layers.0.attn", 0, 1024, 1024, 512, 512, 0, false});
  }

  GroupId group(std::vector<Rank> ranks, GroupKind kind = GroupKind::kHpz) {
    s_.groups.push_back({"g" + std::to_string(s_.groups.size()), kind, std::move(ranks)});
    return static_cast<GroupId>(s_.groups.size() - 1);
  }

  /** The same buffer on every rank. */
  BufferId buffer(const std::string& name, std::uint64_t bytes,
                  BufferRole role = BufferRole::kScratch, UnitId unit = kNoUnit) {
    for (auto& rs : s_.ranks) rs.buffers.push_back({name, role, unit, bytes, false});
    return static_cast<BufferId>(s_.ranks[0].buffers.size() - 1);
  }

  Op& op(Rank r, StreamId s, std::initializer_list<Access> acc, OpKind kind = OpKind::kKernel,
         Purpose p = Purpose::kForwardCompute) {
    RankSchedule& rs = s_.ranks[r];
    Op o;
    o.kind = kind;
    o.stream = s;
    o.purpose = p;
    o.phase = Phase::kForward;
    o.unit = 0;
    o.access_begin = static_cast<std::uint32_t>(rs.accesses.size());
    for (const Access& a : acc) rs.accesses.push_back(a);
    o.access_count = static_cast<std::uint32_t>(acc.size());
    rs.ops.push_back(o);
    return rs.ops.mut().back();
  }
  EventId record(Rank r, StreamId s) {
    Op& o = op(r, s, {}, OpKind::kEventRecord);
    o.event = next_event_++;
    return o.event;
  }
  void wait(Rank r, StreamId s, EventId e) { op(r, s, {}, OpKind::kStreamWaitEvent).event = e; }
  void host_sync(Rank r, StreamId s) { op(r, s, {}, OpKind::kHostStreamSync); }
  void host_event_sync(Rank r, EventId e) {
    op(r, kHostStream, {}, OpKind::kHostEventSync).event = e;
  }
  void device_sync(Rank r) { op(r, kHostStream, {}, OpKind::kHostDeviceSync); }
  void alloc(Rank r, StreamId s, BufferId b) { op(r, s, {}, OpKind::kAlloc).buffer = b; }
  void free(Rank r, StreamId s, BufferId b) { op(r, s, {}, OpKind::kFree).buffer = b; }
  Op& collective(Rank r, StreamId s, GroupId g, std::initializer_list<Access> acc,
                 std::uint64_t bytes = 64, OpKind kind = OpKind::kAllGather) {
    Op& o = op(r, s, acc, kind, Purpose::kParamFetch);
    o.group = g;
    o.comm_bytes = bytes;
    return o;
  }

  /** The host calls b.record_stream(recorded). */
  void record_stream(Rank r, StreamId recorded, BufferId b) {
    op(r, recorded, {}, OpKind::kRecordStream).buffer = b;
  }

  CheckResult check() const { return check_schedule(s_); }
  Schedule& schedule() { return s_; }

 private:
  Schedule s_;
  EventId next_event_ = 0;
};
}  // namespace hpz::check
