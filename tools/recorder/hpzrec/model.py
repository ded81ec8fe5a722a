"""The model and the training loop DeepSpeed runs while it is recorded.

The model is the one transformers (4.35.2, or the later release --transformers names) builds
from the user's config.json
(AutoModelForCausalLM.from_config), created under deepspeed.zero.Init so that every parameter is
partitioned as it is created, as DeepSpeed does with zero.Init. Gradient checkpointing is
transformers' own, with its default: reentrant with 4.35.2 on torch 2.1 (no kwargs passed, and
torch 2.1's checkpoint defaults to reentrant, torch/utils/checkpoint.py:428-437), non-reentrant
with 5.24.0 (modeling_utils.py:3157-3158, `{"use_reentrant": False}`), which recomputes through
torch's saved-tensor hooks. The loop is the usual one:
for every micro-batch batch.to(device), engine(batch).loss, engine.backward(loss),
engine.step() (DeepSpeed steps the optimizer at the accumulation boundary), then loss.item()
each step, as the Hugging Face Trainer logs it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import time
import torch

from . import load, probes, recording, stand_ins


@dataclasses.dataclass
class Training:
    """What the loop does: sizes that change activations, not DeepSpeed's decisions."""
    steps: int = 2
    micro_batch: int = 1
    seq_len: int = 16
    grad_accum: int = 1
    grad_checkpointing: bool = True
    seed: int = 1
    # How the training script moves each micro-batch to the GPU: "blocking" is
    # batch.to(device) from pageable memory, what the HF Trainer (_prepare_input) and
    # accelerate (send_to_device, non_blocking=False) do by default: PyTorch's copy_ issues
    # cudaMemcpyAsync on the current stream and then synchronizes that stream, so the host
    # waits for everything already queued on it. "non-blocking" (pinned memory,
    # non_blocking=True) waits for nothing. On this CPU the batch already sits where DeepSpeed
    # runs, so the recorder logs the wait itself.
    batch_copy: str = "blocking"
    # "pretrained": a state dict is loaded into the built model before deepspeed.initialize,
    # as from_pretrained loads a checkpoint under ZeRO-3 (hpzrec.load); "none": no load.
    load: str = "none"
    # The optimizer's parameter groups: "model" is one group of model.parameters() (DeepSpeed's
    # own optimizer from a ds_config "optimizer" section; the HF Trainer passes DeepSpeed a
    # DummyOptim of them then: integrations/deepspeed.py deepspeed_optim_sched); "hf-trainer"
    # the HF Trainer's own optimizer, made when the ds_config has no "optimizer" section:
    # Trainer.create_optimizer's two groups, with weight decay and without.
    param_groups: str = "model"


class ConfigError(Exception):
    """A model config the recorder cannot build: names the key."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key


def load_model_config(path: str):
    """transformers' config for a config.json; ConfigError names the key it stumbles on."""
    import json

    import transformers
    from transformers import AutoConfig
    release = f"transformers {transformers.__version__}"
    with open(path) as f:
        raw = json.load(f)
    if not isinstance(raw, dict):
        raise ConfigError("(top level)", "expected a JSON object")
    if "model_type" not in raw:
        raise ConfigError("model_type", "missing (transformers needs it to pick the model)")
    for key in _SIZES:
        value = raw.get(key)
        if key in raw and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(key, f"expected a positive integer, got {value!r}")
    try:
        config = AutoConfig.for_model(**raw)
    except ValueError as e:
        raise ConfigError("model_type", f"{raw['model_type']!r} is not a model type "
                          f"{release} knows") from e
    except (KeyError, TypeError) as e:
        raise ConfigError("model_type", f"{release} cannot read it: {e}") from e
    return config


_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim")


def optimizer_settings(ds_config: dict) -> dict:
    """The optimizer section's parameters, with DeepSpeed's section removed from the config.

    DeepSpeed builds FusedAdam from an "optimizer" section (runtime/engine.py
    _configure_basic_optimizer), a CUDA kernel. The recorder hands DeepSpeed torch's AdamW with
    the same parameters instead, as a client optimizer; ZeRO-3 wraps it the same way."""
    section = ds_config.pop("optimizer", None) or {}
    params = dict(section.get("params", {}))
    params.setdefault("lr", 1e-5)
    return {k: v for k, v in params.items() if k in ("lr", "betas", "eps", "weight_decay")}


@contextlib.contextmanager
def skip_init_weights_pass():
    """transformers 4.35.2's no_init_weights: the module-level flag that makes post_init skip
    the _init_weights pass (modeling_utils.py, `_init_weights = False`), and nothing else.

    Later releases' no_init_weights also replace torch.nn.init's functions by no-ops
    (4.51.3 modeling_utils.py:219-241), so the modules' own constructors would leave their
    weights unwritten and zero.Init's broadcast would read uninitialized memory; from_pretrained
    then overwrites them with the checkpoint, which the recorder does not load. The flag alone
    keeps every release's recording to the same init: constructors write, the pass is skipped.

    transformers 5 has no such flag: post_init calls init_weights(), which runs the pass
    (initialize_weights) and ties the weights (5.24.0 modeling_utils.py:1339, :3107-3117); its
    no_init_weights replaces init_weights by a no-op (initialization.py:277-278) besides
    torch.nn.init's functions (:267-274). Only the former is done here, as the 4.x flag did
    (which skipped the tie too: train() ties after)."""
    from transformers import modeling_utils
    if not hasattr(modeling_utils, "_init_weights"):
        owner = modeling_utils.PreTrainedModel
        saved_method = owner.init_weights
        owner.init_weights = lambda self: None
        try:
            yield
        finally:
            owner.init_weights = saved_method
        return
    saved = modeling_utils._init_weights
    modeling_utils._init_weights = False
    try:
        yield
    finally:
        modeling_utils._init_weights = saved


def _dtype_argument(dtype: torch.dtype) -> dict:
    import transformers
    major = int(transformers.__version__.split(".")[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


def _param_groups(model, kind: str, adam: dict):
    """The optimizer's parameters: model.parameters(), or the HF Trainer's two groups
    (Trainer.create_optimizer: the parameters get_decay_parameter_names names, with the run's
    weight decay, then the others with none; each in named_parameters order, requires_grad
    only). get_decay_parameter_names uses nothing of the Trainer but the model."""
    if kind == "model":
        return model.parameters()
    from transformers import Trainer
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n in decay],
             "weight_decay": adam.get("weight_decay", 0.0)},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]


def train(model_config, ds_config: dict, training: Training) -> dict:
    """Builds the model under zero.Init and trains it; returns facts for the IR's source."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    rec = recording.current()
    ds_config = copy.deepcopy(ds_config)
    adam = optimizer_settings(ds_config)
    ds_config.pop("scheduler", None)
    dtype = torch.bfloat16 if ds_config.get("bf16", {}).get("enabled") else (
        torch.float16 if ds_config.get("fp16", {}).get("enabled") else torch.float32)
    stand_ins.replace_quantizer(dtype)
    torch.manual_seed(training.seed)
    with rec.context(phase=recording.INIT, purpose="param_init"):
        # As from_pretrained does (_fast_init), transformers' _init_weights pass is skipped:
        # under zero.Init it gathers every parameter once more (apply_with_gather) to write
        # values that training from a checkpoint would overwrite.
        # ZeRO-1 and 2 keep every parameter whole on every rank: the model is built as it is,
        # and DeepSpeed's optimizer flattens and partitions the groups in deepspeed.initialize.
        stage = int(ds_config.get("zero_optimization", {}).get("stage", 3))
        partitioned = (deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=dtype)
                       if stage == 3 else contextlib.nullcontext())
        with partitioned, stand_ins.constant_initialization(), skip_init_weights_pass():
            try:
                # transformers 5 renamed torch_dtype to dtype (5.24.0 modeling_utils.py:1402-1406
                # still reads the old name, with a deprecation warning)
                model = AutoModelForCausalLM.from_config(model_config, **_dtype_argument(dtype))
            except ValueError as e:  # not a causal LM, or sizes that do not fit together
                raise ConfigError("model_type", " ".join(str(e).split())[:300]) from e
            # from_pretrained ties the output layer to the input embedding after building the
            # model (transformers 4.35.2 modeling_utils.py:3502, `model.tie_weights()`), which
            # post_init skips under no_init_weights (modeling_utils.py:1825-1831): without this
            # a tie_word_embeddings model would train an untied lm_head of its own.
            model.tie_weights()
        probes.name_modules(model)
        if training.load == "pretrained":
            # from_pretrained loads the checkpoint after the model is built under zero.Init and
            # before the Trainer calls deepspeed.initialize
            load.load_pretrained(model, training.seed)
            _progress("state dict loaded (as from_pretrained under ZeRO-3)")
        if training.grad_checkpointing:
            model.gradient_checkpointing_enable()
        zero = ds_config.get("zero_optimization", {})
        hpz = int(zero.get("zero_hpz_partition_size", 1))
        probes.register_units(model, rec.world_size, hpz)
        optimizer = torch.optim.AdamW(_param_groups(model, training.param_groups, adam), **adam)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        probes.claim_all(model.parameters())
    engine.train()
    _progress(f"model built and partitioned ({len(rec.units)} parameters)")
    vocab = model_config.vocab_size
    generator = torch.Generator().manual_seed(training.seed)
    skipped = []  # the steps DeepSpeed skipped (engine.skipped_steps counts them)
    for step in range(training.steps):
        for micro in range(training.grad_accum):
            batch = torch.randint(0, vocab, (training.micro_batch, training.seq_len),
                                  generator=generator)
            with rec.context(step=step, micro_step=micro, phase=recording.FORWARD,
                             purpose="forward_compute", label=-1):
                if training.batch_copy == "blocking":
                    rec.push("host_stream_sync", rec.current_stream)
                loss = engine(input_ids=batch, labels=batch).loss
            with rec.context(step=step, micro_step=micro, phase=recording.BACKWARD,
                             purpose="backward_compute", label=-1):
                engine.backward(loss)
                rec.recomputing = False
            # engine.step() after every micro-batch, as DeepSpeed's training loop has it: the
            # engine steps the optimizer only at the accumulation boundary
            # (is_gradient_accumulation_boundary, runtime/engine.py) and counts micro-steps.
            with rec.context(step=step, micro_step=micro, phase=recording.OPTIMIZER,
                             purpose="optimizer_step", label=-1):
                before = engine.skipped_steps
                engine.step()
                if engine.skipped_steps > before:
                    skipped.append(step)
                probes.claim_all(model.parameters())
        with rec.context(step=step, phase=recording.OPTIMIZER, purpose="step_sync", label=-1):
            loss.item()
        _progress(f"step {step + 1} of {training.steps} recorded")
    # What the loop dropped is freed here; the teardown after (engine, model) is not training.
    rec.close()
    facts = {"dtype": str(dtype).replace("torch.", "")}
    if skipped:
        facts["skipped_steps"] = ",".join(str(step) for step in skipped)
    return facts


def _progress(what: str) -> None:
    print(f"hpzlab record: {what} ({time.time() - _START:.0f} s)", file=sys.stderr, flush=True)


_START = time.time()
