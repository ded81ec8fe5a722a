"""hpzlab.HpzlabPreflightCallback: the preflight as a Hugging Face Trainer callback.

The class is made on first use (hpzlab's module __getattr__), not when hpzlab is imported, so
importing hpzlab never imports transformers. With transformers importable it subclasses
transformers.TrainerCallback; without, it is a plain class that answers every `on_*` event the
Trainer's CallbackHandler calls (trainer_callback.py, transformers 4.35.2: call_event runs
getattr(callback, event)(args, state, control, model=..., ...) on every callback for every
event), doing nothing but on_train_begin.
"""
from __future__ import annotations

from typing import Any, Optional

from .preflight import preflight

_made: Optional[type] = None


class _Events:
    """Every Trainer event, a no-op (the duck-typed TrainerCallback)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def _ds_config_of(args: Any) -> Any:
    # TrainingArguments keeps the resolved config in hf_deepspeed_config.config
    # (training_args.py:1679 and trainer.py:1217 at 4.35.2; deepspeed_init, trainer.py:1636,
    # fills its "auto"s before on_train_begin, trainer.py:1789); args.deepspeed is what the user
    # gave (a path or a dict).
    hf = getattr(args, "hf_deepspeed_config", None)
    config = getattr(hf, "config", None)
    if isinstance(config, dict):
        return config
    return getattr(args, "deepspeed", None)


def _on_train_begin(self, args, state, control, **kwargs):
    if state is not None and getattr(state, "is_world_process_zero", True) is False:
        return None
    ds_config = _ds_config_of(args)
    if ds_config is None:  # not a DeepSpeed run: nothing for hpzlab to check
        return None
    options = dict(self.preflight_kwargs)
    world = getattr(args, "world_size", None)  # TrainingArguments.world_size
    options.setdefault("world_size", int(world) if world else None)
    options.setdefault("hf_trainer", True)
    options.setdefault("all_ranks", True)  # the Trainer's state said this is rank 0
    self.result = preflight(ds_config=ds_config, model=kwargs.get("model"), **options)
    return None


def _init(self, *, action: str = "warn", **preflight_kwargs: Any) -> None:
    """action: "warn" or "raise" (preflight's); other keywords go to hpzlab.preflight
    (gpus_per_node, world_size over args.world_size, from_config, versions, timeout)."""
    self.preflight_kwargs = dict(preflight_kwargs, action=action)
    self.result = None


def callback_class() -> type:
    """HpzlabPreflightCallback, made once."""
    global _made
    if _made is None:
        try:
            from transformers import TrainerCallback  # noqa: PLC0415 (lazily, on purpose)
            base: type = TrainerCallback
        except ImportError:
            base = _Events
        _made = type("HpzlabPreflightCallback", (base,), {
            "__init__": _init,
            "on_train_begin": _on_train_begin,
            "__module__": "hpzlab",
            "__doc__": "Runs hpzlab.preflight when the Hugging Face Trainer begins training "
                       "(rank 0): the Trainer's resolved DeepSpeed config, its model's config, "
                       "args.world_size, the installed DeepSpeed and torch. "
                       "Trainer(..., callbacks=[hpzlab.HpzlabPreflightCallback()]); "
                       "HpzlabPreflightCallback(action='raise') stops the run on a finding.",
        })
    return _made


__all__ = ["callback_class"]
