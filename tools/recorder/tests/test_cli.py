"""Bad input to `hpzlab record`: one line naming the file and the key, exit 2, nothing written."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
RECORD = HERE.parents[1] / "record"
DATA = HERE / "data"


def run(tmp: pathlib.Path, *, hf=None, ds=None, extra=()) -> subprocess.CompletedProcess:
    out = tmp / "out.json"
    args = [str(RECORD), "--hf-config", str(hf or DATA / "llama-tiny.json"), "--ds-config",
            str(ds or DATA / "ds-hpz8.json"), "--nodes", "2", "--gpus-per-node", "8", "--out",
            str(out), *extra]
    result = subprocess.run(args, capture_output=True, text=True)
    assert not out.exists(), "nothing is written on bad input"
    return result


def write(tmp: pathlib.Path, name: str, value) -> pathlib.Path:
    path = tmp / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def ds_with(**zero) -> dict:
    ds = json.loads((DATA / "ds-hpz8.json").read_text())
    ds["zero_optimization"].update(zero)
    return ds


@pytest.mark.parametrize("case,expected", [
    ({"extra": ["--deepspeed", "0.12.0"]},
     "--deepspeed: unknown version '0.12.0' (supported: 0.10.0, 0.10.1, 0.10.3, 0.11.0, 0.12.3, "
     "0.12.6, 0.13.1, 0.13.4, 0.13.5, 0.14.2, 0.14.3, 0.14.4, 0.15.4, 0.16.4, 0.16.9, 0.17.2, "
     "0.17.4, 0.17.5, 0.17.6, 0.18.2, 0.18.3, 0.18.5, 0.18.7, 0.18.8, 0.18.9, 0.19.0, 0.19.8)"),
    ({"extra": ["--deepspeed", "0.18.7"]},
     "--deepspeed 0.18.7 does not run on torch 2.1.2: runtime/zero/linear.py:35 calls "
     "torch.amp.custom_fwd (torch 2.4)"),
    ({"extra": ["--torch", "2.3.0"]}, "--torch: unknown version '2.3.0' (supported: 2.1.2, 2.10.0)"),
    ({"extra": ["--torch", "2.10.0", "--deepspeed", "0.18.7", "--transformers", "4.51.3"]},
     "--transformers: unknown version '4.51.3' (supported: 5.24.0 with --torch 2.10.0)"),
    ({"hf": "missing.json"}, "missing.json: model config: no such file"),
    ({"ds": ("bad.json", "{not json")}, "bad.json: DeepSpeed config: not JSON (line 1"),
    ({"ds": ("stage0.json", ds_with(stage=0))}, "zero_optimization.stage: the recorder records "
     "ZeRO stages 1, 2 and 3 (allowed: 1, 2, 3); got 0"),
    ({"ds": ("stage2-hpz.json", ds_with(stage=2))}, "zero_optimization.zero_hpz_partition_size: "
     "8 with stage 2: hpZ exists only in stage 3"),
    ({"ds": ("stage2.json", ds_with(stage=2, zero_hpz_partition_size=1)),
      "extra": ["--load", "pretrained"]},
     "--load pretrained with zero_optimization.stage 2: the load is transformers' ZeRO-3 loader"),
    ({"ds": ("hpz3.json", ds_with(zero_hpz_partition_size=3))},
     "zero_optimization.zero_hpz_partition_size: 3 does not divide the world size 16"),
    ({"ds": ("typo.json", ds_with(stage3_param_persitance_threshold=10))},
     "DeepSpeed 0.13.4 rejects it: 1 validation error for DeepSpeedZeroConfig "
     "stage3_param_persitance_threshold extra fields not permitted"),
    ({"hf": ("size.json", {"model_type": "llama", "hidden_size": "big"})},
     "size.json: hidden_size: expected a positive integer, got 'big'"),
    ({"hf": ("kind.json", {"model_type": "nosuchmodel"})},
     "kind.json: model_type: 'nosuchmodel' is not a model type transformers 4.35.2 knows"),
    ({"extra": ["--nodes", "0"]}, "--nodes: 0 out of range (allowed: 1 to 4096)"),
    ({"ds": ("offload.json", ds_with(offload_param={"device": "cpu"}))},
     "zero_optimization.offload_param.device: 'cpu': the recorder runs DeepSpeed on a CPU"),
    ({"extra": ["--transformers", "4.40.0"]},
     "--transformers: unknown version '4.40.0' (supported: 4.35.2, 4.51.3, 4.57.1)"),
    ({"extra": ["--load", "checkpoint"]},
     "argument --load: invalid choice: 'checkpoint'"),
    ({"extra": ["--load", "pretrained", "--rank", "3"]},
     "--rank 3 with --load pretrained: only rank 0 copies the checkpoint in"),
], ids=["version", "needs-newer-torch", "torch", "transformers-of-torch", "missing", "not-json", "stage-0", "stage-2-hpz", "stage-2-load", "hpz-size", "deepspeed-refuses",
        "hf-size", "hf-type", "nodes", "offload", "transformers", "load", "load-one-rank"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, expected):
    kwargs = {}
    for key in ("hf", "ds"):
        if key in case:
            value = case[key]
            kwargs[key] = write(tmp_path, *value) if isinstance(value, tuple) else tmp_path / value
    result = run(tmp_path, extra=case.get("extra", ()), **kwargs)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hpzlab record: ") and expected in last, last


def test_no_pypi_when_the_environment_is_missing_is_one_line_and_exit_2(tmp_path):
    """An empty cache and a package index that refuses: says what is missing and how to get it."""
    env = dict(os.environ, HPZLAB_CACHE=str(tmp_path / "cache"),
               PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="", PIP_RETRIES="0",
               PIP_TIMEOUT="2")
    out = tmp_path / "out.json"
    result = subprocess.run([str(RECORD), "--hf-config", str(DATA / "llama-tiny.json"),
                             "--ds-config", str(DATA / "ds-hpz8.json"), "--nodes", "2",
                             "--gpus-per-node", "8", "--out", str(out)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hpzlab record: cannot install torch 2.1.2, transformers 4.35.2 from "
                           "PyPI") and "network access to pypi.org" in last, last
    assert not out.exists()
    leftovers = [p.name for p in (tmp_path / "cache" / "recorder").iterdir()
                 if p.name.startswith("base-") and p.is_dir()]
    assert leftovers == [], "a failed install leaves no environment behind"


def test_envs_lists_each_environment_and_prune_removes_the_stale_ones(tmp_path):
    """`--envs` says which cached environments the pins still make; `--prune-envs` removes the
    others (a changed pin's, an interrupted install's) and their logs, `--prune-envs all` every
    one. Fake environments in an empty cache: nothing is installed."""
    import sys
    sys.path.insert(0, str(HERE.parent))
    from hpzrec import env as recorder_env
    os.environ["HPZLAB_CACHE"] = str(tmp_path / "cache")
    try:
        current = sorted(recorder_env._current_names())[0]
    finally:
        del os.environ["HPZLAB_CACHE"]
    root = tmp_path / "cache" / "recorder"
    for name in (current, "deepspeed-0.13.4-000000000000", "base-a6724e2ca8f3.x1y2z3"):
        (root / name).mkdir(parents=True)
        (root / name / "file").write_bytes(b"x" * 1000)
    (root / "deepspeed-0.13.4-install.log").write_text("log")
    cache = dict(os.environ, HPZLAB_CACHE=str(tmp_path / "cache"))
    listed = subprocess.run([str(RECORD), "--envs"], capture_output=True, text=True, env=cache)
    assert listed.returncode == 0, listed.stderr
    assert f"{current}  0.00 GiB  current" in listed.stdout, listed.stdout
    assert "deepspeed-0.13.4-000000000000  0.00 GiB  stale: prune it" in listed.stdout
    assert "base-a6724e2ca8f3.x1y2z3  0.00 GiB  stale: prune it" in listed.stdout
    assert "3 environments" in listed.stdout
    pruned = subprocess.run([str(RECORD), "--prune-envs"], capture_output=True, text=True,
                            env=cache)
    assert pruned.returncode == 0, pruned.stderr
    assert "2 environments removed" in pruned.stdout, pruned.stdout
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [current]
    assert not (root / "deepspeed-0.13.4-install.log").exists()
    everything = subprocess.run([str(RECORD), "--prune-envs", "all"], capture_output=True,
                                text=True, env=cache)
    assert everything.returncode == 0 and "1 environments removed" in everything.stdout
    assert [p for p in root.iterdir() if p.is_dir()] == []
    bad = subprocess.run([str(RECORD), "--prune-envs", "some"], capture_output=True, text=True,
                         env=cache)
    assert bad.returncode == 2 and bad.stderr.startswith("hpzlab record: --envs takes nothing")
