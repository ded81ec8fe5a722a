"""The recording -> hpzlab's schedule IR (the JSON that sim/ir/schedule_json.cpp reads).

Buffers. Each storage lifetime becomes IR buffers: one per claimed parameter tensor in it
(primary shard, secondary shard, gathered parameter, with its unit), or, for a storage DeepSpeed
never handed to a parameter, one scratch buffer for the whole storage. Padding (DeepSpeed rounds
each parameter up to a multiple of the world size) is never meaningful, so accesses to it are
dropped, as the IR requires (sim/ir/schedule.hpp): bytes of a claimed storage outside every claim,
a shard's elements past the parameter's end (a claim's valid_end), and storages DeepSpeed
allocates as padding only (Lifetime.padding).

Kernels. Consecutive kernels (or copies) on one stream, issued with nothing else in between
and in the same context (module, phase, purpose), become one IR op whose accesses are the union
of theirs; a byte the group writes before it reads it is internal to the group and is not a read.
A buffer that lives and dies inside one such op disappears. Host order, stream order, events,
syncs, collectives, allocations and frees of parameter tensors stay exactly as recorded.

Allocator mode (--allocator, "allocator": true in the document). Every storage's deallocation is
logged (recording.Recording.start_allocator), every buffer is kept with its alloc and free,
intermediates included, and each Tensor.record_stream call is an op {"kind": "record_stream",
"stream": S, "buffer": B, ...} per IR buffer of the tensor's storage (the allocator's block): what
PyTorch's caching allocator needs to pick and reuse blocks (sim/check/allocator.hpp).

Other ranks. DeepSpeed's host logic does not depend on the rank beyond its slices' bounds:
every rank runs the same module hooks, the same coordinator decisions and the same collectives
on its own groups. So rank r's schedule is the recorded rank's with each process group replaced
by the group of the same kind that contains r, written as {"rank": r, "like": R, "groups":
[[g, g'], ...]}, byte offsets the recorded rank's. Where padding makes some ranks' slices
shorter, the CLI records one rank of each kind and takes each rank from its kind's recording
(cli.record_ranks, docs/record.md).
"""
from __future__ import annotations

import bisect
from typing import Optional

from . import recording

_PURPOSE_IN_CONTEXT = {
    # (context purpose, entry kind) -> IR purpose
    ("secondary_partition_copy", "alloc"): "secondary_alloc",
    ("secondary_partition_copy", "free"): "secondary_alloc",  # allocator mode: a replaced one
    ("secondary_partition_copy", "host_stream_sync"): "fix_host_sync",
    ("fetch_wait", "kernel"): "param_fetch",
    ("fetch_wait", "copy"): "param_fetch",
    ("fetch_wait", "host_event_sync"): "host_throttle",
    ("grad_reduce", "host_event_sync"): "host_throttle",
    ("grad_reduce", "host_stream_sync"): "host_throttle",
}

_COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}


class _Buffers:
    """IR buffers of one rank, made from storage lifetimes on first use."""

    def __init__(self, rec: recording.Recording) -> None:
        self.rec = rec
        self.table: list[dict] = []
        self.of_lifetime: dict[int, list] = {}  # lifetime -> [(begin, end, buffer)]
        self.starts: dict[int, list] = {}

    def regions(self, life_id: int) -> list:
        """(begin, end, buffer) of a lifetime, sorted; buffers are created here."""
        if life_id not in self.of_lifetime:
            life = self.rec.lifetimes[life_id]
            regions = []
            if life.claims:
                at = 0
                for begin, end, role, unit, valid_end in sorted(life.claims):
                    if self.rec.allocator and begin > at:
                        regions.append(self._padding(life_id, at, begin))
                    name = f"{self.rec.units[unit]['name']}.{role}"
                    regions.append((begin, end, self._new(name, role, unit, end - begin),
                                    valid_end))
                    at = max(at, end)
                if self.rec.allocator and life.nbytes > at:
                    regions.append(self._padding(life_id, at, life.nbytes))
            else:
                valid_end = 0 if life.padding else life.nbytes
                regions.append((0, life.nbytes, self._new(f"tensor{life_id}", "scratch", -1,
                                                          life.nbytes), valid_end))
            self.of_lifetime[life_id] = regions
            self.starts[life_id] = [r[0] for r in regions]
        return self.of_lifetime[life_id]

    def _padding(self, life_id: int, begin: int, end: int) -> tuple:
        """Allocator mode: bytes of a claimed storage outside every claim, as a buffer of their
        own that no access reaches, so that a storage's buffers add up to its size (the block
        the caching allocator hands out)."""
        return (begin, end, self._new(f"tensor{life_id}.padding{begin}", "scratch", -1,
                                      end - begin), begin)

    def _new(self, name: str, role: str, unit: int, nbytes: int) -> int:
        self.table.append({"name": name, "role": role, "bytes": nbytes, "unit": unit})
        return len(self.table) - 1

    def split(self, access: tuple) -> list:
        """A recorded access as IR accesses [buffer, mode, offset, bytes] (padding dropped)."""
        life_id, mode, begin, end = access
        regions = self.regions(life_id)
        out = []
        i = max(0, bisect.bisect_right(self.starts[life_id], begin) - 1)
        for r_begin, r_end, buf, valid_end in regions[i:]:
            if r_begin >= end:
                break
            lo, hi = max(begin, r_begin), min(end, valid_end)
            if lo < hi:
                out.append([buf, mode, lo - r_begin, hi - lo])
        return out


def _purpose(entry: recording.Entry) -> str:
    return _PURPOSE_IN_CONTEXT.get((entry.ctx.purpose, entry.kind), entry.ctx.purpose)


def _base(entry: recording.Entry, kind: str) -> dict:
    ctx = entry.ctx
    op = {"kind": kind, "phase": ctx.phase, "purpose": _purpose(entry), "stream": entry.stream,
          "step": ctx.step}
    if ctx.micro_step:
        op["micro_step"] = ctx.micro_step
    if ctx.unit >= 0:
        op["unit"] = ctx.unit
    if ctx.label >= 0:
        op["label"] = ctx.label
    return op


def _union(intervals: list) -> list:
    intervals.sort()
    out: list = []
    for lo, hi in intervals:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _subtract(lo: int, hi: int, covered: list) -> list:
    """Parts of [lo, hi) not in the sorted, disjoint `covered` intervals."""
    out, at = [], lo
    for c_lo, c_hi in covered:
        if c_hi <= at or c_lo >= hi:
            continue
        if c_lo > at:
            out.append((at, c_lo))
        at = max(at, c_hi)
    if at < hi:
        out.append((at, hi))
    return out


class _KernelGroup:
    """Consecutive kernels of one stream and context, folded into one IR op."""

    def __init__(self, entry: recording.Entry, kind: str) -> None:
        self.first = entry
        self.kind = kind
        self.reads: dict[int, list] = {}
        self.writes: dict[int, list] = {}
        self.flops = 0.0
        self.mem_bytes = 0.0

    def fits(self, entry: recording.Entry, kind: str) -> bool:
        return (kind == self.kind and entry.stream == self.first.stream
                and entry.ctx == self.first.ctx)

    def add(self, entry: recording.Entry, accesses: list) -> None:
        for buf, mode, off, n in accesses:
            if mode == recording.READ:
                for lo, hi in _subtract(off, off + n, _union(list(self.writes.get(buf, [])))):
                    self.reads.setdefault(buf, []).append((lo, hi))
        for buf, mode, off, n in accesses:
            if mode == recording.WRITE:
                self.writes.setdefault(buf, []).append((off, off + n))
        self.flops += entry.flops
        self.mem_bytes += entry.mem_bytes

    def op(self) -> dict:
        op = _base(self.first, self.kind)
        accesses = []
        # Buffers in the order the group first touched them, not by number: torch.cat's
        # tensors in its order, which a data replay follows to place each read in the write.
        for mode, table in ((recording.READ, self.reads), (recording.WRITE, self.writes)):
            for buf in table:
                accesses += [[buf, mode, lo, hi - lo] for lo, hi in _union(table[buf])]
        if accesses:
            op["accesses"] = accesses
        if self.flops:
            op["flops"] = self.flops
        if self.mem_bytes:
            op["mem_bytes"] = self.mem_bytes
        return op


def rank_ops(rec: recording.Recording) -> tuple[list, list]:
    """The recorded rank's IR ops and buffers."""
    buffers = _Buffers(rec)
    ops: list = []
    freed: set = set()
    group: Optional[_KernelGroup] = None

    def flush() -> None:
        nonlocal group
        if group is not None:
            ops.append(group.op())
            group = None

    for e in rec.entries:
        if e.kind in ("kernel", "copy"):
            accesses = [a for acc in e.accesses for a in buffers.split(acc)]
            accesses = [a for a in accesses if a[0] not in freed]
            if not accesses and not e.flops:
                continue
            if group is None or not group.fits(e, e.kind):
                flush()
                group = _KernelGroup(e, e.kind)
            group.add(e, accesses)
            continue
        flush()
        if e.kind == "alloc":
            for _, _, buf, _ in buffers.regions(e.lifetime):
                freed.discard(buf)
                ops.append(dict(_base(e, "alloc"), buffer=buf, fill=e.fill))
        elif e.kind == "free":
            for r_begin, r_end, buf, _ in buffers.regions(e.lifetime):
                if r_begin < e.region[1] and e.region[0] < r_end and buf not in freed:
                    freed.add(buf)
                    ops.append(dict(_base(e, "free"), buffer=buf))
        elif e.kind == "record_stream":  # allocator mode only (stand_ins.record_stream_as_recorded)
            # recordStream marks the block of the storage's data pointer, whatever bytes the
            # view spans (CUDACachingAllocator.cpp recordStream -> get_allocated_block): every
            # buffer of the storage.
            for _, _, buf, _ in buffers.regions(e.lifetime):
                if buf not in freed:
                    ops.append(dict(_base(e, "record_stream"), buffer=buf))
        elif e.kind in _COLLECTIVES:
            op = _base(e, e.kind)
            op["group"] = e.group
            op["comm_bytes"] = e.comm_bytes
            accesses = [a for acc in e.accesses for a in buffers.split(acc)]
            if accesses:
                op["accesses"] = accesses
            ops.append(op)
        elif e.kind in ("event_record", "stream_wait_event", "host_event_sync"):
            ops.append(dict(_base(e, e.kind), event=e.event))
        else:  # host_stream_sync, host_device_sync
            ops.append(_base(e, e.kind))
    flush()
    if rec.allocator:  # every allocation and free stays, with its size: the allocator's blocks
        return ops, [{k: v for k, v in b.items() if not (k == "unit" and v < 0)}
                     for b in buffers.table]
    return _drop_internal_buffers(ops, buffers.table)


def _drop_internal_buffers(ops: list, table: list) -> tuple[list, list]:
    """Removes buffers that only their allocation, their free and writes of one op touch:
    intermediates of a folded kernel group (nobody else reads them). A parameter tensor
    (primary, secondary, full) is kept even when nothing touches it: DeepSpeed allocated it (a
    secondary its copy bounds leave unwritten and nothing reads before it is invalidated)."""
    users: dict[int, set] = {}
    read: set = set()
    for i, op in enumerate(ops):
        for buf, mode, _, _ in op.get("accesses", []):
            users.setdefault(buf, set()).add(i)
            if mode == recording.READ:
                read.add(buf)
    keep = {b for b in users if b in read or len(users[b]) > 1}
    keep |= {b for b, entry in enumerate(table) if entry["role"] != "scratch"}
    renumber = {old: new for new, old in enumerate(sorted(keep))}
    out = []
    for op in ops:
        if op["kind"] in ("alloc", "free"):
            if op["buffer"] not in renumber:
                continue
            op["buffer"] = renumber[op["buffer"]]
        if "accesses" in op:
            op["accesses"] = [[renumber[b], m, o, n] for b, m, o, n in op["accesses"]
                              if b in renumber]
            if not op["accesses"]:
                del op["accesses"]
                if op["kind"] in ("kernel", "copy") and not op.get("flops"):
                    continue
        out.append(op)
    buffers = []
    for old in sorted(keep):
        b = {k: v for k, v in table[old].items() if not (k == "unit" and v < 0)}
        buffers.append(b)
    return out, buffers


def _group_kind(g: recording.Group, world: int, per_node: int) -> str:
    ranks = list(g.ranks)
    # By the DeepSpeed function that made the group first: on one node hpZ's group (with
    # zero_hpz_partition_size equal to the world) and qgZ's intra-node group (groups.py:356
    # _get_local_all_to_all_group: 'local_0', the node's ranks) hold every rank, and are still
    # not the world's (until 2026-11-26 they were named as further world groups, which shifted
    # the names of the real ones).
    if "zero_param" in g.creator:
        return "hpz"
    if "all_to_all" in g.creator:
        inter = len(ranks) > 1 and all(b - a == per_node for a, b in zip(ranks, ranks[1:]))
        return "inter_node" if inter else "intra_node"
    if len(ranks) == world:
        return "world"
    if len(ranks) > 1 and all(b - a == per_node for a, b in zip(ranks, ranks[1:])):
        return "inter_node"
    return "intra_node"


def groups_table(rec: recording.Recording, per_node: int) -> list:
    """Every process group DeepSpeed made, with the IR's kind and a readable name."""
    out, count = [], {}
    for g in rec.groups:
        kind = _group_kind(g, rec.world_size, per_node)
        n = count.get(kind, 0)
        count[kind] = n + 1
        name = "world" if kind == "world" and n == 0 else f"{kind}{n}"
        out.append({"name": name, "kind": kind, "ranks": list(g.ranks), "creator": g.creator})
    return out


def _stream_names(rec: recording.Recording, groups: list) -> list:
    """Stream names, each NCCL stream named after its group's kind ("nccl.hpz"), and after
    the DeepSpeed function that made the group where two share a kind
    ("nccl.world.clone_world_group"): the same on every rank."""
    names = list(rec.streams)
    kinds = [groups[i]["kind"] for i, g in enumerate(rec.groups) if g.stream >= 0]
    for i, g in enumerate(rec.groups):
        if g.stream >= 0:
            kind = groups[i]["kind"]
            shared = kinds.count(kind) > 1 and g.creator != "world"
            names[g.stream] = f"nccl.{kind}" + (f".{g.creator}" if shared else "")
    return names


def _group_map(groups: list, recorded: int, rank: int) -> dict:
    """For rank `rank`: each group the recorded rank uses -> the group of the same kind (and
    made by the same DeepSpeed function) that contains `rank`."""
    out = {}
    for i, g in enumerate(groups):
        if recorded not in g["ranks"]:
            continue
        match = [j for j, h in enumerate(groups) if h["kind"] == g["kind"]
                 and h["creator"] == g["creator"] and len(h["ranks"]) == len(g["ranks"])
                 and rank in h["ranks"]]
        out[i] = match[0] if match else i
    return out


def schedule(rec: recording.Recording, per_node: int, source: dict, variant: str,
             dtype_bytes: int, hpz: int) -> dict:
    """The whole hpzlab-schedule document: the recorded rank, and every other by symmetry."""
    ops, buffers = rank_ops(rec)
    groups = groups_table(rec, per_node)
    streams = _stream_names(rec, groups)
    ranks = []
    for r in range(rec.world_size):
        if r == rec.rank:
            ranks.append({"rank": r, "streams": streams, "buffers": buffers, "ops": ops})
        else:  # the recorded rank's schedule on this rank's own groups (schedule_json.cpp)
            mapping = sorted(_group_map(groups, rec.rank, r).items())
            ranks.append({"rank": r, "like": rec.rank, "groups": [[a, b] for a, b in mapping]})
    doc = {
        "format": "hpzlab-schedule", "version": 1, "scenario": source.get("command", ""),
        "variant": variant, "world_size": rec.world_size, "hpz_size": hpz,
        "dtype_bytes": dtype_bytes, "source": source, "labels": rec.labels, "units": rec.units,
        "groups": [{k: g[k] for k in ("name", "kind", "ranks")} for g in groups],
        "ranks": ranks
    }
    if rec.allocator:  # the checker applies its caching-allocator rules to this recording only
        doc["allocator"] = True
    return doc
