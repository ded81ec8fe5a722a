"""Wrappers around DeepSpeed's ZeRO-3 functions that label what they issue.

They change nothing DeepSpeed does: each sets the recording's context (module, purpose, the
parameter in focus) around the original call and, afterwards, claims the parameter tensors the
call left behind (primary shard `ds_tensor`, secondary shard `ds_secondary_tensor`, gathered
`data`) so that the IR writer can give those bytes their roles. Names follow DeepSpeed 0.13.4
(runtime/zero/partitioned_param_coordinator.py: fetch_sub_module 261, release_sub_module 395,
__all_gather_params 423; partition_parameters.py: free_param 276, _partition_param 1483,
_partition_param_sec 1603; stage3.py: invalidate_secondary_tensor 464,
reduce_independent_p_g_buckets_and_remove_grads 1213, __reduce_and_partition_ipg_grads 1249;
comm/coalesced_collectives.py: reduce_scatter_coalesced 82, whose padding it marks).
A function a version lacks is skipped, and the recording says so. Frees are logged by the
wrappers of free_param and invalidate_secondary_tensor, and, up to 0.13.1, where
_partition_param_sec drops a secondary it replaces (_free_when_dropped); in the allocator mode
(--allocator) by none of them: every storage's deallocation is logged (hpzrec.recording), once,
inside the same calls.
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable, Iterable, Optional

import torch

from . import recording
from .slices import own_elements

missing: list[str] = []
"""Functions a DeepSpeed version lacks, so that their labels are missing from its recording."""


def _wrap(owner, name: str, make: Callable) -> None:
    original = getattr(owner, name, None)
    if original is None:
        missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
        return
    setattr(owner, name, functools.wraps(original)(make(original)))


def unit_of(param) -> int:
    """The IR unit of a DeepSpeed parameter (registered by register_units)."""
    return recording.current().unit_of_param.get(id(param), -1)


def claim_param(param) -> None:
    """Claims the parameter tensors DeepSpeed holds for one parameter right now."""
    rec = recording.current()
    unit = unit_of(param)
    if unit < 0:
        return
    with rec.paused_ops():
        primary = getattr(param, "ds_tensor", None)
        rec.claim(primary, "primary", unit, _own(param, primary, rec.rank))
        secondary = getattr(param, "ds_secondary_tensor", None)
        place = None
        if secondary is not None and secondary.numel() > 0:
            # The parameter rounded up to a multiple of the world (_aligned_size, PP:1406-1411
            # at v0.13.4) is cut into one secondary slice per rank of an hpZ group; the groups
            # are blocks of consecutive ranks (_create_zero_param_parallel_group,
            # utils/groups.py:505-530), and a rank's slice starts at its place in its block
            # (secondary_start, PP:1633). The secondary is made before the primary (PP:1470-1478).
            world = rec.world_size
            padded = -(-int(param.ds_numel) // world) * world
            place = rec.rank % max(1, padded // secondary.numel())
        rec.claim(secondary, "secondary", unit,
                  None if place is None else _own(param, secondary, place))
        status = getattr(param, "ds_status", None)
        if status is not None and status.name in ("AVAILABLE", "INFLIGHT"):
            rec.claim(param.data, "full", unit)


def _own(param, shard, place: int) -> Optional[int]:
    """The parameter's own elements in `shard`, slice `place` of it (none past its end)."""
    if shard is None or shard.numel() == 0:
        return None
    return max(0, own_elements(int(param.ds_numel), shard.numel(), place))


def _free_when_dropped(param) -> Optional[weakref.finalize]:
    """Logs the free of the parameter's secondary where its last reference goes.

    Up to v0.13.1, `_partition_param_sec(param, has_been_updated=True)` on an AVAILABLE
    parameter that has a secondary makes a new one (`torch.empty`,
    runtime/zero/partition_parameters.py:1620 at v0.13.1, :1567 at v0.12.3) and assigns it to
    `param.ds_secondary_tensor` (:1631; :1578), which drops the only reference to the old one:
    on a GPU the caching allocator takes its block back right there, on the current stream,
    after the new one's allocation and before the copy into it (:1647; :1594). The recorder
    holds no tensor (lifetimes and claims are storage addresses and byte ranges), so a
    finalizer on the old tensor runs inside that assignment: the free is logged between the
    alloc and the copy, in the order DeepSpeed issues them, without repeating DeepSpeed's own
    test of when it replaces the secondary. Purpose secondary_alloc, as the alloc's (ir.py) and
    as sim/deepspeed/ issues the free; phase and step the context's. From v0.13.2
    the secondary is made only `if param.ds_secondary_tensor is None` (:1614 at v0.13.4): the
    old one stays, the finalizer never runs and the caller detaches it, so nothing is logged.
    Returns the finalizer, or None where there is no secondary the recording knows."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    if getattr(param, "ds_status", None) is not ZeroParamStatus.AVAILABLE:
        return None
    rec = recording.current()
    if rec.allocator:  # the storage's own deallocation is logged, at the same place
        return None
    unit = unit_of(param)
    old = getattr(param, "ds_secondary_tensor", None)
    if old is None or unit < 0 or old.untyped_storage()._cdata not in rec.live:
        return None
    span = rec.byte_range(old)
    if span is None:
        return None
    life = rec.lifetime_of(old)

    def free() -> None:
        with rec.context(unit=unit, purpose="secondary_alloc"):
            rec.push("free", rec.current_stream, lifetime=life, region=span)

    finalizer = weakref.finalize(old, free)  # `free` holds no reference to `old`
    finalizer.atexit = False
    return finalizer


def claim_all(params: Iterable) -> None:
    for p in params:
        claim_param(p)


def register_param(param) -> None:
    """A new DeepSpeed parameter (zero.Init converts each as its module is built) becomes an
    IR unit at once, so that the tensors of its initialization are claimed too."""
    rec = recording.current()
    if id(param) not in rec.unit_of_param:
        rec.unit_of_param[id(param)] = len(rec.units)
        rec.units.append({"name": f"param{param.ds_id}", "layer": -1, "numel": 0,
                          "padded_numel": 0, "shard_numel": 0, "secondary_numel": 0,
                          "forward_flops": 0.0, "persistent": False})


def register_units(model: torch.nn.Module, world_size: int, hpz: int) -> None:
    """Names and sizes of the units, once the model is built (by parameter name)."""
    rec = recording.current()
    for name, p in model.named_parameters():
        if not hasattr(p, "ds_tensor"):  # ZeRO-1/2: a plain parameter, whole on every rank
            _register_whole(name, p)
            continue
        register_param(p)
        shard = p.ds_tensor.ds_numel
        padded = shard * world_size
        layer = -1
        parts = name.split(".")
        if "layers" in parts and parts.index("layers") + 1 < len(parts):
            tail = parts[parts.index("layers") + 1]
            layer = int(tail) if tail.isdigit() else -1
        rec.units[rec.unit_of_param[id(p)]].update({
            "name": name, "layer": layer, "numel": int(p.ds_numel), "padded_numel": int(padded),
            "shard_numel": int(shard), "secondary_numel": int(padded // hpz) if hpz > 1 else 0,
            "persistent": bool(getattr(p, "ds_persist", False))
        })
    claim_all(model.parameters())


def _register_whole(name: str, p) -> None:
    """A unit for a parameter ZeRO-1/2 keeps whole (no shard, no secondary of its own: the
    optimizer partitions the flattened group, hpzrec.cli.rank_kinds). Its tensors are not
    claimed: each storage stays one IR buffer."""
    rec = recording.current()
    if id(p) in rec.unit_of_param:
        return
    parts = name.split(".")
    layer = -1
    if "layers" in parts and parts.index("layers") + 1 < len(parts):
        tail = parts[parts.index("layers") + 1]
        layer = int(tail) if tail.isdigit() else -1
    rec.unit_of_param[id(p)] = len(rec.units)
    rec.units.append({"name": name, "layer": layer, "numel": int(p.numel()),
                      "padded_numel": int(p.numel()), "shard_numel": 0, "secondary_numel": 0,
                      "forward_flops": 0.0, "persistent": False})


def _module_name(module) -> str:
    return getattr(module, "_hpzlab_name", type(module).__name__)


def name_modules(model: torch.nn.Module) -> None:
    """Gives every module its path in the model, for labels."""
    for name, module in model.named_modules():
        module._hpzlab_name = name or "model"


def _own_params(module) -> list:
    return list(module.parameters(recurse=False))


def _fetched_for(module) -> list:
    """What fetch_sub_module gathers for `module` itself: its own parameters, or a z3 leaf's
    whole subtree (`iter_params(module, recurse=z3_leaf_module(module))`, COORD:300 at v0.18.2;
    z3_leaf_module reads `_z3_leaf`, utils/z3_leaf_module.py:15-23)."""
    return list(module.parameters(recurse=bool(getattr(module, "_z3_leaf", False))))


def install() -> None:
    """Wraps DeepSpeed's functions; call after importing deepspeed, before zero.Init."""
    from deepspeed.runtime.zero import partition_parameters as pp
    from deepspeed.runtime.zero import partitioned_param_coordinator as pc
    from deepspeed.runtime.zero import stage3

    coordinator = pc.PartitionedParameterCoordinator
    state = {"module": None, "forward": True}

    def fetch(original):
        def wrapper(self, current_submodule, forward, *args, **kwargs):
            rec = recording.current()
            state["module"], state["forward"] = current_submodule, forward
            rec.recomputing = rec.ctx.phase == recording.BACKWARD and forward
            label = rec.label_id(_module_name(current_submodule))
            with rec.context(label=label, purpose="fetch_wait"):
                out = original(self, current_submodule, forward, *args, **kwargs)
            claim_all(_own_params(current_submodule))
            return out
        return wrapper

    def gather(original):
        def wrapper(self, params, forward, *args, **kwargs):
            rec = recording.current()
            own = {id(p) for p in _fetched_for(state["module"])} if state["module"] else set()
            purpose = "param_fetch" if all(id(p) in own for p in params) else "prefetch"
            first = min(params, key=lambda p: p.ds_id) if params else None
            with rec.context(purpose=purpose, unit=unit_of(first) if first is not None else -1):
                out = original(self, params, forward, *args, **kwargs)
            claim_all(params)
            return out
        return wrapper

    def release(original):
        def wrapper(self, submodule, *args, **kwargs):
            rec = recording.current()
            with rec.context(label=rec.label_id(_module_name(submodule)), purpose="param_release"):
                return original(self, submodule, *args, **kwargs)
        return wrapper

    def release_all(original):
        def wrapper(self, module, *args, **kwargs):
            rec = recording.current()
            with rec.context(purpose="param_release"):
                return original(self, module, *args, **kwargs)
        return wrapper

    _wrap(coordinator, "fetch_sub_module", fetch)
    _wrap(coordinator, "_PartitionedParameterCoordinator__all_gather_params", gather)
    _wrap(coordinator, "release_sub_module", release)
    _wrap(coordinator, "release_and_reset_all", release_all)

    def partition_sec(original):
        def wrapper(self, param, *args, **kwargs):
            rec = recording.current()
            updated = kwargs.get("has_been_updated", args[1] if len(args) > 1 else False)
            with rec.context(purpose="secondary_partition_copy", unit=unit_of(param)):
                replaced = _free_when_dropped(param) if updated else None
                try:
                    out = original(self, param, *args, **kwargs)
                finally:
                    if replaced is not None:
                        replaced.detach()  # still held (kept, as from 0.13.2): not freed
            claim_param(param)
            return out
        return wrapper

    def partition_param(original):
        def wrapper(self, param, *args, **kwargs):
            claim_param(param)  # the gathered tensor, before it is freed
            out = original(self, param, *args, **kwargs)
            claim_param(param)
            return out
        return wrapper

    def convert(original):
        def wrapper(self, param, *args, **kwargs):
            out = original(self, param, *args, **kwargs)
            register_param(param)
            claim_param(param)
            return out
        return wrapper

    _wrap(pp.Init, "_convert_to_deepspeed_param", convert)
    _wrap(pp.Init, "_partition_param_sec", partition_sec)
    _wrap(pp.Init, "_partition_param", partition_param)

    def free_param(original):
        def wrapper(param, *args, **kwargs):
            rec = recording.current()
            unit = unit_of(param)
            claim_param(param)
            if rec.allocator:
                # The free is the storage's deallocation (Recording.start_allocator): after
                # free_param's record_stream, where `param.data = torch.empty(0)` drops the last
                # reference, and for a coalesced gather's flat buffer when its last parameter is
                # released. Logged once, with this parameter as the unit.
                with rec.context(unit=unit if unit >= 0 else rec.ctx.unit):
                    return original(param, *args, **kwargs)
            span = rec.byte_range(param.data)
            if unit >= 0 and span is not None:
                with rec.context(unit=unit, purpose=rec.ctx.purpose):
                    rec.push("free", rec.current_stream, lifetime=rec.lifetime_of(param.data),
                             region=span)
            return original(param, *args, **kwargs)
        return wrapper

    _wrap(pp, "free_param", free_param)

    optimizer = stage3.DeepSpeedZeroOptimizer_Stage3

    def invalidate(original):
        def wrapper(self, *args, **kwargs):
            rec = recording.current()
            if rec.allocator:  # each secondary's deallocation is logged where it is dropped
                with rec.context(purpose="secondary_invalidate"):
                    return original(self, *args, **kwargs)
            for group in self.fp16_groups:
                for param in group:
                    sec = getattr(param, "ds_secondary_tensor", None)
                    span = rec.byte_range(sec) if sec is not None else None
                    if span is not None:
                        with rec.context(unit=unit_of(param), purpose="secondary_invalidate"):
                            rec.push("free", rec.current_stream, lifetime=rec.lifetime_of(sec),
                                     region=span)
            return original(self, *args, **kwargs)
        return wrapper

    _wrap(optimizer, "invalidate_secondary_tensor", invalidate)

    def reducing(original):
        def wrapper(self, *args, **kwargs):
            rec = recording.current()
            with rec.context(phase=recording.GRAD_REDUCE, purpose="grad_reduce"):
                return original(self, *args, **kwargs)
        return wrapper

    # The gradient hook of one parameter (stage3.py:1213 at v0.13.4): its argument's `grad` is
    # the tensor autograd wrote and __add_grad_to_ipg_bucket copies into the bucket. Claimed as
    # the parameter's gradient (role grad_full, as the builder declares it), so that a replay
    # can tell whose gradient each bucket copy carries.
    def reducing_param(original):
        def wrapper(self, param, *args, **kwargs):
            rec = recording.current()
            unit = unit_of(param)
            grad = getattr(param, "grad", None)
            if unit >= 0 and isinstance(grad, torch.Tensor):
                with rec.paused_ops():
                    rec.claim(grad, "grad_full", unit)
            with rec.context(phase=recording.GRAD_REDUCE, purpose="grad_reduce"):
                return original(self, param, *args, **kwargs)
        return wrapper

    _wrap(optimizer, "reduce_independent_p_g_buckets_and_remove_grads", reducing_param)
    _wrap(optimizer, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", reducing)

    # reduce_scatter_coalesced (comm/coalesced_collectives.py:118-120 at v0.13.4, 195-197 at
    # v0.17.6) pads each gradient's last chunk with a torch.empty() of its own, which torch.cat
    # then copies into the flat buffer it reduce-scatters: padding, never written and dropped
    # from the output (its narrow()s). Its only empty() allocations are those; stage3 calls the
    # function by the name it imported.
    def padding_allocs(original):
        def wrapper(*args, **kwargs):
            rec = recording.current()
            rec.padding_allocs += 1
            try:
                return original(*args, **kwargs)
            finally:
                rec.padding_allocs -= 1
        return wrapper

    _wrap(stage3, "reduce_scatter_coalesced", padding_allocs)

    # ZeRO-1/2 (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer): the gradient buckets'
    # reduction, labelled as stage 3's is. Not required: a version without one of them, or a
    # stage-3 run, records the same without its label (nothing is added to `missing`, so the
    # stage-3 recordings made before keep their source).
    try:
        from deepspeed.runtime.zero import stage_1_and_2
    except ImportError:
        return
    zero12 = stage_1_and_2.DeepSpeedZeroOptimizer
    for name in ("reduce_ipg_grads", "average_tensor", "allreduce_and_copy",
                 "allreduce_and_copy_with_multiple_ranks", "buffered_reduce_fallback",
                 "reduce_gradients"):
        if hasattr(zero12, name):
            _wrap(zero12, name, reducing)
