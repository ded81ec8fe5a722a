"""Every patch the recording needs, in one place, each named for what it stands in for.

Nothing in DeepSpeed's files is edited. What is replaced, and why:
  - intel_extension_for_pytorch, oneccl_bindings_for_pytorch: empty modules. DeepSpeed's CPU
    accelerator imports them at import time; nothing of them is used.
  - torch.distributed is initialized with torch's fake process group (rank R of a world of N,
    nothing communicated), and its collectives are replaced by hpzrec.collectives, which log
    them as ProcessGroupNCCL would issue them.
  - Tensor.record_stream: the caching allocator's bookkeeping for CUDA streams. CPU tensors
    refuse it. With --allocator it is logged (a record_stream entry: the stream, the tensor's
    storage and bytes, in issue order on the host), which the checker's model of the caching
    allocator reads; without, it does nothing (the IR's buffer lifetimes are logical there).
  - deepspeed.ops' quantizer (qwZ): DeepSpeed's CUDA kernel cannot load on a CPU; a function
    with the same outputs (int8 values, one fp32 scale per group) stands in for it.
  - The same CUDA module's qgZ ops (swizzle_quant, quantized_reduction, dequantize), which
    runtime/comm/coalesced_collectives.py's all_to_all_quant_reduce loads into its module global
    `quantizer_module`: plain-torch functions with the CUDA bindings' output shapes and dtypes
    (csrc/quantization/pt_binding.cpp at v0.13.4). The all-to-alls between them are
    hpzrec.collectives' all_to_all_single, also where coalesced_collectives imported it by name.
  - deepspeed.runtime.zero.utils.get_lst_from_rank0 and (0.17.6, which first broadcasts the
    list's length, utils.py:70-83 there) assert_lst_len_same_as_other_ranks: DeepSpeed
    broadcasts rank 0's ints to assert that every rank agrees (module order, parameter ids).
    Nothing is communicated, so a rank other than 0 would keep its placeholder (-1). Both run
    with get_rank() answering 0: the tensor holds what rank 0 would send, this rank's own ints
    (the agreement of a correct run, which the recording's symmetry between ranks assumes
    anyway, docs/record.md), and the broadcast and the host's reads of it are logged as issued.
    A run of 0.17.6 as a rank other than 0 raised a disagreement there until 2026-11-26.
  - Tensor.uniform_ / normal_ while the model is built: random initialization of a 7B model
    costs minutes of CPU and its values mean nothing here (collectives carry no data); a
    constant fill writes the same bytes in a few milliseconds, so the schedule is the same.
  - torch.utils._pytree.register_pytree_node, where torch lacks it (torch 2.1 has only
    _register_pytree_node, without serialized_type_name): transformers 4.57.1 calls it
    unconditionally when imported (utils/generic.py:465, and ModelOutput.__init_subclass__ at
    :331) to register its ModelOutput classes as pytree nodes, though it still accepts torch
    2.1 (utils/import_utils.py:251); 4.51.3 called _register_pytree_node below torch 2.2
    (generic.py:489-500), 4.35.2 always. `import deepspeed` already imports transformers
    (DeepSpeed 0.13.4 comm/torch.py:124 @compiler.disable imports torch._dynamo, which imports
    torch/onnx/_internal/fx/patcher.py:11 `import transformers`), so this goes in first. It
    registers them as 4.51.3 does on torch 2.1, dropping serialized_type_name, which torch
    (2.2 and later) uses only to serialize tree specs for torch.export. Nothing the recording
    runs flattens a ModelOutput (DDP's static_graph and torch.compile would).
  - transformers 5's grouped_mm experts (Mixtral's MixtralExperts, 5.24.0
    integrations/moe.py): _can_use_grouped_mm answers False on a CPU when torch <= 2.10 and a
    weight or input is not 16-byte aligned (moe.py:321-332), and the experts then take
    grouped_mm_fallback, a loop that reads each expert's offset back to the host (offs.tolist(),
    moe.py:206): a path a GPU (compute capability 8.0 and later, moe.py:341-345) does not take.
    The wrapper makes that case fail, naming it, rather than record the CPU's path; where the
    answer is True (the recordings so far), nothing changes.
  - torch.nn.functional.one_hot with num_classes given (Mixtral's and Qwen2-MoE's routers):
    its CPU kernel checks the class values with two .item() reads, which its CUDA kernel leaves
    to scatter's device asserts (aten/src/ATen/native/Onehot.cpp at PyTorch 2.1): those reads are
    not logged as host syncs, which a GPU would not make.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import inspect
import os
import sys
import types

import torch
import torch.distributed as dist

from . import collectives, recording


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


def record_stream_as_recorded() -> None:
    """Tensor.record_stream accepts the recording streams (hpzrec.accelerator) and, in the
    allocator mode, logs the call (Recording.record_stream); otherwise it does nothing."""

    def record_stream(self, stream) -> None:
        rec = recording.current()
        if not rec.allocator or rec.closed:
            return
        index = getattr(stream, "index", None)
        if not isinstance(index, int):
            raise TypeError(f"hpzlab record: record_stream({stream!r}): not a stream of the "
                            "recording accelerator")
        rec.record_stream(self, index)

    torch.Tensor.record_stream = record_stream


class QuantizerKernels:
    """DeepSpeed's quantizer CUDA module (op_builder QuantizerBuilder, used by CUDAQuantizer in
    runtime/zero/partition_parameters.py) for the CPU: symmetric int8 per group, one fp32
    scale per group, computed with plain torch ops so the op recorder sees their bytes.
    CUDAQuantizer itself (its group sizes) is DeepSpeed's own."""
    Symmetric = 0

    def __init__(self, dtype: torch.dtype, out_dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.out_dtype = out_dtype

    def quantize(self, param, groups, bits=8, mode=0):
        # One kernel reads the shard, as the CUDA kernel does (not a copy: a .float() would be
        # logged as one reading the shard); the rest works on its output.
        blocks = torch.mul(param.reshape(groups, -1), 1.0)
        scale = blocks.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 127.0
        q = torch.div(blocks, scale).round().clamp(-127, 127).to(torch.int8)
        return q.reshape(-1), scale.reshape(-1)

    def dequantize(self, quantized, scale, groups, bits=8, mode=0):
        # The CUDA binding's output has the quantized input's shape, its last dimension times
        # 8 / bits (csrc/quantization/pt_binding.cpp:120-122 at v0.13.4): a single parameter's
        # gather hands it the int8 buffer viewed in the parameter's shape
        # (partition_parameters.py:1242) and gets the parameter's shape back.
        # One kernel writes the result in the parameter's dtype. The CUDA binding writes fp16
        # whatever the parameter's dtype (`dequantize<__half>`, pt_binding.cpp:113, 390), and its
        # quantize reads the input as fp16 (:96): on bf16 DeepSpeed computes wrong weights before
        # 0.19.6 (hpzlab's rule qwz-quantizer-reads-half). This stand-in is a quantizer that
        # works, so a bf16 run records the schedule to the end instead of failing on a dtype.
        shape = list(quantized.shape)
        shape[-1] *= 8 // bits
        out = torch.empty(shape, dtype=self.out_dtype)
        torch.mul(quantized.reshape(groups, -1), scale.reshape(-1, 1), out=out.view(groups, -1))
        return out


def replace_quantizer(dtype: torch.dtype) -> None:
    """Puts QuantizerKernels where DeepSpeed's CUDAQuantizer loads its CUDA module."""
    from deepspeed.runtime.zero import partition_parameters as pp
    if hasattr(pp, "CUDAQuantizer"):
        # From 0.19.6 (PR 8215) CUDAQuantizer.dequantize takes the parameter's dtype and casts
        # the binding's fp16 output to it (partition_parameters.py:896-901 at 0.19.8): there the
        # stand-in writes fp16, as the CUDA binding does, so that the cast is recorded as
        # DeepSpeed issues it. Before, it writes the parameter's dtype (QuantizerKernels).
        casts = "dtype" in inspect.signature(pp.CUDAQuantizer.dequantize).parameters
        out_dtype = torch.float16 if casts else dtype
        pp.CUDAQuantizer.quantizer_cuda_module = QuantizerKernels(dtype, out_dtype)


class QuantizedGradientKernels:
    """The qgZ ops of DeepSpeed's quantizer CUDA module (op_builder QuantizerBuilder, loaded by
    all_to_all_quant_reduce in runtime/comm/coalesced_collectives.py) for the CPU, with the
    output shapes and dtypes of csrc/quantization/pt_binding.cpp at v0.13.4. Values are
    per-group quantized with plain torch ops on the inputs, so the op recorder sees kernels that
    read the inputs and write the outputs, as the CUDA kernels do; they are finite but not
    DeepSpeed's: no swizzled order, and the input is read as its own dtype where the kernels read
    fp16 (`(__half*)input_vals.data_ptr()`, whatever the dtype). 4 bits are packed two a byte.
    `quant_type` is quantize::Type (quantization.h): Symmetric, or Asymmetric, whose scales carry
    an offset as a second column."""
    Symmetric = 0
    Asymmetric = 1

    @staticmethod
    def _scale_columns(quant_type) -> int:
        return 2 if int(quant_type) == QuantizedGradientKernels.Asymmetric else 1

    @staticmethod
    def _group_index(n: int, groups: int) -> torch.Tensor:
        """The group of each of n values: `groups` runs of (nearly) equal length."""
        return torch.div(torch.arange(n) * groups, n, rounding_mode="floor")

    @classmethod
    def _quantize(cls, values: torch.Tensor, groups: int, bits: int, quant_type):
        """Flat float values -> (int8 values in bits' range, fp32 scales {groups, 1 or 2})."""
        n = values.numel()
        index = cls._group_index(n, groups)
        if cls._scale_columns(quant_type) == 1:
            qmax = 2**(bits - 1) - 1
            amax = torch.zeros(groups).scatter_reduce(0, index, values.abs(), "amax")
            scale = amax.clamp(min=1e-8) / qmax
            q = (values / scale[index]).round().clamp(-qmax, qmax)
            scales = scale.reshape(groups, 1)
        else:
            levels = 2**bits - 1
            low = torch.full((groups, ), float("inf")).scatter_reduce(0, index, values, "amin")
            high = torch.full((groups, ), -float("inf")).scatter_reduce(0, index, values, "amax")
            scale = (high - low).clamp(min=1e-8) / levels
            q = ((values - low[index]) / scale[index]).round().clamp(0, levels) - 2**(bits - 1)
            scales = torch.stack((scale, low), dim=1)
        return q.to(torch.int8), scales

    @classmethod
    def _dequantize(cls, q: torch.Tensor, scales: torch.Tensor, groups: int, bits: int,
                    quant_type) -> torch.Tensor:
        """int8 values in bits' range -> flat fp32 values."""
        index = cls._group_index(q.numel(), groups)
        values = q.float()
        if cls._scale_columns(quant_type) == 2:
            values = values + 2**(bits - 1)
        values = values * scales[:, 0][index]
        if cls._scale_columns(quant_type) == 2:
            values = values + scales[:, 1][index]
        return values

    @staticmethod
    def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
        """int8 values -> bytes: as they are for 8 bits, two a byte for 4."""
        if bits == 8:
            return q
        pairs = q[:q.numel() // 2 * 2].reshape(-1, 2).to(torch.int16)
        return (pairs[:, 0] * 16 + (pairs[:, 1] & 15)).to(torch.int8)

    @staticmethod
    def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
        """Bytes -> int8 values (sign-extended nibbles for 4 bits)."""
        flat = packed.reshape(-1)
        if bits == 8:
            return flat
        b = flat.to(torch.int16)
        high, low = b >> 4, (b & 15) - (b & 8) * 2
        return torch.stack((high, low), dim=1).reshape(-1).to(torch.int8)

    def swizzle_quant(self, input_vals, groups, num_bits, quant_type, pipeline_size, nodes,
                      devices_per_node):
        """-> (int8 {numel / (8 / num_bits)}, fp32 scales {groups, 1 or 2})."""
        q, scales = self._quantize(input_vals.reshape(-1).float(), groups, num_bits, quant_type)
        return [self._pack(q, num_bits), scales]

    def quantized_reduction(self, input_vals, input_scales, in_groups, out_groups, num_bits,
                            quant_type, devices_per_node):
        """Dequantizes what every device of the node sent, sums it, quantizes the sum again:
        -> (int8 of input's shape with the last dim / devices_per_node, fp32 scales
        {out_groups, 1 or 2})."""
        sizes = list(input_vals.shape)
        sizes[-1] //= devices_per_node
        out_bytes = 1
        for d in sizes:
            out_bytes *= d
        per_device = out_bytes * (8 // num_bits)
        values = self._dequantize(self._unpack(input_vals, num_bits), input_scales, in_groups,
                                  num_bits, quant_type)
        summed = values[:devices_per_node * per_device].reshape(devices_per_node, -1).sum(0)
        q, scales = self._quantize(summed, out_groups, num_bits, quant_type)
        return [self._pack(q, num_bits).reshape(sizes), scales]

    def dequantize(self, quantized_data, params, groups, num_bits, quant_type):
        """-> fp16 (the module exports dequantize<__half>) of quantized_data's shape, the last
        dim times 2 for 4 bits."""
        sizes = list(quantized_data.shape)
        sizes[-1] *= 8 // num_bits
        values = self._dequantize(self._unpack(quantized_data, num_bits), params, groups,
                                  num_bits, quant_type)
        return values.to(torch.float16).reshape(sizes)


def replace_gradient_quantizer() -> None:
    """Puts QuantizedGradientKernels where qgZ's all_to_all_quant_reduce loads its CUDA module
    (the module global `quantizer_module`, loaded only while it is None), and the recorder's
    all_to_all_single where coalesced_collectives bound torch's by name (0.13.4 and earlier:
    `from torch.distributed import all_to_all_single`; later versions take DeepSpeed's comm
    function, which calls torch.distributed's at each call)."""
    from deepspeed.runtime.comm import coalesced_collectives as cc
    if hasattr(cc, "quantizer_module"):
        cc.quantizer_module = QuantizedGradientKernels()
    bound = getattr(cc, "all_to_all_single", None)
    if bound is not None and getattr(bound, "__module__", "").startswith("torch.distributed"):
        cc.all_to_all_single = collectives.all_to_all_single


def pytree_registration_for_transformers() -> None:
    """torch.utils._pytree.register_pytree_node for transformers 4.57.1 on torch 2.1 (see the
    module's notes); nothing where torch has it (2.2 and later)."""
    import torch.utils._pytree as pytree
    if hasattr(pytree, "register_pytree_node"):
        return

    def register_pytree_node(cls, flatten_fn, unflatten_fn, *, serialized_type_name=None):
        pytree._register_pytree_node(cls, flatten_fn, unflatten_fn)

    pytree.register_pytree_node = register_pytree_node


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


def one_hot_as_on_cuda() -> None:
    """one_hot's CPU-only checks log no host sync (see the module's notes)."""
    original = torch.nn.functional.one_hot

    def one_hot(tensor, num_classes=-1):
        if num_classes < 0:  # CUDA reads max() back too: the sync stays
            return original(tensor, num_classes)
        rec = recording.current()
        rec.cpu_checks += 1
        try:
            return original(tensor, num_classes)
        finally:
            rec.cpu_checks -= 1

    torch.nn.functional.one_hot = one_hot


def grouped_mm_as_on_gpu() -> None:
    """transformers 5's experts take grouped_mm as on a GPU, or the recording stops (see the
    module's notes); nothing where transformers has no such dispatcher (4.x)."""
    import transformers
    if int(transformers.__version__.split(".")[0]) < 5:
        return
    from transformers.integrations import moe
    original = getattr(moe, "_can_use_grouped_mm", None)
    if original is None:
        return

    def can_use_grouped_mm(input, weight, offs):
        answer = original(input, weight, offs)
        if not answer and weight.device.type == "cpu" and (
                hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm")):
            raise RuntimeError("hpzlab record: transformers' experts would take "
                               "grouped_mm_fallback on this CPU (an unaligned tensor, "
                               "integrations/moe.py _can_use_grouped_mm), a path a GPU does not "
                               "take; not recorded")
        return answer

    moe._can_use_grouped_mm = can_use_grouped_mm


class _AsRank0:
    """deepspeed.comm as rank 0 sees it: get_rank() is 0, everything else the same."""

    def __init__(self, real) -> None:
        self._real = real

    def get_rank(self, *args, **kwargs) -> int:
        return 0

    def __getattr__(self, name):
        return getattr(self._real, name)


def agree_with_rank0() -> None:
    """DeepSpeed's broadcasts of rank 0's ints run as on rank 0 (see the module's notes)."""
    from deepspeed.runtime.zero import utils

    def as_rank0(original):
        def wrapper(lst):
            real = utils.dist
            utils.dist = _AsRank0(real)
            try:
                return original(lst)
            finally:
                utils.dist = real
        return wrapper

    for name in ("get_lst_from_rank0", "assert_lst_len_same_as_other_ranks"):
        if hasattr(utils, name):
            setattr(utils, name, as_rank0(getattr(utils, name)))


def install(rank: int, world_size: int, local_size: int) -> None:
    """Everything above, in the order DeepSpeed's imports need it. The last step imports
    DeepSpeed's coalesced_collectives, as `import deepspeed` would next: after the Intel stubs
    and the collectives, before the recording accelerator is set (importing DeepSpeed asks for
    an accelerator already; set_accelerator replaces it)."""
    stub_cpu_extension_modules()
    pytree_registration_for_transformers()
    init_fake_world(rank, world_size, local_size)
    replace_collectives()
    record_stream_as_recorded()
    replace_gradient_quantizer()
    one_hot_as_on_cuda()
