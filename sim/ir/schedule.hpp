// The schedule IR: the one contract between the builder, the race checker, the timing engine,
// the data replay and the real executor.
//
// A Schedule holds, for every rank, the operations in the order the rank's host thread issues
// them. Each operation runs on one stream of its rank (or on the host, for host syncs), reads and
// writes byte ranges of named buffers of its rank, and carries labels (step, parameter unit,
// phase, purpose). Nothing in here is specific to one engine.
//
// Semantics every reader relies on:
//  - Host order: ops of a rank are issued in vector order. A stream op is *issued* when the host
//    reaches it and *runs* after everything issued earlier on the same stream (FIFO).
//  - kEventRecord on stream s captures everything issued on s so far into `event`;
//    kStreamWaitEvent on stream t makes everything issued later on t wait for that capture.
//    Event ids are unique per rank: each record creates a fresh event.
//  - kHostStreamSync blocks the host until everything issued on `stream` has finished;
//    kHostDeviceSync until everything issued on every stream of the rank has finished;
//    kHostEventSync (torch's Event.synchronize(), `stream` = kHostStream) until the capture of
//    `event`, recorded earlier on the same rank, has finished.
//  - Collectives (kAllGather, kReduceScatter, kAllReduce, kAllToAll) name a group. The k-th
//    collective a rank issues on a group is matched with the k-th collective of every other
//    member (NCCL's rule); no member's collective completes before every member's has started.
//    Each rank's collective op lists only its own accesses: it reads its send bytes and writes
//    its receive bytes.
//  - kAlloc starts the lifetime of `buffer` with contents given by `fill`; kFree ends it. Both
//    are ordered on their stream like any other op. A buffer id names a logical tensor (say, the
//    secondary shard of layer 12 on rank 3) and is reused by each new allocation of it. Accesses
//    in different lifetimes of a buffer never conflict as accesses of one buffer; whether the
//    allocator's reuse of memory makes them collide is the next point's business. Contents do
//    carry over when `fill` is stale.
//  - The caching allocator (CUDACachingAllocator.cpp), where Schedule::allocator says the
//    schedule has every allocation, free and record_stream call of its buffers: a kAlloc's
//    stream is the stream current at the allocation, the block's stream; only that stream's
//    later allocations reuse the block after its kFree, at once unless kRecordStream named
//    other streams on it, then after the work they had at the free. kRecordStream is a host
//    op: `stream` names the stream recorded, `buffer` the tensor's buffer; no accesses. The
//    checker's use-after-free rule follows these (sim/check/allocator.hpp).
//  - Access ranges are in bytes, half-open [offset, offset + bytes), and cover only meaningful
//    bytes: padding that DeepSpeed adds to make a parameter divisible by the world size is never
//    read, so it never appears in an access. A strided access (count > 1) is its slices, each
//    such a range, and means exactly what as many plain accesses would; unfold_strided() writes
//    them out for readers that index accesses one range each (the data replay, the executor).
//  - Storage: ranks that issue the same ops on their own groups share one copy (OpList); a
//    reader gets each op by value, with the rank's own group in it: a `const Op&` bound to
//    ops[i] holds a copy for as long as the reference lives, and a pointer to it dangles after
//    that. Write through ops.mut().
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sim/ir/fill.hpp"

namespace hpz {

using Rank = int;
using BufferId = std::uint32_t;  ///< index into RankSchedule::buffers
using GroupId = std::int32_t;    ///< index into Schedule::groups
using EventId = std::int32_t;    ///< per-rank event number
using UnitId = std::int32_t;     ///< index into Schedule::units
using StreamId = std::int8_t;    ///< index into RankSchedule::streams
using LabelId = std::int32_t;    ///< index into Schedule::labels

inline constexpr BufferId kNoBuffer = 0xffffffffu;

inline constexpr GroupId kNoGroup = -1;
inline constexpr EventId kNoEvent = -1;
inline constexpr UnitId kNoUnit = -1;
inline constexpr StreamId kHostStream = -1;  ///< for ops that run on the host thread itself
inline constexpr LabelId kNoLabel = -1;

/** What an operation does. */
enum class OpKind : std::uint8_t {
  kKernel,           ///< compute kernel: `flops`, `mem_bytes` of HBM traffic, or `spin_us`
  kCopy,             ///< memory copy (D2D, or H2D / D2H when a buffer lives on the host)
  kAllGather,        ///< collective over `group`; `comm_bytes` = bytes each rank contributes
  kReduceScatter,    ///< collective over `group`; `comm_bytes` = bytes of each rank's output
  kAllReduce,        ///< collective over `group`; `comm_bytes` = buffer size
  kAllToAll,         ///< collective over `group`; `comm_bytes` = bytes each rank sends in all
  kQuantize,         ///< quantization kernel (qwZ / qgZ)
  kDequantize,       ///< dequantization (and, for qgZ, reduction) kernel
  kEventRecord,      ///< record `event` on `stream`
  kStreamWaitEvent,  ///< `stream` waits for `event`
  kHostStreamSync,   ///< the host waits for `stream` to drain
  kHostDeviceSync,   ///< the host waits for every stream of the rank
  kAlloc,            ///< buffer allocation; contents per `fill`
  kFree,             ///< buffer release
  kHostEventSync,    ///< the host waits for `event` (recorded earlier on this rank) to complete
  kRecordStream,     ///< the host calls buffer.record_stream(stream): a host op, see below
};

/** Where in a training step an op belongs. */
enum class Phase : std::uint8_t {
  kInit,            ///< model construction and first partitioning
  kCheckpointLoad,  ///< a load that writes primary shards
  kForward,
  kBackward,
  kGradReduce,  ///< gradient reduction (ReduceScatter or the qgZ all-to-alls)
  kOptimizer,   ///< optimizer step and secondary invalidation
};

/** Why the builder emitted an op: a finer label than the kind, for reports and tests. */
enum class Purpose : std::uint8_t {
  kParamInit,         ///< initial weights written
  kParamFetch,        ///< allocation/gather of the full parameter (forward or backward)
  kPrefetch,          ///< same, issued ahead by the prefetch coordinator
  kWeightQuantize,    ///< qwZ quantize before the forward gather
  kWeightDequantize,  ///< qwZ dequantize after it
  kNcclHandshake,     ///< events between the caller's stream and NCCL's stream
  kFetchWait,         ///< compute stream waits for the gathered parameter
  kForwardCompute,
  kRecomputeForward,  ///< activation checkpointing recompute in backward
  kBackwardCompute,
  kLossGradient,            ///< the loss and its gradient, which seeds backward
  kParamRelease,            ///< full parameter freed after use
  kSecondaryAlloc,          ///< empty() for the secondary shard
  kSecondaryPartitionCopy,  ///< the D2D copy of this rank's slice into the secondary shard
  kFixHostSync,             ///< fix A: host blocks on the compute stream
  kFixEventRecord,          ///< fix B: event after the secondary copy
  kFixEventWait,            ///< fix B: all-gather stream waits before the hpZ gather
  kGradAlloc,
  kGradReduce,  ///< ReduceScatter, or a qgZ all-to-all / (de)quantize step
  kGradNorm,    ///< global gradient norm AllReduce
  kOptimizerStep,
  kSecondaryInvalidate,  ///< secondary shard set to None at the end of the step
  kCheckpointLoad,
  kOffloadCopy,   ///< parameter moved between host and device
  kStepSync,      ///< loss.item(): host waits for the compute stream
  kReproSpin,     ///< a spin kernel that holds the compute stream ahead of the secondary copy
                  ///< (`run.spin_before_copy_us`): how a reproduction widens the race window
  kHostThrottle,  ///< a host sync that bounds work in flight (__max_ongoing_fetch_events)
  kOther,         ///< a recorded op whose purpose the recorder cannot tell
};

/** Which role a buffer plays; the checker's stale-read rule keys on kSecondary. */
enum class BufferRole : std::uint8_t {
  kPrimary,     ///< this rank's 1/P shard of a parameter unit (the truth)
  kSecondary,   ///< this rank's 1/P' hpZ shard: a copy of part of the full parameter
  kFull,        ///< the gathered full parameter
  kQuantized,   ///< int8 staging of a shard or of a gathered parameter (qwZ / qgZ)
  kGradFull,    ///< full-size gradient produced by backward
  kGradShard,   ///< this rank's reduced gradient shard
  kActivation,  ///< activations / checkpoints between layers
  kScratch,     ///< anything else (norm scalars, staging)
};

/** Read or write. */
enum class AccessMode : std::uint8_t { kRead, kWrite };

/** The bytes an op reads or writes of one buffer: one range, or `count` ranges of `bytes` each
 *  `stride` bytes apart (a strided access: a coalesced gather's torch.cat reads one slice per
 *  rank out of its flat buffer, and at 1,024 ranks 1,024 plain ranges per copy would make each
 *  rank's accesses grow with the world). Slices are disjoint and ascending: stride >= bytes. */
struct Access {
  BufferId buffer = 0;
  AccessMode mode = AccessMode::kRead;
  std::uint64_t offset = 0;  ///< bytes from the buffer's start to the first slice
  std::uint64_t bytes = 0;   ///< bytes of each slice
  // Narrow, so that an Access stays 32 bytes (at 1,024 ranks each rank holds ~40 K of them);
  // a builder writes slices out as plain accesses where these do not reach.
  std::uint32_t stride = 0;  ///< from one slice's start to the next one's; count > 1 only
  std::uint16_t count = 1;   ///< slices: [offset + i * stride, + bytes) for i < count

  bool strided() const { return count > 1; }
  /** One past the last byte of the last slice. */
  std::uint64_t end() const { return offset + std::uint64_t{count - 1u} * stride + bytes; }
  /** Bytes of all slices. */
  std::uint64_t total_bytes() const { return count * bytes; }
  /** Calls f(begin, end) for every slice, ascending. */
  template <class F>
  void for_each_slice(F&& f) const {
    for (std::uint64_t i = 0; i < count; ++i) f(offset + i * stride, offset + i * stride + bytes);
  }
  bool operator==(const Access&) const = default;
};

/** A named allocation of one rank. */
struct Buffer {
  std::string name;  ///< e.g. "layers.12.attn.secondary"
  BufferRole role = BufferRole::kScratch;
  UnitId unit = kNoUnit;    ///< the parameter unit it belongs to, if any
  std::uint64_t bytes = 0;  ///< allocation size, padding included
  bool on_host = false;     ///< lives in host memory (offload_param)
  bool operator==(const Buffer&) const = default;
};

/** One operation in a rank's issue order. */
struct Op {
  OpKind kind = OpKind::kKernel;
  Phase phase = Phase::kInit;
  Purpose purpose = Purpose::kParamInit;
  StreamId stream = kHostStream;
  std::int32_t step = 0;           ///< optimizer step (-1 for init)
  std::int32_t micro_step = 0;     ///< gradient-accumulation micro-step
  UnitId unit = kNoUnit;           ///< parameter unit this op serves
  GroupId group = kNoGroup;        ///< collectives only
  EventId event = kNoEvent;        ///< event records, stream waits and host event syncs
  BufferId buffer = kNoBuffer;     ///< kAlloc / kFree only: the buffer whose lifetime starts/ends
  std::uint32_t access_begin = 0;  ///< first access in RankSchedule::accesses
  std::uint32_t access_count = 0;
  LabelId label = kNoLabel;      ///< what the op was issued for, e.g. a module's hook
  double flops = 0;              ///< kernels
  double mem_bytes = 0;          ///< HBM bytes moved by kernels and copies
  std::uint64_t comm_bytes = 0;  ///< collectives, see OpKind
  std::uint8_t fill = 0;         ///< kAlloc: a Fill value (sim/ir/fill.hpp)
  float spin_us = 0;             ///< kKernel: when > 0, runs this long whatever its flops
  bool operator==(const Op&) const = default;
};

/** A vector that ranks holding equal contents share, copied on the first write: 1,024 ranks of
 *  a DeepSpeed schedule have one buffer table between them. Reading is a const vector's; writing
 *  goes through mut(), which first gives this holder its own copy if another one shares it. */
template <class T>
class SharedVector {
 public:
  using value_type = T;
  using const_iterator = typename std::vector<T>::const_iterator;

  std::size_t size() const { return v_ ? v_->size() : 0; }
  bool empty() const { return size() == 0; }
  const T& operator[](std::size_t i) const { return (*v_)[i]; }
  const T& at(std::size_t i) const { return get().at(i); }
  const_iterator begin() const { return get().begin(); }
  const_iterator end() const { return get().end(); }
  /** The contents as a vector, to read. */
  const std::vector<T>& get() const { return v_ ? *v_ : empty_vector(); }

  /** The contents to write: this holder's own copy. */
  std::vector<T>& mut() {
    if (!v_) {
      v_ = std::make_shared<std::vector<T>>();
    } else if (v_.use_count() > 1) {
      v_ = std::make_shared<std::vector<T>>(*v_);
    }
    return *v_;
  }
  void push_back(T value) { mut().push_back(std::move(value)); }

  /** True when both hold one shared copy. */
  bool shares_with(const SharedVector& other) const { return v_ && v_ == other.v_; }
  /** Shares `other`'s copy when the contents are equal; true when they share afterwards. */
  bool share_if_equal(const SharedVector& other) {
    if (shares_with(other)) return true;
    if (!other.v_ || get() != other.get()) return false;
    v_ = other.v_;
    return true;
  }

 private:
  static const std::vector<T>& empty_vector() {
    static const std::vector<T> none;
    return none;
  }
  std::shared_ptr<std::vector<T>> v_;
};

/** A group of a shared op list (OpList) and the group a rank that shares it runs instead. */
struct GroupPair {
  GroupId copy = kNoGroup;
  GroupId ours = kNoGroup;
};

/** A rank's ops, in issue order. Ranks that issue the same ops, each on its own process groups,
 *  share one copy: a rank's list is that copy plus a map from the copy's group ids to the rank's
 *  own (ranks of different nodes issue the same gathers on their own hpZ groups). Reading gives
 *  an Op by value with the rank's group in `group`, so every reader sees absolute group ids;
 *  writing goes through mut(), which first gives this rank its own copy. */
class OpList {
 public:
  /** Random access over ops by value (Op is small; a reference could not carry the mapped group).
   */
  class const_iterator {
   public:
    using iterator_concept = std::random_access_iterator_tag;
    using iterator_category = std::input_iterator_tag;
    using value_type = Op;
    using difference_type = std::ptrdiff_t;
    using reference = Op;
    const_iterator() = default;
    const_iterator(const OpList* list, std::size_t i) : list_(list), i_(i) {}
    Op operator*() const { return (*list_)[i_]; }
    Op operator[](difference_type n) const {
      return (*list_)[static_cast<std::size_t>(static_cast<difference_type>(i_) + n)];
    }
    const_iterator& operator++() { return ++i_, *this; }
    const_iterator operator++(int) { return {list_, i_++}; }
    const_iterator& operator--() { return --i_, *this; }
    const_iterator operator--(int) { return {list_, i_--}; }
    const_iterator& operator+=(difference_type n) {
      i_ = static_cast<std::size_t>(static_cast<difference_type>(i_) + n);
      return *this;
    }
    const_iterator& operator-=(difference_type n) { return *this += -n; }
    friend const_iterator operator+(const_iterator it, difference_type n) { return it += n; }
    friend const_iterator operator+(difference_type n, const_iterator it) { return it += n; }
    friend const_iterator operator-(const_iterator it, difference_type n) { return it -= n; }
    friend difference_type operator-(const const_iterator& a, const const_iterator& b) {
      return static_cast<difference_type>(a.i_) - static_cast<difference_type>(b.i_);
    }
    friend bool operator==(const const_iterator& a, const const_iterator& b) {
      return a.i_ == b.i_;
    }
    friend auto operator<=>(const const_iterator& a, const const_iterator& b) {
      return a.i_ <=> b.i_;
    }

   private:
    const OpList* list_ = nullptr;
    std::size_t i_ = 0;
  };
  using value_type = Op;

  std::size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }
  Op operator[](std::size_t i) const {
    Op op = ops_[i];
    op.group = own_group(op.group);
    return op;
  }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

  /** The shared copy's op i as stored, with the copy's own group: with own_group(), how a
   *  reader sees which of a rank's groups stands for which of another's that shares it. */
  const Op& stored(std::size_t i) const { return ops_[i]; }
  /** This rank's group for the shared copy's group g (stored(i).group). */
  GroupId own_group(GroupId g) const {
    if (!groups_ || g == kNoGroup) return g;
    for (const GroupPair& p : *groups_) {
      if (p.copy == g) return p.ours;
    }
    return kNoGroup;
  }

  /** The ops to write: this rank's own copy, its groups in place. */
  std::vector<Op>& mut();
  void push_back(const Op& op) { mut().push_back(op); }

  /** True when both read one shared copy (with their own groups, perhaps). */
  bool shares_with(const OpList& other) const { return ops_.shares_with(other.ops_); }
  /** Shares `other`'s copy when the two lists are equal but for their groups, and the groups
   *  correspond one for one (each of other's groups is always this list's same group); true
   *  when they share afterwards. */
  bool share_if_same(const OpList& other);
  /** `like`'s shared copy, each of the copy's groups run as the group `groups` pairs it with
   *  (every group the copy's ops name must be paired; pairs of a group with itself may be left
   *  out only when all are): how a builder gives a rank another's ops on its own groups. */
  static OpList sharing(const OpList& like, std::vector<GroupPair> groups);

 private:
  friend class OpMatcher;
  SharedVector<Op> ops_;
  /** The copy's groups this rank runs as others: a copy's ops run on a few groups (the world,
   *  the hpZ group, the qgZ pair, the gradients' group), so a short list, not a table over the
   *  world's group ids (one per node: at 200,000 ranks of tiny.toml, 400 KB a rank). Null: the
   *  same groups. */
  std::shared_ptr<const std::vector<GroupPair>> groups_;
};

/** Matches a rank's ops, one at a time as a builder issues them, against another rank's list:
 *  equal at each place but for the group, each of the list's groups always standing for one and
 *  the same group of ours (OpList::share_if_same's rule). While they match the rank keeps no ops
 *  of its own; at the end shared() gives the rank's list as the other's copy with our groups. */
class OpMatcher {
 public:
  explicit OpMatcher(const OpList& like) : like_(&like) {}
  /** Takes our next op; false (from then on) once it differs from the list's op there. */
  bool add(const Op& ours);
  /** True while every op so far matched. */
  bool matching() const { return ok_; }
  /** Ops matched so far. */
  std::size_t matched() const { return matched_; }
  /** Our ops so far, our groups in place: the list's first matched() ops. */
  std::vector<Op> prefix() const;
  /** True when every op of the list was matched, and nothing else taken. */
  bool complete() const { return ok_ && matched_ == like_->size(); }
  /** The number of ops in the list matched against. */
  std::size_t like_size() const { return like_->size(); }
  /** Our list as the other's copy with our groups; only when complete(). */
  OpList shared() const;

 private:
  const OpList* like_;
  std::size_t matched_ = 0;
  bool ok_ = true;
  bool identity_ = true;
  std::vector<GroupPair> map_;  ///< our group for each of the copy's groups seen so far
};

/** A rank's accesses, which ops point into by access_begin/access_count. Ranks that share an op
 *  list issue their accesses at the same indices, and most of them equal: at 16 GPUs of the
 *  shipped 70B scenario 7,058 of a rank's 76,360 accesses differ from rank 0's (a rank's own
 *  slice of a gathered or reduced parameter sits at its own offset). So a list is a base that
 *  ranks share plus this rank's own copy of each op's accesses (a block) that differ from the
 *  base's: at 1,024 ranks that is the difference between 2.4 GiB and a few hundred MiB. Reading
 *  an op's block stays one contiguous span; writing goes through mut(), which first makes the
 *  list one plain vector of this rank's own. */
class AccessList {
 public:
  /** Reads every access in index order, each block's own copy in place of the base's. */
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Access;
    using difference_type = std::ptrdiff_t;
    using pointer = const Access*;
    using reference = const Access&;
    const_iterator() = default;
    const_iterator(const AccessList* list, std::size_t i);
    const Access& operator*() const;
    const Access* operator->() const { return &**this; }
    const_iterator& operator++();
    const_iterator operator++(int) {
      const_iterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const const_iterator& a, const const_iterator& b) {
      return a.i_ == b.i_;
    }

   private:
    const AccessList* list_ = nullptr;
    std::size_t i_ = 0;
    std::size_t block_ = 0;  ///< the first own block that does not end at or before i_
  };
  using value_type = Access;

  AccessList() = default;
  AccessList(std::vector<Access> plain) { base_.mut() = std::move(plain); }  // NOLINT
  AccessList& operator=(std::vector<Access> plain) {
    *this = AccessList(std::move(plain));
    return *this;
  }

  std::size_t size() const { return base_.size(); }
  bool empty() const { return size() == 0; }
  /** Access i: this rank's own where its block differs from the base's. */
  const Access& operator[](std::size_t i) const;
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }
  /** The `count` accesses from `begin`, one op's (a block never straddles an own block's edge). */
  std::span<const Access> block(std::uint32_t begin, std::uint32_t count) const;
  /** Reads blocks as block() does, in ascending order of their starts, each in constant time
   *  (block() searches the own blocks): a walk over many ranks' blocks (rank_classes). */
  class BlockReader {
   public:
    explicit BlockReader(const AccessList& list) : list_(&list) {}
    std::span<const Access> block(std::uint32_t begin, std::uint32_t count);

   private:
    const AccessList* list_;
    std::size_t k_ = 0;  ///< no own block before k_ ends after the last begin read
  };
  /** The index of an access read through operator[], block() or an iterator. */
  std::size_t index_of(const Access* a) const;

  /** The accesses to write: this rank's own plain vector. */
  std::vector<Access>& mut();
  void push_back(const Access& a) { mut().push_back(a); }
  void reserve(std::size_t n) { mut().reserve(n); }
  void shrink_to_fit() { mut().shrink_to_fit(); }

  /** Shares `base`'s list where ops' blocks are equal, keeping own copies of those that are
   *  not. `ops` must be this list's ops and issue every access at the index `base`'s ops do
   *  (it shares base's op list: OpList::shares_with); does nothing otherwise. */
  void share_blocks(const AccessList& base, const OpList& ops, const OpList& base_ops);
  /** True when both read one shared base. */
  bool shares_with(const AccessList& other) const { return base_.shares_with(other.base_); }
  /** The shared base's `count` accesses from `begin`, whatever this list keeps of its own. */
  std::span<const Access> base_block(std::uint32_t begin, std::uint32_t count) const {
    return std::span<const Access>(base_.get()).subspan(begin, count);
  }
  /** A list that reads `other`'s shared base with no blocks of its own; add_own_block() then
   *  puts its own in, ascending. */
  static AccessList on_base_of(const AccessList& other);
  /** Reads `values` at the indices from `begin` on instead of the base's. Blocks go in
   *  ascending and disjoint, inside the list; throws std::logic_error otherwise. */
  void add_own_block(std::uint32_t begin, std::span<const Access> values);
  /** The accesses this rank keeps of its own (in blocks that differ from the shared base). */
  std::size_t own_count() const { return own_.size(); }
  /** Calls f(begin, end) for the index range of each block of its own, ascending: outside
   *  them the list reads its base. */
  template <class F>
  void for_each_own_range(F&& f) const {
    for (std::size_t k = 0; k < own_begin_.size(); ++k) f(std::size_t{own_begin_[k]}, own_end(k));
  }

 private:
  /** The own block holding index i, or own_begin_.size(). */
  std::size_t own_block(std::size_t i) const;
  /** One past the last base index own block k replaces. */
  std::size_t own_end(std::size_t k) const {
    return std::size_t{own_begin_[k]} + (own_at_[k + 1] - own_at_[k]);
  }

  SharedVector<Access> base_;
  // Own blocks, ascending and disjoint: block k replaces base indices from own_begin_[k] on
  // with own_[own_at_[k] .. own_at_[k + 1]) (own_at_ ends with own_.size(); empty with no
  // blocks).
  std::vector<std::uint32_t> own_begin_;
  std::vector<std::uint32_t> own_at_;
  std::vector<Access> own_;
};

/** A stream of one rank. */
struct Stream {
  std::string name;  ///< "S0", "S_ag", "S_nccl", "S_rs"
};

/** Everything one rank's host issues, in order. */
struct RankSchedule {
  Rank rank = 0;
  std::vector<Stream> streams;
  SharedVector<Buffer> buffers;  ///< shared between ranks with equal buffer tables
  AccessList accesses;           ///< ops point into this by access_begin/access_count
  OpList ops;
};

/** Lets rank r share rank `base`'s op list (OpList::share_if_same) and buffer table where they
 *  are equal: what builders call after building each rank, so that a large world's schedule
 *  holds one copy of what its ranks issue alike. */
void share_alike(RankSchedule& r, const RankSchedule& base);

/** What a process group is for. */
enum class GroupKind : std::uint8_t {
  kWorld,      ///< all data-parallel ranks
  kHpz,        ///< a block of P' contiguous ranks (normally one node)
  kInterNode,  ///< ranks with the same local index on every node (qgZ second all-to-all)
  kIntraNode,  ///< the ranks of one node (qgZ first all-to-all)
};

/** A process group with its member ranks (ascending). */
struct Group {
  std::string name;
  GroupKind kind = GroupKind::kWorld;
  std::vector<Rank> ranks;
};

/** A parameter unit: the parameters DeepSpeed fetches together for one module. */
struct ParamUnit {
  std::string name;                   ///< e.g. "layers.12.attn"
  std::int32_t layer = -1;            ///< decoder layer, -1 for embedding / head
  std::uint64_t numel = 0;            ///< elements
  std::uint64_t padded_numel = 0;     ///< rounded up to a multiple of the world size
  std::uint64_t shard_numel = 0;      ///< padded_numel / P
  std::uint64_t secondary_numel = 0;  ///< padded_numel / P' (0 when hpZ is off)
  double forward_flops = 0;           ///< per micro-step, whole module, per rank
  bool persistent = false;            ///< below the persistence threshold: never partitioned
};

/** The whole schedule: every rank, the groups and the parameter units. */
struct Schedule {
  std::string scenario;  ///< file it was built from
  std::string variant;   ///< stock | host-sync | event-wait
  int world_size = 0;
  int hpz_size = 1;
  int dtype_bytes = 2;
  std::vector<ParamUnit> units;
  std::vector<Group> groups;
  std::vector<RankSchedule> ranks;  ///< ranks[r].rank == r
  std::vector<std::string> labels;  ///< Op::label indexes this ("model.layers.0.self_attn")
  /** Where a recorded schedule came from ("recorder", "deepspeed", "command", ...); empty for
   *  a built one. */
  std::map<std::string, std::string> source;
  /** True when the schedule holds every allocation and free of its buffers, on the stream
   *  current at each, and every record_stream call: the caching allocator's reuse can be
   *  modelled (a recording made with `hpzlab record` since it captures them). False for
   *  schedules whose buffers stand for some tensors only: the checker then takes lifetimes
   *  as independent memory, as it always did. */
  bool allocator = false;

  /** The accesses of one op of rank r. */
  std::span<const Access> accesses_of(Rank r, const Op& op) const {
    return ranks[r].accesses.block(op.access_begin, op.access_count);
  }

  /** The parameter unit an access of rank r's op touches: its buffer's unit, or the op's where
   *  the buffer holds no one unit (a flat buffer of several); kNoUnit when neither names one.
   *  The builder names both; a recording names only the buffer (autograd's kernels serve no
   *  parameter the recorder could see). */
  UnitId unit_of(Rank r, const Op& op, const Access& a) const {
    const UnitId own = ranks[r].buffers[a.buffer].unit;
    return own != kNoUnit ? own : op.unit;
  }

  /** A recording's optimizer step: the CPU AdamW's kernels on DeepSpeed's flat fp32 partition
   *  name no parameter, and this copy (an optimizer-step op of no unit that reads something and
   *  writes some unit's primary shard) writes every primary shard back from that partition
   *  (_reassign_or_swap_out_partitioned_parameters, stage3.py at v0.13.4). The data replay and
   *  the real executor's plan step each shard it writes there. */
  bool is_primary_write_back(Rank r, const Op& op) const {
    if (op.purpose != Purpose::kOptimizerStep || op.unit != kNoUnit) return false;
    bool reads = false, primary = false;
    for (const Access& a : accesses_of(r, op)) {
      const Buffer& b = ranks[r].buffers[a.buffer];
      reads = reads || a.mode == AccessMode::kRead;
      primary = primary || (a.mode == AccessMode::kWrite && b.role == BufferRole::kPrimary &&
                            b.unit != kNoUnit);
    }
    return reads && primary;
  }
};

/** True for a recording of real DeepSpeed (`hpzlab record`: Schedule::source names the
 *  recorder), whose ranks past the recorded ones may be copies (recorded_ranks). */
inline bool is_recording(const Schedule& s) {
  return s.source.count("recorder") > 0;
}

/** True when some access of the schedule is strided (Access::count > 1). */
bool has_strided_accesses(const Schedule& schedule);

/** The schedule with every strided access written out as its slices, one plain access each, in
 *  the same place among the op's accesses. Ops keep their indices; a rank whose accesses move
 *  gets its own op list. */
Schedule unfold_strided(const Schedule& schedule);

/** True when some op is a reproduction's spin (Purpose::kReproSpin). */
bool has_repro_spins(const Schedule& schedule);

/** The schedule with a spin kernel of `us` microseconds (Purpose::kReproSpin, no memory
 *  touched) on the copy's stream right before every secondary copy of a training step, as the
 *  DeepSpeed builder issues `run.spin_before_copy_us` (sim/deepspeed/partition.cpp): how a
 *  reproduction on a GPU widens the race window, for a schedule read from a file (a
 *  recording). Ops after an inserted spin move one place down. */
Schedule with_spin_before_secondary_copies(const Schedule& schedule, double us);

/** True for the four collective kinds. */
bool is_collective(OpKind kind);

/** True for the kinds that block the host thread: stream, device and event syncs. */
bool is_host_sync(OpKind kind);

/** True for an op the host thread does itself (no stream runs it): host syncs, ops on
 *  kHostStream and kRecordStream, whose `stream` names the stream it records. */
bool on_host(const Op& op);

/** The optimizer steps a schedule covers: its largest op step + 1 (at least 1). */
int step_count(const Schedule& schedule);

/** How reports name a schedule: its variant and, for DeepSpeed's own schedules (Schedule::source),
 *  the version, "built" by the DeepSpeed builder or "recorded" by `hpzlab record`: e.g. "stock,
 *  DeepSpeed 0.13.4 built". "?" for an empty variant. */
std::string schedule_label(const std::string& variant,
                           const std::map<std::string, std::string>& source);

/** Names for printing and JSON; the parse_* functions throw InputError on unknown names. */
std::string_view to_string(OpKind k);
std::string_view to_string(Phase p);
std::string_view to_string(Purpose p);
std::string_view to_string(BufferRole r);
std::string_view to_string(GroupKind k);
OpKind parse_op_kind(std::string_view s);
Phase parse_phase(std::string_view s);
Purpose parse_purpose(std::string_view s);
BufferRole parse_buffer_role(std::string_view s);
GroupKind parse_group_kind(std::string_view s);

}  // namespace hpz
