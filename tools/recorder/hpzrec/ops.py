"""Every aten op DeepSpeed and the model issue, with the bytes it reads and writes.

A TorchDispatchMode sees each op after autograd, as PyTorch's CUDA sanitizer does
(torch/cuda/_sanitizer.py, CUDASanitizerDispatchMode). Read or write comes from the op's schema:
an argument with a mutable alias annotation (`Tensor(a!)`) is written, every other tensor
argument is read, and a return value that aliases nothing is a fresh tensor the op allocates
and writes. Unlike the sanitizer, accesses are byte ranges of the storage, not data pointers,
so a copy into a narrowed view of the secondary shard and a torch.cat that reads it overlap
exactly where they do.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import recording
from .recording import READ, WRITE

# Ops that only allocate: their contents are uninitialized (the caching allocator's view).
_EMPTY = {"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"}
# Ops that copy memory rather than compute (the IR's kCopy).
_COPY = {"copy_", "_to_copy", "clone", "cat", "stack", "index_copy", "slice_scatter",
         "_unsafe_view", "contiguous"}
# Ops whose CUDA kernels make the host wait for the stream: the output's size depends on the
# data, which the host reads back (PyTorch 2.1: nonzero's count is copied with
# at::cuda::memcpy_and_sync, aten/src/ATen/native/cuda/Nonzero.cu; masked_select and boolean
# indexing go through nonzero; unique and repeat_interleave read their sizes the same way). On a
# CPU they read host memory and log nothing, so the recorder logs the wait a GPU would have.
_SYNC_ON_CUDA = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
                 "unique_consecutive", "unique_dim_consecutive", "repeat_interleave"}
# Ops that carry no data access at all.
_METADATA = {"detach", "alias", "_has_compatible_shallow_copy_type", "size",
             "stride", "storage_offset", "is_same_size", "record_stream", "set_", "resize_"}


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    flat, _ = tree_flatten(value)
    return [t for t in flat if isinstance(t, torch.Tensor)]


class OpRecorder(TorchDispatchMode):
    """Logs each aten op into the current recording, on the stream that is current.

    Costs are for the sequence length the user asked for, not the short one DeepSpeed runs
    with (`seq_len`, which no model dimension is a multiple of): a dimension that is a multiple
    of it is an activation dimension and scales by `scale`. A GEMM's 2 m n k scales once per
    such dimension among m, n, k (twice for attention scores), a tensor's bytes once per such
    dimension of its shape."""

    def __init__(self, seq_len: int, scale: float) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.scale = scale

    def _factor(self, dims) -> float:
        power = min(2, sum(1 for d in dims if d and d % self.seq_len == 0))
        return self.scale**power

    def _flops(self, name: str, args: tuple) -> float:
        """2 m n k for the GEMM family, from the shapes the op saw, scaled."""
        if name not in ("mm", "bmm", "addmm", "baddbmm", "addbmm"):
            return 0.0
        a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
        batch = a.shape[0] if a.dim() == 3 else 1
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        return 2.0 * batch * m * k * n * self._factor((m, k, n))

    def _bytes(self, tensors: Iterable[torch.Tensor]) -> float:
        return float(sum(t.numel() * t.element_size() * self._factor(t.shape) for t in tensors))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rec = recording.current()
        if rec.paused:
            return out
        with rec.paused_ops():  # what we do to look at tensors must not log itself
            self._log(rec, func, args, kwargs, out)
        return out

    def _log(self, rec: recording.Recording, func, args, kwargs, out) -> None:
        name = func._schema.name.split("::")[-1]
        stream = rec.current_stream
        if name == "lift_fresh":  # torch.tensor(data): made outside the dispatcher, new here
            life = rec.lifetime_of(out, fresh=True)
            rec.push("alloc", stream, lifetime=life, fill="zero")
            span = rec.byte_range(out)
            if span is not None:
                rec.push("kernel", stream, accesses=[(life, WRITE) + span], aten=name)
            return
        if name in _METADATA or getattr(func, "is_view", False):
            return
        if name == "_local_scalar_dense":  # .item(): on a GPU the host waits for the stream
            if not rec.cpu_checks:
                rec.push("host_stream_sync", stream)
            return
        reads, writes, seen = [], [], []
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            for t in _tensors(value):
                seen.append(t)
                a = rec.access(t, WRITE if written else READ)
                if a is not None:
                    (writes if written else reads).append(a)
        fresh = []
        for ret, value in zip(func._schema.returns, out if isinstance(out, tuple) else (out, )):
            if ret.alias_info is None:
                fresh.extend(t for t in _tensors(value))
        seen.extend(fresh)
        for t in fresh:
            life = rec.lifetime_of(t, fresh=True)
            if name in _EMPTY and rec.padding_allocs:
                rec.lifetimes[life].padding = True
            rec.push("alloc", stream, lifetime=life, fill="nan" if name in _EMPTY else "zero")
            if name not in _EMPTY:
                span = rec.byte_range(t)
                if span is not None:
                    writes.append((life, WRITE, span[0], span[1]))
        if name in _EMPTY or not (reads or writes):
            return
        kind = "copy" if name in _COPY else "kernel"
        rec.push(kind, stream, accesses=reads + writes, aten=name, flops=self._flops(name, args),
                 mem_bytes=self._bytes(seen))
        boolean_index = name in ("index", "index_put_", "index_put") and any(
            t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1:2]))
        if name in _SYNC_ON_CUDA or boolean_index or _from_host_memory(rec, name, args):
            rec.push("host_stream_sync", stream)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _from_host_memory(rec: recording.Recording, name: str, args: tuple) -> bool:
    """copy_ from a tensor that stands for pageable host memory (a checkpoint's state dict,
    rec.host_storages) into device memory: PyTorch's copy_kernel_cuda copies with
    at::cuda::memcpy_and_sync when non_blocking is False (aten/src/ATen/native/cuda/Copy.cu),
    cudaMemcpyAsync then cudaStreamSynchronize, so the host waits for the current stream. On
    this CPU every tensor is host memory and nothing waits."""
    if name != "copy_" or not rec.host_storages or len(args) < 2:
        return False
    dst, src = args[0], args[1]
    return (isinstance(src, torch.Tensor) and _storage(src) in rec.host_storages
            and _storage(dst) not in rec.host_storages)
