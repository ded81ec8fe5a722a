"""The event log of one recorded rank: what its host thread issued, in order.

Every entry carries the context it was issued in (phase, purpose, step, micro-step, the module
whose DeepSpeed hook was running, the parameter in focus). Tensors are tracked by storage
lifetime: a storage seen as the fresh output of an op starts a lifetime; every access is a byte
range of one lifetime. DeepSpeed's parameter tensors (primary shard, secondary shard, gathered
parameter) are *claimed* regions of a lifetime, so that the IR writer can give them their roles.
A claim's bytes past its parameter's own elements, and a storage DeepSpeed allocates as padding
only, are padding: the IR writer drops accesses to them (sim/ir/schedule.hpp: accesses cover only
meaningful bytes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Iterator, Optional

import torch

# Phases and purposes use the IR's names (sim/ir/schedule.cpp to_string).
FORWARD, BACKWARD, GRAD_REDUCE, OPTIMIZER, INIT = ("forward", "backward", "grad_reduce",
                                                   "optimizer", "init")
# The phase, and the purpose, of a checkpoint's load (kPhaseNames and kPurposeNames there).
CHECKPOINT_LOAD = "checkpoint_load"

READ, WRITE = "r", "w"


@dataclasses.dataclass(frozen=True)
class Context:
    """Where in training an entry was issued."""
    phase: str = INIT
    purpose: str = "param_init"
    step: int = -1
    micro_step: int = 0
    label: int = -1  # index into Recording.labels: the module whose hook was running
    unit: int = -1  # the parameter in focus (index into Recording.units), -1 none


@dataclasses.dataclass
class Entry:
    """One thing the host issued. `kind` uses the IR's op kind names."""
    kind: str
    stream: int  # index into Recording.streams, -1 for the host
    ctx: Context
    accesses: list = dataclasses.field(default_factory=list)  # (lifetime, mode, begin, end)
    event: int = -1
    group: int = -1
    lifetime: int = -1  # alloc / free / record_stream
    region: Optional[tuple] = None  # free, record_stream: (begin, end) bytes of the lifetime
    fill: str = ""
    flops: float = 0.0
    mem_bytes: float = 0.0
    comm_bytes: int = 0
    aten: str = ""  # the aten op, for kernels and copies


@dataclasses.dataclass
class Lifetime:
    """One allocation: a storage from the op that created it until it is dropped."""
    nbytes: int
    name: str = ""
    # (begin, end, role, unit, valid_end): bytes [valid_end, end) of a claim are padding
    claims: list = dataclasses.field(default_factory=list)
    padding: bool = False  # made as padding only: nothing in it means anything


@dataclasses.dataclass
class Group:
    """A process group: its ranks, the DeepSpeed function that made it, its NCCL stream."""
    ranks: tuple
    creator: str
    stream: int = -1


class Recording:
    """The log, plus the state of streams and the context stack while DeepSpeed runs."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.entries: list[Entry] = []
        self.streams: list[str] = ["S0"]
        self.current_stream = 0
        self.lifetimes: list[Lifetime] = []
        self.live: dict[int, int] = {}  # StorageImpl address -> lifetime
        self.groups: list[Group] = []
        self.labels: list[str] = []
        self._label_ids: dict[str, int] = {}
        self.units: list[dict] = []
        self.unit_of_param: dict[int, int] = {}  # id(param) -> unit
        self.next_event = 0
        self.ctx = Context()
        self.paused = 0  # > 0 while our own machinery runs tensor ops
        # > 0 while an aten function runs checks that only its CPU kernel makes: their .item()
        # reads are no host sync on a GPU (stand_ins.one_hot_as_on_cuda)
        self.cpu_checks = 0
        self.recomputing = False  # a forward hook fired during backward (checkpointing)
        # > 0 while a DeepSpeed function runs whose empty() allocations are padding only
        # (probes.install: reduce_scatter_coalesced)
        self.padding_allocs = 0
        # Storages that stand for host (CPU) memory in a GPU run: a checkpoint's state dict
        # (hpzrec.load). A copy_ from one of them into device memory makes the host wait for
        # the stream on a GPU (ops.py); empty outside a load.
        self.host_storages: set = set()
        # The allocator mode (--allocator): every storage's deallocation is logged as a free of
        # its whole lifetime, and Tensor.record_stream as a record_stream entry, so that the IR
        # carries what PyTorch's caching allocator needs (each block's alloc, free, streams).
        self.allocator = False
        self.closed = False  # the training loop ended: deallocations are no longer logged
        self._watched: dict[int, int] = {}  # StorageImpl address -> lifetime, until it is freed
        self._held: dict[int, object] = {}  # (polling) address -> our own reference to it
        self._polling = False  # inside poll(): its frees do not poll again
        self.storage_frees = ""  # how deallocations are observed: "finalizer" or "use-count"

    # ----- context -------------------------------------------------------------------------
    def label_id(self, name: str) -> int:
        """The index of a module path in the label table."""
        if name not in self._label_ids:
            self._label_ids[name] = len(self.labels)
            self.labels.append(name)
        return self._label_ids[name]

    @contextlib.contextmanager
    def context(self, **changes) -> Iterator[None]:
        """Issues everything inside with some context fields changed."""
        saved = self.ctx
        self.ctx = dataclasses.replace(saved, **changes)
        try:
            yield
        finally:
            if self._held and not self._polling:
                self.poll()  # use-count: what the block dropped is freed in its context
            self.ctx = saved

    @contextlib.contextmanager
    def paused_ops(self) -> Iterator[None]:
        """Tensor ops inside are the recorder's own, not DeepSpeed's: not logged."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    # ----- streams and events ----------------------------------------------------------------
    def new_stream(self, name: str) -> int:
        """A stream the rank creates (DeepSpeed's, or a process group's NCCL stream)."""
        taken = set(self.streams)
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}.{n}"
        self.streams.append(unique)
        return len(self.streams) - 1

    def push(self, kind: str, stream: int, **fields) -> Entry:
        """Appends one entry with the current context."""
        if self._held and not self._polling:
            self.poll()  # storages dropped since the last entry are freed before it
        ctx = self.ctx
        if self.recomputing and ctx.purpose == "backward_compute":
            ctx = dataclasses.replace(ctx, purpose="recompute_forward")
        entry = Entry(kind=kind, stream=stream, ctx=ctx, **fields)
        self.entries.append(entry)
        return entry

    def record_event(self, stream: int, purpose: Optional[str] = None) -> int:
        """An event recorded on `stream`; returns its id."""
        event = self.next_event
        self.next_event += 1
        with self.context(purpose=purpose or self.ctx.purpose):
            self.push("event_record", stream, event=event)
        return event

    def wait_event(self, stream: int, event: int, purpose: Optional[str] = None) -> None:
        """`stream` waits for `event`."""
        with self.context(purpose=purpose or self.ctx.purpose):
            self.push("stream_wait_event", stream, event=event)

    def wait_stream(self, waiter: int, producer: int, purpose: Optional[str] = None) -> None:
        """CUDA's wait_stream: an event on the producer, waited for on the waiter."""
        if waiter == producer:
            return
        self.wait_event(waiter, self.record_event(producer, purpose), purpose)

    # ----- storages --------------------------------------------------------------------------
    def lifetime_of(self, t: torch.Tensor, fresh: bool = False) -> int:
        """The lifetime of t's storage; a fresh output starts a new one (its address may be a
        dead storage's). A storage first seen as an input was made outside the log (before
        recording, or by code the dispatcher does not show): it starts a lifetime written by
        an 'other' kernel, so that nothing reads it uninitialized."""
        storage = t.untyped_storage()
        key = storage._cdata
        if not fresh and key in self.live:
            life = self.lifetimes[self.live[key]]
            if life.nbytes >= storage.nbytes():
                return self.live[key]
        self.lifetimes.append(Lifetime(nbytes=storage.nbytes()))
        life_id = len(self.lifetimes) - 1
        self.live[key] = life_id
        if self.allocator and not self.closed:
            self._watch(storage, key, life_id)
        if not fresh:
            with self.context(purpose="other"):
                self.push("alloc", self.current_stream, lifetime=life_id, fill="zero")
                self.push("kernel", self.current_stream,
                          accesses=[(life_id, WRITE, 0, storage.nbytes())], aten="(outside)")
        return life_id

    # ----- deallocations (allocator mode) ------------------------------------------------------
    def start_allocator(self) -> None:
        """Turns the allocator mode on, choosing how deallocations are observed.

        From torch 2.2 or so (checked on 2.10.0) a storage's Python object is preserved as a
        tensor's is: `t.untyped_storage()` is the same object for as long as the StorageImpl
        lives, and it dies exactly when the StorageImpl does, so a weakref.finalize on it runs
        at the deallocation ("finalizer"). torch 2.1.2 makes a new Python object at each call,
        which holds a reference of its own, and its weak references never fire (nor survive
        the interpreter's exit): there the recorder holds one reference to each watched storage
        and, before each entry it logs and when a context block ends, frees those whose only
        holder it is (torch._C._storage_Use_Count == 1, "use-count"). Both log a free before
        the first entry issued after the deallocation, in host order."""
        probe = torch.empty(1)
        preserved = probe.untyped_storage() is probe.untyped_storage()
        self.storage_frees = "finalizer" if preserved else "use-count"
        self.allocator = True

    def _watch(self, storage, key: int, life_id: int) -> None:
        if key in self._watched:  # the storage grew (a second lifetime): the old block is freed
            self._storage_freed(key, keep_watching=True)
        self._watched[key] = life_id
        if self.storage_frees == "finalizer":
            if key not in self._held:
                finalizer = weakref.finalize(storage, self._storage_freed, key)
                finalizer.atexit = False
                self._held[key] = finalizer
        else:
            self._held[key] = storage

    def _storage_freed(self, key: int, keep_watching: bool = False) -> None:
        """The storage at `key` was deallocated: a free of its whole current lifetime."""
        life_id = self._watched.get(key)
        if life_id is None:
            return
        if not keep_watching:
            del self._watched[key]
            self._held.pop(key, None)
            if self.live.get(key) == life_id:
                del self.live[key]
        if self.closed:
            return
        self._polling = True
        try:
            self.push("free", self.current_stream, lifetime=life_id,
                      region=(0, self.lifetimes[life_id].nbytes))
        finally:
            self._polling = False

    def poll(self) -> None:
        """use-count: frees the watched storages that only the recorder still holds."""
        if self.storage_frees != "use-count":
            return
        use_count = torch._C._storage_Use_Count
        dropped = [key for key, storage in self._held.items() if use_count(storage._cdata) == 1]
        for key in dropped:
            self._storage_freed(key)

    def close(self) -> None:
        """The training loop ended: what was dropped until now is freed, nothing after."""
        if self.allocator:
            self.poll()
        self.closed = True
        self._held.clear()

    def record_stream(self, t: torch.Tensor, stream: int) -> None:
        """t.record_stream(stream): the caching allocator marks t's whole block (storage) as used
        by `stream`; the IR writer gives one op per IR buffer of the storage, whatever bytes t
        spans (the allocator marks the block of the storage's data pointer). Nothing where
        the storage is empty, as PyTorch does nothing for a null data pointer
        (CUDACachingAllocator recordStream)."""
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return
        span = self.byte_range(t) or (0, storage.nbytes())
        self.push("record_stream", stream, lifetime=self.lifetime_of(t), region=span)

    def byte_range(self, t: torch.Tensor) -> Optional[tuple]:
        """The bytes of its storage a tensor spans, [begin, end); None when empty."""
        if t.numel() == 0:
            return None
        extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        item = t.element_size()
        return (t.storage_offset() * item, (t.storage_offset() + extent) * item)

    def access(self, t: torch.Tensor, mode: str) -> Optional[tuple]:
        """One access of tensor t: (lifetime, mode, begin, end), or None when empty."""
        span = self.byte_range(t)
        if span is None:
            return None
        return (self.lifetime_of(t), mode, span[0], span[1])

    def claim(self, t: Optional[torch.Tensor], role: str, unit: int,
              valid: Optional[int] = None) -> None:
        """Marks t's bytes as a parameter tensor of the IR (primary, secondary, full), of which
        the first `valid` elements (all when None) are the parameter's and the rest padding."""
        if t is None or t.numel() == 0:
            return
        life = self.lifetimes[self.lifetime_of(t)]
        begin, end = self.byte_range(t)
        for c in life.claims:
            if c[0] < end and begin < c[1]:
                return  # first claim wins: a view of a claimed tensor is the same tensor
        valid_end = end if valid is None else min(end, begin + valid * t.element_size())
        life.claims.append((begin, end, role, unit, valid_end))

    # ----- process groups --------------------------------------------------------------------
    def group_id(self, ranks: tuple, creator: str) -> int:
        """The index of a process group, registered at its first sight."""
        for i, g in enumerate(self.groups):
            if g.ranks == ranks and g.creator == creator:
                return i
        self.groups.append(Group(ranks=ranks, creator=creator))
        return len(self.groups) - 1


_current: Optional[Recording] = None


def current() -> Recording:
    """The recording in progress: the accelerator and the dispatch mode are reached from
    DeepSpeed's own calls, which carry no handle of ours, so they find it here."""
    assert _current is not None, "no recording in progress"
    return _current


def start(rank: int, world_size: int) -> Recording:
    """Starts the one recording of this process."""
    global _current
    _current = Recording(rank, world_size)
    return _current
