"""hpzlab from Python: check the schedule DeepSpeed ZeRO-3 with hpZ issues for your run.

    import hpzlab
    result = hpzlab.check(ds_config="ds_config.json", hf_config="config.json",
                          nodes=2, gpus_per_node=8, deepspeed="0.13.4,0.13.5")
    result.verdict("0.13.4").clean, result.findings, print(result.text)

    hpzlab.preflight(engine)            # in a training script, after deepspeed.initialize
    Trainer(..., callbacks=[hpzlab.HpzlabPreflightCallback()])

Every call runs the hpzlab program installed in the package (hpzlab.binary(); $HPZLAB_BINARY
overrides it). docs/python.md in hpzlab's repository says more.
"""
from __future__ import annotations

from typing import Any

from ._run import (CheckResult, Finding, HpzlabError, ReleaseVerdict, SimResult, binary, check,
                   sim)
from .preflight import (HpzlabPreflightError, HpzlabWarning, installed_versions, preflight)

try:
    from importlib.metadata import PackageNotFoundError, version as _version
    __version__ = _version("hpzlab")
except PackageNotFoundError:  # run from the source tree
    __version__ = "0+unknown"

__all__ = ["CheckResult", "Finding", "HpzlabError", "HpzlabPreflightCallback",
           "HpzlabPreflightError", "HpzlabWarning", "ReleaseVerdict", "SimResult", "binary",
           "check", "installed_versions", "preflight", "sim"]


def __getattr__(name: str) -> Any:
    # HpzlabPreflightCallback subclasses transformers.TrainerCallback when transformers is
    # there; it is made on first use so that `import hpzlab` never imports transformers.
    if name == "HpzlabPreflightCallback":
        from ._callback import callback_class
        return callback_class()
    raise AttributeError(f"module 'hpzlab' has no attribute {name!r}")
