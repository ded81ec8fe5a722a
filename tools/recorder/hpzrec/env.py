"""The recorder's Python environment: pinned packages from PyPI, cached outside the build tree.

Layout under the cache (HPZLAB_CACHE, else $XDG_CACHE_HOME/hpzlab, else ~/.cache/hpzlab):
  recorder/base-<digest>/          a venv with requirements/base.txt (torch 2.1.2,
                                   transformers 4.35.2, numpy < 2, DeepSpeed's dependencies)
  recorder/deepspeed-<version>-<digest>/   DeepSpeed itself (pip --target), one per version
  recorder/transformers-<version>-<digest>/  a later transformers (and the tokenizers it needs),
                                   pip --target, put before the base's on the path: for model
                                   families transformers 4.35 does not have (Qwen3, Gemma, Phi-3;
                                   DeepSeek-V2 with 4.57.1)
The digest is of the requirements file, so a changed pin gets a fresh directory. Each is built
in a temporary directory and renamed into place when complete, under a lock, so concurrent
tests share one install and an interrupted one leaves nothing half-made. Only the standard
library is used here: this runs before the environment exists.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

REQUIREMENTS = pathlib.Path(__file__).resolve().parent.parent / "requirements"


class EnvError(Exception):
    """The environment cannot be made: one line saying what is missing and how to get it."""


def supported_versions() -> list[str]:
    """DeepSpeed versions with a pinned requirements file, oldest first."""
    names = [p.name[len("deepspeed-"):-len(".txt")] for p in REQUIREMENTS.glob("deepspeed-*.txt")]
    return sorted(names, key=lambda v: tuple(int(x) for x in v.split(".")))


BASE_TRANSFORMERS = "4.35.2"  # the one requirements/base.txt pins


def supported_transformers() -> list[str]:
    """transformers versions the recorder can run: the base's, then each overlay's, oldest first."""
    names = [p.name[len("transformers-"):-len(".txt")]
             for p in REQUIREMENTS.glob("transformers-*.txt")]
    return [BASE_TRANSFORMERS] + sorted(names, key=lambda v: tuple(int(x) for x in v.split(".")))


def cache_dir() -> pathlib.Path:
    root = os.environ.get("HPZLAB_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "hpzlab")
    return pathlib.Path(root) / "recorder"


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _run(cmd: list, what: str, log: pathlib.Path) -> None:
    env = dict(os.environ, DS_BUILD_OPS="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    with open(log, "w") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        lines = [l.strip() for l in log.read_text(errors="replace").splitlines() if l.strip()]
        last = next((l for l in reversed(lines) if "ERROR" in l), lines[-1] if lines else "")
        raise EnvError(f"cannot install {what} from PyPI ({last}); it needs network access to "
                       f"pypi.org once, then {cache_dir()} is reused (full log: {log})")


def _build_once(target: pathlib.Path, build) -> pathlib.Path:
    """Runs build(tmp) unless target exists; renames tmp to target. Serialized by a lock."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            print(f"hpzlab record: installing {target.name} into {target.parent} "
                  "(once; a few minutes)", file=sys.stderr, flush=True)
            build(tmp)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _system_python() -> str:
    for candidate in ("/usr/bin/python3", shutil.which("python3") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EnvError("no python3 found (Debian: apt-get install python3 python3-venv)")


def base_env() -> pathlib.Path:
    """The venv with torch and transformers; made on first use."""
    req = REQUIREMENTS / "base.txt"
    target = cache_dir() / f"base-{_digest(req)}"

    def build(tmp: pathlib.Path) -> None:
        python = _system_python()
        probe = subprocess.run([python, "-c", "import sys, ensurepip, venv; "
                                "sys.exit(0 if (3, 8) <= sys.version_info[:2] <= (3, 11) else 3)"],
                               capture_output=True)
        if probe.returncode == 3:
            raise EnvError(f"{python} is not Python 3.8 to 3.11, which torch 2.1.2 needs")
        if probe.returncode != 0:
            raise EnvError(f"{python} has no venv module (Debian: apt-get install python3-venv)")
        _run([python, "-m", "venv", str(tmp)], "a virtual environment", tmp.parent / "venv.log")
        _run([str(tmp / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir",
              "--require-hashes", "-r", str(req)], "torch 2.1.2, transformers 4.35.2",
             tmp.parent / "base-install.log")

    return _build_once(target, build)


def deepspeed_dir(version: str) -> pathlib.Path:
    """DeepSpeed `version` installed without its compiled ops; made on first use."""
    req = REQUIREMENTS / f"deepspeed-{version}.txt"
    target = cache_dir() / f"deepspeed-{version}-{_digest(req)}"
    python = base_env() / "bin" / "python"

    def build(tmp: pathlib.Path) -> None:
        _run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-deps",
              "--no-build-isolation", "--require-hashes", "--target", str(tmp), "-r", str(req)],
             f"deepspeed {version}", tmp.parent / f"deepspeed-{version}-install.log")

    return _build_once(target, build)


def transformers_dir(version: str) -> pathlib.Path | None:
    """A transformers overlay for `version`, made on first use; None for the base's own."""
    if version == BASE_TRANSFORMERS:
        return None
    req = REQUIREMENTS / f"transformers-{version}.txt"
    target = cache_dir() / f"transformers-{version}-{_digest(req)}"
    python = base_env() / "bin" / "python"

    def build(tmp: pathlib.Path) -> None:
        _run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-deps",
              "--require-hashes", "--target", str(tmp), "-r", str(req)],
             f"transformers {version}", tmp.parent / f"transformers-{version}-install.log")

    return _build_once(target, build)
