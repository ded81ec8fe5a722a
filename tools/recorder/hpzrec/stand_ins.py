"""Every patch the recording needs, in one place, each named for what it stands in for.

Nothing in DeepSpeed's files is edited. What is replaced, and why:
  - intel_extension_for_pytorch, oneccl_bindings_for_pytorch: empty modules. DeepSpeed's CPU
    accelerator imports them at import time; nothing of them is used.
  - torch.distributed is initialized with torch's fake process group (rank R of a world of N,
    nothing communicated), and its collectives are replaced by hpzrec.collectives, which log
    them as ProcessGroupNCCL would issue them.
  - Tensor.record_stream: the caching allocator's bookkeeping for CUDA streams. CPU tensors
    refuse it; the IR's buffer lifetimes are logical (sim/schedule.hpp), so it does nothing.
  - deepspeed.ops' quantizer (qwZ): DeepSpeed's CUDA kernel cannot load on a CPU; a function
    with the same outputs (int8 values, one fp32 scale per group) stands in for it.
  - deepspeed.runtime.zero.utils.get_lst_from_rank0: DeepSpeed broadcasts rank 0's ints to
    assert that every rank agrees (module order, parameter ids). Nothing is communicated, so a
    rank other than 0 would see its own placeholder; the broadcast is still logged and the
    function returns this rank's own list: the agreement of a correct run, which the
    recording's symmetry between ranks assumes anyway (docs/record.md).
  - Tensor.uniform_ / normal_ while the model is built: random initialization of a 7B model
    costs minutes of CPU and its values mean nothing here (collectives carry no data); a
    constant fill writes the same bytes in a few milliseconds, so the schedule is the same.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
import types

import torch
import torch.distributed as dist

from . import collectives


def stub_cpu_extension_modules() -> None:
    """Empty stand-ins for the Intel extensions DeepSpeed's CPU accelerator imports."""
    for name in ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            sys.modules[name] = module


def init_fake_world(rank: int, world_size: int, local_size: int) -> None:
    """torch.distributed as rank `rank` of `world_size`, with torch's fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank % local_size), LOCAL_SIZE=str(local_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def replace_collectives() -> None:
    """torch.distributed's collectives -> hpzrec.collectives (both names DeepSpeed uses)."""
    for name, fn in collectives.REPLACED.items():
        for module in (dist, dist.distributed_c10d):
            if hasattr(module, name):
                setattr(module, name, fn)


def ignore_record_stream() -> None:
    """Tensor.record_stream accepts the recording streams and does nothing."""
    torch.Tensor.record_stream = lambda self, stream: None


class QuantizerKernels:
    """DeepSpeed's quantizer CUDA module (op_builder QuantizerBuilder, used by CUDAQuantizer in
    runtime/zero/partition_parameters.py) for the CPU: symmetric int8 per group, one fp32
    scale per group, computed with plain torch ops so the op recorder sees their bytes.
    CUDAQuantizer itself (its group sizes) is DeepSpeed's own."""
    Symmetric = 0

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def quantize(self, param, groups, bits=8, mode=0):
        blocks = param.reshape(groups, -1).float()
        scale = blocks.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        q = (blocks / scale).round().clamp(-127, 127).to(torch.int8)
        return q.reshape(-1), scale.reshape(-1)

    def dequantize(self, quantized, scale, groups, bits=8, mode=0):
        out = quantized.reshape(groups, -1).float() * scale.reshape(-1, 1)
        return out.reshape(-1).to(self.dtype)


def replace_quantizer(dtype: torch.dtype) -> None:
    """Puts QuantizerKernels where DeepSpeed's CUDAQuantizer loads its CUDA module."""
    from deepspeed.runtime.zero import partition_parameters as pp
    if hasattr(pp, "CUDAQuantizer"):
        pp.CUDAQuantizer.quantizer_cuda_module = QuantizerKernels(dtype)


@contextlib.contextmanager
def constant_initialization():
    """Inside, Tensor.uniform_ and Tensor.normal_ fill a constant (see the module's notes)."""
    saved = torch.Tensor.uniform_, torch.Tensor.normal_
    torch.Tensor.uniform_ = lambda self, *args, **kwargs: self.fill_(0.02)
    torch.Tensor.normal_ = lambda self, *args, **kwargs: self.fill_(0.02)
    try:
        yield
    finally:
        torch.Tensor.uniform_, torch.Tensor.normal_ = saved


def agree_with_rank0() -> None:
    """get_lst_from_rank0 returns this rank's list (see the module's notes)."""
    from deepspeed.runtime.zero import utils

    original = utils.get_lst_from_rank0

    def get_lst_from_rank0(lst):
        original(lst)  # the broadcast, logged
        return list(lst)

    utils.get_lst_from_rank0 = get_lst_from_rank0


def install(rank: int, world_size: int, local_size: int) -> None:
    """Everything above, in the order DeepSpeed's imports need it."""
    stub_cpu_extension_modules()
    init_fake_world(rank, world_size, local_size)
    replace_collectives()
    ignore_record_stream()
