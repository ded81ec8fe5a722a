#!/usr/bin/env python3
"""hpzlab.preflight on a real DeepSpeedEngine, by hand (not in tools/test): DeepSpeed runs on the
CPU in the recorder's pinned environment (docs/record.md), and when its `deepspeed.initialize`
returns, preflight is given the engine, as a training script gives it.

    tests/python/preflight_real_engine.py 0.13.4    # warns: the hpZ race
    tests/python/preflight_real_engine.py 0.13.5    # silent
    tests/python/preflight_real_engine.py 0.13.4 trainer

The last: hpzlab.HpzlabPreflightCallback in transformers' own CallbackHandler (4.35.2, the
recorder's), with a real LlamaForCausalLM and TrainerState; the TrainingArguments are a stand-in
holding the ds_config where the Trainer keeps it (the recorder's environment has no accelerate,
which TrainingArguments needs).

It re-runs itself under the recorder's environment for that release (made on first use) with
this checkout's python/ on the path and $HPZLAB_BINARY (default build/hpzlab) as the program.
The engine is the recorder's rank 0 of 2 nodes x 2 GPUs, the model tests/data/ci/config.json,
the ds_config tests/data/ci/ds_config-racy.json.
"""
from __future__ import annotations

import os
import pathlib
import runpy
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]


def outer(release: str, mode: str) -> None:
    sys.path.insert(0, str(REPO / "tools" / "recorder"))
    from hpzrec import env  # noqa: PLC0415 (the recorder's, from this checkout)
    python = env.base_env() / "bin" / "python"
    path = [str(env.deepspeed_dir(release)), str(REPO / "tools" / "recorder"),
            str(REPO / "python")]
    run_env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=os.pathsep.join(path),
                   HPZLAB_BINARY=os.environ.get("HPZLAB_BINARY", str(REPO / "build" / "hpzlab")),
                   PREFLIGHT_INNER=release)
    os.execve(str(python), [str(python), __file__, release] + ([mode] if mode else []), run_env)


def trainer() -> None:
    import json  # noqa: PLC0415
    import types  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import transformers  # noqa: PLC0415
    from transformers.trainer_callback import (CallbackHandler, TrainerControl,  # noqa: PLC0415
                                               TrainerState)

    import hpzlab  # noqa: PLC0415
    tiny = json.loads((REPO / "tests/data/ci/config.json").read_text())
    config = transformers.LlamaConfig(**tiny)
    model = transformers.LlamaForCausalLM(config)
    ds = json.loads((REPO / "tests/data/ci/ds_config-racy.json").read_text())
    args = types.SimpleNamespace(hf_deepspeed_config=types.SimpleNamespace(config=ds),
                                 deepspeed=ds, world_size=4)
    callback = hpzlab.HpzlabPreflightCallback(gpus_per_node=2)
    assert isinstance(callback, transformers.TrainerCallback)
    handler = CallbackHandler([callback], model, None, None, None)
    state, control = TrainerState(), TrainerControl()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hpzlab.HpzlabWarning)
        handler.on_init_end(args, state, control)
        handler.on_train_begin(args, state, control)
        handler.on_step_end(args, state, control)
    result = callback.result
    print(f"preflight (Trainer callback, transformers {transformers.__version__}): argv "
          f"{' '.join(result.argv[1:])}", file=sys.stderr)
    for w in caught:
        print(f"preflight: warning: {w.message}", file=sys.stderr)
    raise SystemExit(0 if result.clean == (not caught) else 1)


def inner(release: str) -> None:
    import warnings  # noqa: PLC0415
    from hpzrec import stand_ins  # noqa: PLC0415
    install = stand_ins.install

    def install_then_wrap(*args, **kwargs):
        install(*args, **kwargs)
        import deepspeed  # noqa: PLC0415 (after the stand-ins, as hpzrec.run imports it)
        initialize = deepspeed.initialize

        def initialize_then_preflight(*a, **k):
            out = initialize(*a, **k)
            engine = out[0]
            import hpzlab  # noqa: PLC0415
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", hpzlab.HpzlabWarning)
                result = hpzlab.preflight(engine, gpus_per_node=2)
            print(f"preflight: engine {type(engine).__name__}, DeepSpeed "
                  f"{hpzlab.installed_versions()['deepspeed']}, argv "
                  f"{' '.join(result.argv[1:])}", file=sys.stderr)
            for v in result.verdicts:
                print(f"preflight: {v.release}: clean={v.clean} {v.counts}", file=sys.stderr)
            for w in caught:
                print(f"preflight: warning: {w.message}", file=sys.stderr)
            raise SystemExit(0 if result.clean == (not caught) else 1)
        deepspeed.initialize = initialize_then_preflight

    stand_ins.install = install_then_wrap
    out = tempfile.mkdtemp(prefix="hpzlab-preflight-")
    sys.argv = ["hpzrec.run", "--hf-config", str(REPO / "tests/data/ci/config.json"),
                "--ds-config", str(REPO / "tests/data/ci/ds_config-racy.json"), "--nodes", "2",
                "--gpus-per-node", "2", "--deepspeed", release, "--rank", "0", "--steps", "1",
                "--out", os.path.join(out, "schedule.json")]
    runpy.run_module("hpzrec.run", run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["trainer"]):
        sys.exit("usage: preflight_real_engine.py DEEPSPEED_RELEASE [trainer]")
    mode = sys.argv[2] if len(sys.argv) == 3 else ""
    if os.environ.get("PREFLIGHT_INNER") != sys.argv[1]:
        outer(sys.argv[1], mode)
    elif mode == "trainer":
        trainer()
    else:
        inner(sys.argv[1])
