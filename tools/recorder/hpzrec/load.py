"""`--load pretrained`: a state dict loaded into the model as from_pretrained loads it under ZeRO-3.

from_pretrained builds the model under zero.Init (the recorder does that, hpzrec.model), then
copies the checkpoint into it with transformers' own ZeRO-3 loader, called here as it is:
  - transformers 4.35.2: `_load_state_dict_into_model(model_to_load, state_dict, start_prefix)`
    (modeling_utils.py:518-575, called at :3824 with start_prefix "" and model_to_load the
    model when the checkpoint's keys are the model's, :3744-3747);
  - 4.51.3 and 4.57.1: `integrations.deepspeed._load_state_dict_into_zero3_model(model_to_load,
    state_dict)` (4.51.3 integrations/deepspeed.py:306-350, called at modeling_utils.py:4830;
    4.57.1 :309, called at modeling_utils.py:840);
  - 5.24.0: the same name with `load_config=None` (integrations/deepspeed.py:455-549, called at
    modeling_utils.py:4545 with the load config, whose weight_mapping converts a checkpoint's
    names; the state dict here has the model's own names, so there is nothing to convert).
Each walks the modules from the root; for a module whose own parameters (recurse=False) are in
the state dict it runs `with deepspeed.zero.GatheredParameters(params, modifier_rank=0): if
torch.distributed.get_rank() == 0: module._load_from_state_dict(...)`, then recurses into its
children. GatheredParameters (DeepSpeed 0.18.2 runtime/zero/partition_parameters.py:2212-2348)
gathers the parameters from their primary shards on __enter__ (`all_gather`, :2333-2336), and
on __exit__ broadcasts each from rank 0 and repartitions them with has_been_updated=True
(:2338-2348). From 0.14.3 (PR 5613) to 0.18.2, `Init._partition` calls
`_partition_param_sec(param)` without has_been_updated (:1631-1636), which returns early when a
secondary exists (:1772), so the hpZ secondary keeps zero.Init's values (DeepSpeed issue 7606);
0.18.3 passes it (PR 7707, commit c069ceb30).

transformers asks `is_deepspeed_zero3_enabled()`, which answers from the HfDeepSpeedConfig the
Trainer (or the user) keeps alive (4.35.2 integrations/deepspeed.py:239-260); that class checks
for accelerate, which the recorder's environment lacks (:76), so an object answering
`is_zero3()` as HfDeepSpeedConfig does for a stage-3 config stands in for it during the load.

What is logged: everything in phase "checkpoint_load", step -1, purpose "checkpoint_load"
(sim/ir/schedule.cpp's names), but for __enter__'s gather, which is DeepSpeed fetching the current
shards ("param_fetch"), and what probes.py labels itself (the secondary copy). Rank 0's
`param.copy_(input_param)` (torch/nn/modules/module.py:2040 at torch 2.1.2, :2493 at 2.10.0)
writes each gathered parameter's full buffer; the state dict is host memory, so a GPU's host
waits for the stream after each copy (ops._from_host_memory). The broadcast is an all-reduce
that ranks other than 0 only write (collectives.broadcast). Each GatheredParameters labels its
ops with the module whose parameters it holds and the first of them as the unit in focus.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import torch

from . import probes, recording


def state_dict(model: torch.nn.Module, seed: int, rank: int, meta_off_rank0: bool) -> dict:
    """A checkpoint of the model: deterministic values (a seeded generator, scaled as
    initializers scale them) of each tensor's shape and dtype, on the CPU, under every name
    model.state_dict() has. A tied parameter is saved once, under its first name, as
    save_pretrained (safetensors) drops the aliases that match `_tied_weights_keys` (4.35.2
    modeling_utils.py:2108-2146; Llama's is lm_head.weight, after model.embed_tokens.weight):
    a tied lm_head is not in the checkpoint and is not gathered; from_pretrained ties it again
    after.
    With `meta_off_rank0` (transformers 5, modeling_utils.py:4532-4533), ranks other than 0
    hold meta tensors: only rank 0 reads values."""
    generator = torch.Generator().manual_seed(seed)
    out, seen = {}, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        shape = tuple(getattr(t, "ds_shape", t.shape))
        values = torch.randn(shape, generator=generator, dtype=torch.float32) * 0.02
        if meta_off_rank0 and rank != 0:
            out[name] = torch.empty(shape, dtype=t.dtype, device="meta")
        else:
            out[name] = values.to(t.dtype)
    return out


class _Zero3:
    """What transformers' is_deepspeed_zero3_enabled() asks of HfDeepSpeedConfig."""

    def is_zero3(self) -> bool:
        return True


@contextlib.contextmanager
def _zero3_enabled() -> Iterator[None]:
    from transformers.integrations import deepspeed as hf_ds
    saved = hf_ds._hf_deepspeed_config_weak_ref
    answer = _Zero3()
    hf_ds.set_hf_deepspeed_config(answer)
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


@contextlib.contextmanager
def _labelled_gathers(model: torch.nn.Module) -> Iterator[None]:
    """deepspeed.zero.GatheredParameters, as transformers reaches it (`import deepspeed;
    deepspeed.zero.GatheredParameters(...)`), replaced for the load by a subclass that runs
    DeepSpeed's __init__, __enter__ and __exit__ unchanged and only sets the recording's context
    around them and the body between: the module's label, its first parameter as the unit."""
    import deepspeed
    original = deepspeed.zero.GatheredParameters
    owner = {id(p): name or "model" for name, m in model.named_modules()
             for p in m.parameters(recurse=False)}

    class Labelled(original):

        def __enter__(self):
            if not getattr(self, "enabled", False):
                return super().__enter__()
            rec = recording.current()
            first = self.params[0]
            self._hpzlab_ctx = rec.context(label=rec.label_id(owner.get(id(first), "model")),
                                           unit=probes.unit_of(first))
            self._hpzlab_ctx.__enter__()
            with rec.context(purpose="param_fetch"):
                out = super().__enter__()
            probes.claim_all(self.params)
            return out

        def __exit__(self, *exc):
            if not getattr(self, "enabled", False):
                return super().__exit__(*exc)
            try:
                return super().__exit__(*exc)
            finally:
                self._hpzlab_ctx.__exit__(None, None, None)

    deepspeed.zero.GatheredParameters = Labelled
    try:
        yield
    finally:
        deepspeed.zero.GatheredParameters = original


def _loader():
    """transformers' ZeRO-3 loader and how to call it (see the module's notes)."""
    from transformers import modeling_utils
    from transformers.integrations import deepspeed as hf_ds
    zero3 = getattr(hf_ds, "_load_state_dict_into_zero3_model", None)
    if zero3 is not None:
        names = list(inspect.signature(zero3).parameters)
        if names[:2] == ["model_to_load", "state_dict"]:
            return lambda model, sd: zero3(model, sd)
    legacy = modeling_utils._load_state_dict_into_model
    names = list(inspect.signature(legacy).parameters)
    if names != ["model_to_load", "state_dict", "start_prefix"]:
        raise RuntimeError("this transformers has neither _load_state_dict_into_zero3_model nor "
                           "4.35's _load_state_dict_into_model; --load cannot call its loader")
    return lambda model, sd: legacy(model, sd, "")


def load_pretrained(model: torch.nn.Module, seed: int) -> None:
    """The load, logged in phase checkpoint_load (see the module's notes)."""
    import transformers
    rec = recording.current()
    major = int(transformers.__version__.split(".")[0])
    with rec.paused_ops():  # the checkpoint is read from disk into host memory, not the GPU
        sd = state_dict(model, seed, torch.distributed.get_rank(), meta_off_rank0=major >= 5)
    rec.host_storages = {t.untyped_storage()._cdata for t in sd.values() if t.device.type == "cpu"}
    for key in rec.host_storages:
        # Made just now, outside the log: an address a dead storage had must not stand for
        # them (recording.lifetime_of starts a lifetime, written outside, at the first read).
        rec.live.pop(key, None)
    try:
        with rec.context(phase=recording.CHECKPOINT_LOAD, purpose=recording.CHECKPOINT_LOAD,
                         step=-1, label=-1, unit=-1), _zero3_enabled(), _labelled_gathers(model):
            result = _loader()(model, sd)
    finally:
        rec.host_storages = set()
    errors = result[0] if isinstance(result, tuple) else result
    if errors:
        raise RuntimeError(f"transformers could not load the state dict: {errors[0]}")
    # from_pretrained ties the weights again after loading (4.35.2 modeling_utils.py:3502)
    model.tie_weights()
