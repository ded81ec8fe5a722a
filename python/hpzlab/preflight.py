"""A check of the live training run before it trains: `hpzlab.preflight(engine)`.

It reads what the run really uses (the DeepSpeed config the engine holds, the model's config, the
world size, GPUs per node, the installed DeepSpeed and torch), runs `hpzlab check --deepspeed
<installed> --torch <installed>` on it and warns (or raises) with one sentence per kind of
finding: the cause and what to do (the README's table). Only rank 0 needs to run it; without an
initialized torch.distributed every process runs it.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import sys
import warnings
from typing import Any, Callable, Dict, Mapping, Optional

from ._run import CheckResult, Finding, HpzlabError, check


class HpzlabWarning(UserWarning):
    """The warning preflight gives on a finding (filter it, or turn it into an error, with the
    warnings module)."""


class HpzlabPreflightError(HpzlabError):
    """preflight(action="raise") found an ordering bug; `.result` is the check's result."""

    def __init__(self, message: str, result: CheckResult) -> None:
        super().__init__(message, returncode=result.returncode, argv=result.argv)
        self.result = result


def installed_versions() -> Dict[str, Optional[str]]:
    """The installed deepspeed, torch and transformers (importlib.metadata; None if absent)."""
    out: Dict[str, Optional[str]] = {}
    for name in ("deepspeed", "torch", "transformers"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _release(version: Optional[str]) -> Optional[str]:
    """`0.13.4+cu121` or `2.1.2+cu121` -> the release hpzlab knows (`0.13.4`, `2.1.2`)."""
    if not version:
        return None
    m = re.match(r"\d+(\.\d+)*", version)
    return m.group(0) if m else version


# --- what the live run uses ----------------------------------------------------------------------


def engine_ds_config(engine: Any) -> Optional[Any]:
    """The DeepSpeed config a DeepSpeedEngine runs with, as a dict (or a path).

    DeepSpeedEngine.__init__ keeps the user's `config` as given (a dict, a path or base64) in
    `self.config` and the parsed DeepSpeedConfig in `self._config` (deepspeed/runtime/engine.py,
    v0.13.4 lines 211-212; v0.10.0 lines 214-215, v0.19.5 lines 283-284); DeepSpeedConfig keeps
    the parsed dict in `_param_dict` (deepspeed/runtime/config.py, v0.13.4 lines 709-716: the
    dict itself, or the file or base64 loaded with hjson). `_param_dict` is read first, as the
    one always parsed.
    """
    parsed = getattr(getattr(engine, "_config", None), "_param_dict", None)
    if isinstance(parsed, Mapping):
        return dict(parsed)
    given = getattr(engine, "config", None)
    if isinstance(given, Mapping):
        return dict(given)
    if isinstance(given, (str, os.PathLike)) and os.path.isfile(given):
        return os.fspath(given)
    return None


def model_config_of(model: Any) -> Optional[Any]:
    """A Hugging Face model's config as a dict: model.config.to_dict(), through a DeepSpeed
    engine's `module` (and a DDP-like wrapper's) when given one."""
    seen = 0
    while model is not None and seen < 4:
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            return config.to_dict()
        if isinstance(config, Mapping) and "model_type" in config:
            return dict(config)
        model = getattr(model, "module", None)
        seen += 1
    return None


def _torch_distributed():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def world_size_of_run() -> Optional[int]:
    """torch.distributed's world size when initialized, else $WORLD_SIZE."""
    dist = _torch_distributed()
    if dist is not None:
        return int(dist.get_world_size())
    env = os.environ.get("WORLD_SIZE")
    return int(env) if env and env.isdigit() else None


def gpus_per_node_of_run() -> Optional[int]:
    """$LOCAL_WORLD_SIZE (set by torchrun and the deepspeed launcher), else
    torch.cuda.device_count() when torch is imported and sees GPUs."""
    env = os.environ.get("LOCAL_WORLD_SIZE")
    if env and env.isdigit():
        return int(env)
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.device_count()) or None
    except Exception:  # a broken CUDA setup is not preflight's to report
        return None
    return None


def _rank() -> int:
    dist = _torch_distributed()
    return int(dist.get_rank()) if dist is not None else 0


# --- one sentence per finding ------------------------------------------------------------------

# The README's "You got a finding: what now" table, by the finding's two purposes.
_REMEDIES = {
    ("race", "secondary_partition_copy", "prefetch"): (
        "the hpZ race (DeepSpeed issue 5059): the secondary shard is copied on the compute stream "
        "while a prefetched hpZ all-gather reads it, and the loss can turn NaN",
        "upgrade DeepSpeed to 0.18.3 or later (or 0.13.5-0.14.2), or set "
        "zero_hpz_partition_size to 1 (hpZ off)"),
    ("stale-read", "optimizer_step", "prefetch"): (
        "the optimizer step's weights never reach the hpZ secondary shard (DeepSpeed issue 4851), "
        "so the next step's forward reads stale weights",
        "upgrade DeepSpeed to 0.18.3 or later (or 0.13.5-0.14.2)"),
    ("stale-read", "checkpoint_load", "param_fetch"): (
        "the loaded weights never reach the hpZ secondary shard (DeepSpeed issue 7606), so the "
        "first step trains on zero.Init's random weights",
        "upgrade DeepSpeed to 0.18.3 or later (PR 7707)"),
}


def finding_sentence(finding: Finding) -> str:
    """One sentence: what the finding is, where, and what to do about it."""
    key = (finding.kind, finding.first.get("purpose"), finding.second.get("purpose"))
    where = f"{finding.count} times"
    if finding.layers:
        lo, hi = min(finding.layers), max(finding.layers)
        where += f", layer{'s' if lo != hi else ''} {lo}{'-' + str(hi) if lo != hi else ''}"
    release = f"DeepSpeed {finding.release}" if finding.release else "this DeepSpeed"
    if key in _REMEDIES:
        cause, remedy = _REMEDIES[key]
        return f"hpzlab: {release} with this config has {cause} ({where}); {remedy}."
    return (f"hpzlab: {release} with this config has a {finding.signature} ({where}): "
            f"{finding.detail}; fix: {finding.fix}.")


def _message(result: CheckResult) -> str:
    # One sentence per kind of finding (signature): its groups' counts and layers together.
    merged: Dict[str, Finding] = {}
    for f in result.findings:
        if f.signature not in merged:
            merged[f.signature] = dataclasses.replace(f, layers=list(f.layers))
            continue
        m = merged[f.signature]
        m.count += f.count
        m.layers = sorted(set(m.layers) | set(f.layers))
    sentences = [finding_sentence(f) for f in merged.values()]
    # Known DeepSpeed defects (not ordering bugs; docs/ci.md): one sentence each.
    for d in result.json.get("defects", []):
        releases = ", ".join(d.get("releases", [])) or "this"
        fixed = d.get("fixed_in")
        sentences.append(
            f"hpzlab: DeepSpeed {releases} with this config has the defect {d.get('rule')} "
            f"({d.get('pr')}), not an ordering bug: {d.get('what', '')}; "
            + (f"upgrade DeepSpeed to {fixed} or later." if fixed else "no release fixes it yet."))
    if not sentences:  # findings the JSON did not list: say what the counts say
        counts = ", ".join(f"{n} {k}" for v in result.verdicts for k, n in v.counts.items())
        sentences.append(f"hpzlab: this config has ordering bugs ({counts})")
    return " ".join(sentences) + " (the explanation: result.text, or `hpzlab check` with the " \
                                 "same flags)"


# --- the preflight ------------------------------------------------------------------------------


def preflight(engine: Any = None, *, ds_config: Any = None, model: Any = None,
              model_config: Any = None, world_size: Optional[int] = None,
              gpus_per_node: Optional[int] = None, action: str = "warn",
              hf_trainer: bool = False, from_config: bool = False,
              versions: Optional[Mapping[str, Optional[str]]] = None,
              version_lookup: Optional[Callable[[], Mapping[str, Optional[str]]]] = None,
              all_ranks: bool = False, timeout: Optional[float] = None) -> Optional[CheckResult]:
    """Checks the schedule the installed DeepSpeed issues for this run; call it before training.

    engine: the DeepSpeedEngine of deepspeed.initialize (its config and its module's config are
    read). ds_config / model / model_config: given instead of (or over) what the engine holds;
    model_config a dict, a path or an HF config object. world_size: default torch.distributed's,
    else $WORLD_SIZE. gpus_per_node: default $LOCAL_WORLD_SIZE, else torch.cuda.device_count().
    action: "warn" (warnings.warn an HpzlabWarning, one sentence per kind of finding: its cause
    and remedy; a run hpzlab cannot check is a warning too, and None is returned) or "raise"
    (HpzlabPreflightError on a finding, HpzlabError when hpzlab cannot check the run).
    hf_trainer / from_config: as for check.
    versions / version_lookup: the installed {"deepspeed", "torch", "transformers"} versions
    (default: importlib.metadata), given for tests or another environment. Runs on rank 0 only
    when torch.distributed is initialized (others return None at once) unless all_ranks.
    Returns the check's result (None on ranks that skipped it).
    """
    if action not in ("warn", "raise"):
        raise ValueError(f"action: 'warn' or 'raise', not {action!r}")
    if not all_ranks and _rank() != 0:
        return None
    if ds_config is None and engine is not None:
        ds_config = engine_ds_config(engine)
    if ds_config is None:
        raise HpzlabError("preflight: no DeepSpeed config: pass the engine of deepspeed.initialize"
                          " or ds_config=")
    if model_config is None:
        model_config = model_config_of(model if model is not None else engine)
    if model_config is None:
        raise HpzlabError("preflight: no model config: pass model= (a Hugging Face model, its "
                          ".config is read) or model_config= (a dict or config.json)")
    found = dict(versions) if versions is not None else dict((version_lookup or
                                                              installed_versions)())
    deepspeed = _release(found.get("deepspeed"))
    if deepspeed is None:
        raise HpzlabError("preflight: DeepSpeed is not installed (importlib.metadata finds no "
                          "deepspeed); pass versions={'deepspeed': ...}")
    world = world_size if world_size is not None else world_size_of_run()
    per_node = gpus_per_node if gpus_per_node is not None else gpus_per_node_of_run()
    nodes = None
    if world is not None and per_node:
        if world % per_node != 0:
            raise HpzlabError(f"preflight: world size {world} is not a multiple of "
                              f"{per_node} GPUs per node")
        nodes = world // per_node
    elif world is not None:  # one node holds them all
        nodes, per_node = 1, world
    try:
        result = check(ds_config=ds_config, hf_config=model_config, nodes=nodes,
                       gpus_per_node=per_node, deepspeed=deepspeed,
                       torch=_release(found.get("torch")), hf_trainer=hf_trainer,
                       from_config=from_config, timeout=timeout)
    except HpzlabError as e:
        # hpzlab cannot model this run (a key it refuses, a model family it lacks, a release
        # it does not know): that stops training only when asked to.
        if action == "raise":
            raise
        warnings.warn(f"hpzlab could not check this run: {e}", HpzlabWarning, stacklevel=2)
        return None
    if not result.clean:
        message = _message(result)
        if action == "raise":
            raise HpzlabPreflightError(message, result)
        warnings.warn(message, HpzlabWarning, stacklevel=2)
    return result
