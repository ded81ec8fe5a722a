"""torch.distributed's collectives, logged as ProcessGroupNCCL issues them, nothing sent.

PyTorch 2.1's ProcessGroupNCCL (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, collective()
and WorkNCCL::synchronizeStreams) keeps one NCCL stream per process group and device. A
collective records an event on the caller's current stream and makes the group's NCCL stream
wait on it, runs on the NCCL stream, and records an end event there; the work handle's wait()
makes the stream current at that moment wait on the end event (the host does not block). A call
with async_op=False waits at once. The fake process group communicates nothing, so these
wrappers replace the calls: they log the collective with the bytes it reads and writes, and fill
the outputs with this rank's own data (finite and deterministic; the values mean nothing).

The IR has no broadcast: a broadcast is logged as an all-reduce of the same bytes (every member
reads and writes the buffer; while a checkpoint is loaded, a rank other than the source only
writes it, as NCCL's receivers do), and a barrier as a 4-byte all-reduce whose wait blocks the host,
as ProcessGroupNCCL's barrier does.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
import torch.distributed as dist

from . import recording
from .recording import READ, WRITE


class RecordedWork:
    """The handle of an async collective: wait() orders the current stream after it."""

    def __init__(self, group: int, end_event: int, host_blocks: bool = False) -> None:
        self.group = group
        self.end_event = end_event
        self.host_blocks = host_blocks

    def wait(self, timeout=None) -> bool:
        rec = recording.current()
        with rec.context(purpose=_handshake_purpose(rec)):
            rec.wait_event(rec.current_stream, self.end_event)
            if self.host_blocks:
                rec.push("host_stream_sync", rec.current_stream)
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut


def _handshake_purpose(rec: recording.Recording) -> str:
    return "nccl_handshake" if rec.ctx.purpose in ("param_fetch", "prefetch") else rec.ctx.purpose


def _group_of(group) -> int:
    rec = recording.current()
    if group is None or group is dist.GroupMember.WORLD:
        ranks = tuple(range(rec.world_size))
        return rec.group_id(ranks, "world")
    ranks = tuple(dist.get_process_group_ranks(group))
    creator = _creators.get(id(group), "new_group")
    return rec.group_id(ranks, creator)


def _nccl_stream(gid: int) -> int:
    rec = recording.current()
    g = rec.groups[gid]
    if g.stream < 0:
        g.stream = rec.new_stream("nccl." + ("world" if g.creator == "world" else g.creator))
    return g.stream


def _issue(kind: str, group, reads, writes, comm_bytes: int, async_op: bool,
           host_blocks: bool = False) -> Optional[RecordedWork]:
    rec = recording.current()
    gid = _group_of(group)
    stream = _nccl_stream(gid)
    caller = rec.current_stream
    # Looked up before the handshake: a tensor first seen here gets its initial write on the
    # caller's stream, which the handshake then orders before the collective.
    accesses = [a for a in (rec.access(t, READ) for t in reads) if a is not None]
    accesses += [a for a in (rec.access(t, WRITE) for t in writes) if a is not None]
    with rec.context(purpose=_handshake_purpose(rec)):
        rec.wait_event(stream, rec.record_event(caller))
    rec.push(kind, stream, accesses=accesses, group=gid, comm_bytes=int(comm_bytes))
    with rec.context(purpose=_handshake_purpose(rec)):
        end = rec.record_event(stream)
    work = RecordedWork(gid, end, host_blocks)
    if async_op:
        return work
    work.wait()
    return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _rank_in(group) -> int:
    return dist.get_rank(group) if group is not None else dist.get_rank()


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    work = _issue("all_gather", group, [input_tensor], [output_tensor], _nbytes(input_tensor),
                  async_op)
    with recording.current().paused_ops():
        output_tensor.view(-1, input_tensor.numel()).copy_(input_tensor.reshape(1, -1).clone())
    return work


def all_gather(tensor_list, tensor, group=None, async_op=False):
    work = _issue("all_gather", group, [tensor], list(tensor_list), _nbytes(tensor), async_op)
    with recording.current().paused_ops():
        source = tensor.clone()
        for t in tensor_list:
            t.copy_(source)
    return work


def reduce_scatter_tensor(output, input, op=None, group=None, async_op=False):
    work = _issue("reduce_scatter", group, [input], [output], _nbytes(output), async_op)
    with recording.current().paused_ops():
        output.copy_(input.view(-1, output.numel())[_rank_in(group)].view_as(output).clone())
    return work


def reduce_scatter(output, input_list, op=None, group=None, async_op=False):
    work = _issue("reduce_scatter", group, list(input_list), [output], _nbytes(output), async_op)
    with recording.current().paused_ops():
        output.copy_(input_list[_rank_in(group)])
    return work


def all_reduce(tensor, op=None, group=None, async_op=False):
    return _issue("all_reduce", group, [tensor], [tensor], _nbytes(tensor), async_op)


def all_reduce_coalesced(tensors, op=None, group=None, async_op=False):
    return _issue("all_reduce", group, list(tensors), list(tensors),
                  sum(_nbytes(t) for t in tensors), async_op)


def reduce(tensor, dst, op=None, group=None, async_op=False):
    """NCCL's reduce, logged as an all-reduce (the IR has no reduce) with a reduce's accesses:
    the root (`dst`, a global rank) reads its contribution and writes the sum in place; every
    other member only reads its buffer (ncclReduce leaves it as it was)."""
    root = dist.get_rank() == dst
    return _issue("all_reduce", group, [tensor], [tensor] if root else [], _nbytes(tensor),
                  async_op)


def broadcast(tensor, src, group=None, async_op=False):
    # A rank other than the source receives: NCCL overwrites its buffer without reading it.
    # Logged so only while a checkpoint is loaded (GatheredParameters.__exit__'s broadcast from
    # rank 0, hpzrec.load); zero.Init's and DeepSpeed's other broadcasts keep the all-reduce's
    # read on every rank, which the recordings made before --load carry (docs/record.md).
    rec = recording.current()
    receives = rec.ctx.phase == recording.CHECKPOINT_LOAD and rec.rank != src
    work = _issue("all_reduce", group, [] if receives else [tensor], [tensor], _nbytes(tensor),
                  async_op)
    if receives:
        # Rank 0's values are not here (each rank is recorded alone): zeros in their place, not
        # logged, so that no rank computes on what its allocator held. A parameter made by
        # torch.empty (transformers 5's MixtralExperts) kept a NaN on one kind of rank, whose
        # 0.19.8 step then skipped (is_invalid_grad_norm) where every rank of a real run,
        # all-reducing one norm, steps alike.
        with rec.paused_ops():
            tensor.data.zero_()
    return work


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    work = _issue("all_to_all", group, [input], [output], _nbytes(input), async_op)
    with recording.current().paused_ops():
        if output.numel() == input.numel():
            output.copy_(input.view_as(output).clone())
    return work


def barrier(group=None, async_op=False, device_ids=None):
    # NCCL's barrier all-reduces a 1-element tensor of its own (ProcessGroupNCCL::barrier),
    # made here as it is there, on the current stream, so the op recorder logs it.
    flag = torch.zeros(1)
    return _issue("all_reduce", group, [flag], [flag], 4, async_op, host_blocks=True)


_creators: dict[int, str] = {}
_real_new_group = dist.new_group


def new_group(ranks=None, *args, **kwargs):
    """torch.distributed.new_group, remembering which DeepSpeed function made the group (the
    hpZ group, qgZ's intra- and inter-node groups each get their own NCCL stream)."""
    group = _real_new_group(ranks, *args, **kwargs)
    creator = "new_group"
    for frame in inspect.stack()[1:12]:
        if "deepspeed" in frame.filename and "deepspeed/comm/" not in frame.filename:
            creator = frame.function.lstrip("_")
            break
    if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER:
        _creators[id(group)] = creator
    rec = recording.current()
    if ranks is not None:
        rec.group_id(tuple(sorted(ranks)), creator)
    return group


REPLACED = {
    "all_gather_into_tensor": all_gather_into_tensor,
    "_all_gather_base": lambda output_tensor, input_tensor, group=None, async_op=False:
    all_gather_into_tensor(output_tensor, input_tensor, group, async_op),
    "all_gather": all_gather,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "_reduce_scatter_base": lambda output, input, op=None, group=None, async_op=False:
    reduce_scatter_tensor(output, input, op, group, async_op),
    "reduce_scatter": reduce_scatter,
    "all_reduce": all_reduce,
    "all_reduce_coalesced": all_reduce_coalesced,
    "reduce": reduce,
    "broadcast": broadcast,
    "all_to_all_single": all_to_all_single,
    "barrier": barrier,
    "new_group": new_group,
}
"""What stand_ins puts in place of torch.distributed's functions."""
