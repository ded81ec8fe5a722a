"""The recorder's Python environment: pinned packages from PyPI, cached outside the build tree.

Layout under the cache (HPZLAB_CACHE, else $XDG_CACHE_HOME/hpzlab, else ~/.cache/hpzlab):
  recorder/base-<digest>/          a venv with requirements/base.txt (torch 2.1.2,
                                   transformers 4.35.2, numpy < 2, DeepSpeed's dependencies)
  recorder/base-torch-<torch>-<digest>/   a second venv with requirements/base-torch-<torch>.txt
                                   (a later torch and its transformers, `--torch`), for the
                                   DeepSpeed releases that need a torch newer than 2.1
  recorder/deepspeed-<version>-<digest>/   DeepSpeed itself (pip --target), one per version,
                                   with any other pin of its requirements file (pydantic 1
                                   for 0.10.0 to 0.11.1)
  recorder/deepspeed-<version>-torch<torch>-<digest>/   the same, installed by the later venv
                                   (its setup.py imports torch and DeepSpeed)
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
BASE_TORCH = "2.1.2"  # the one requirements/base.txt pins


def supported_torch() -> list[str]:
    """torch versions with a base environment: the default's, then each base-torch-*.txt's."""
    names = [p.name[len("base-torch-"):-len(".txt")] for p in REQUIREMENTS.glob("base-torch-*.txt")]
    return [BASE_TORCH] + sorted(names, key=lambda v: tuple(int(x) for x in v.split(".")))


def _base_requirements(torch: str) -> pathlib.Path:
    return REQUIREMENTS / ("base.txt" if torch == BASE_TORCH else f"base-torch-{torch}.txt")


def base_transformers(torch: str = BASE_TORCH) -> str:
    """The transformers version the base environment of `torch` pins."""
    if torch == BASE_TORCH:
        return BASE_TRANSFORMERS
    for line in _base_requirements(torch).read_text().splitlines():
        if line.startswith("transformers=="):
            return line.split("==")[1].split()[0]
    raise EnvError(f"requirements/base-torch-{torch}.txt pins no transformers")


# DeepSpeed releases that do not run on torch 2.1.2, and why (their source, checked on it).
NEEDS_NEWER_TORCH = {
    "0.18.3": "its ZeRO-3 gradient hook asserts torch.autograd.graph._get_grad_fn_or_grad_acc "
              "(runtime/utils.py:1376, called from runtime/zero/stage3.py:1277), which torch "
              "2.1.2 lacks",
    "0.18.7": "runtime/zero/linear.py:35 calls torch.amp.custom_fwd (torch 2.4) when imported, "
              "and its setup.py imports it: it does not even install",
    "0.18.8": "runtime/zero/linear.py:35 calls torch.amp.custom_fwd (torch 2.4) when imported, "
              "and its setup.py imports it: it does not even install",
    "0.18.9": "compile/custom_ops/all_to_all.py:12 decorates with torch.library.custom_op "
              "(torch 2.4) when imported, and its setup.py imports it: it does not even install",
    "0.19.0": "compile/custom_ops/all_to_all.py:12 decorates with torch.library.custom_op "
              "(torch 2.4) when imported, and its setup.py imports it: it does not even install",
    "0.19.8": "runtime/zero/parameter_offload.py:68 calls torch.compiler.is_compiling (torch "
              "2.3) at every parameter access",
}


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


def _run(cmd: list, what: str, log: pathlib.Path, pythonpath: str | None = None) -> None:
    env = dict(os.environ, DS_BUILD_OPS="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
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


# The Python versions each base's torch has wheels for.
_PYTHONS = {BASE_TORCH: ((3, 8), (3, 11))}
_LATER_PYTHONS = ((3, 10), (3, 14))  # torch 2.10 has wheels for 3.10 to 3.14


def base_env(torch: str = BASE_TORCH) -> pathlib.Path:
    """The venv with torch and transformers; made on first use."""
    req = _base_requirements(torch)
    name = "base" if torch == BASE_TORCH else f"base-torch-{torch}"
    target = cache_dir() / f"{name}-{_digest(req)}"
    low, high = _PYTHONS.get(torch, _LATER_PYTHONS)

    def build(tmp: pathlib.Path) -> None:
        python = _system_python()
        probe = subprocess.run([python, "-c", "import sys, ensurepip, venv; "
                                f"sys.exit(0 if {low} <= sys.version_info[:2] <= {high} else 3)"],
                               capture_output=True)
        if probe.returncode == 3:
            raise EnvError(f"{python} is not Python {low[0]}.{low[1]} to {high[0]}.{high[1]}, "
                           f"which torch {torch} needs")
        if probe.returncode != 0:
            raise EnvError(f"{python} has no venv module (Debian: apt-get install python3-venv)")
        _run([python, "-m", "venv", str(tmp)], "a virtual environment", tmp.parent / "venv.log")
        _run([str(tmp / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir",
              "--require-hashes", "-r", str(req)],
             f"torch {torch}, transformers {base_transformers(torch)}",
             tmp.parent / f"{name}-install.log")

    return _build_once(target, build)


def deepspeed_dir(version: str, torch: str = BASE_TORCH) -> pathlib.Path:
    """DeepSpeed `version` installed without its compiled ops, by the base environment of
    `torch`; made on first use."""
    req = REQUIREMENTS / f"deepspeed-{version}.txt"
    tag = "" if torch == BASE_TORCH else f"-torch{torch}"
    target = cache_dir() / f"deepspeed-{version}{tag}-{_digest(req)}"
    python = base_env(torch) / "bin" / "python"

    def build(tmp: pathlib.Path) -> None:
        log = tmp.parent / f"deepspeed-{version}{tag}-install.log"
        # A requirements file may pin, besides DeepSpeed, a package the base has in a version
        # that release cannot import: 0.10.0 to 0.11.1 require pydantic<2.0.0
        # (requirements/requirements.txt at v0.11.0) and read pydantic 1's FieldInfo.required
        # when imported (runtime/config_utils.py:116 at v0.11.0, from the class body of
        # zero.Init, runtime/zero/partition_parameters.py:725), which the base's pydantic 2
        # lacks. Those go into the same target first, and DeepSpeed's setup.py, which imports
        # DeepSpeed, sees them there (the target is first on the path when recording too).
        deepspeed_req, others = _split_requirements(req)
        if others:
            extra = tmp.parent / f"{tmp.name}-others.txt"
            extra.write_text(others)
            try:
                _run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-deps",
                      "--require-hashes", "--target", str(tmp), "-r", str(extra)],
                     f"deepspeed {version}'s pins besides DeepSpeed", log)
            finally:
                extra.unlink()
            req_now = tmp.parent / f"{tmp.name}-deepspeed.txt"
            req_now.write_text(deepspeed_req)
        else:
            req_now = req
        try:
            _run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-deps",
                  "--no-build-isolation", "--require-hashes", "--target", str(tmp), "-r",
                  str(req_now)], f"deepspeed {version}", log,
                 pythonpath=str(tmp) if others else None)
        finally:
            if req_now != req:
                req_now.unlink()

    return _build_once(target, build)


def _split_requirements(req: pathlib.Path) -> tuple[str, str]:
    """A lock.py file cut in two: DeepSpeed's entry, and every other pin's (hash lines kept)."""
    deepspeed, others, current = [], [], None
    for line in req.read_text().splitlines(keepends=True):
        if line.startswith("#"):
            continue
        if line.strip() and not line[0].isspace():
            current = deepspeed if line.lower().startswith("deepspeed==") else others
        if current is not None:
            current.append(line)
    return "".join(deepspeed), "".join(others)


def transformers_dir(version: str, torch: str = BASE_TORCH) -> pathlib.Path | None:
    """A transformers overlay for `version`, made on first use; None for the base's own. The
    overlays go on torch 2.1.2's base only (a later base brings its own transformers)."""
    if version == base_transformers(torch):
        return None
    if torch != BASE_TORCH:
        raise EnvError(f"--transformers {version}: torch {torch}'s environment has transformers "
                       f"{base_transformers(torch)} and no other")
    req = REQUIREMENTS / f"transformers-{version}.txt"
    target = cache_dir() / f"transformers-{version}-{_digest(req)}"
    python = base_env() / "bin" / "python"

    def build(tmp: pathlib.Path) -> None:
        _run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-deps",
              "--require-hashes", "--target", str(tmp), "-r", str(req)],
             f"transformers {version}", tmp.parent / f"transformers-{version}-install.log")

    return _build_once(target, build)


def _current_names() -> set:
    """The directory names the requirements files make today (a changed pin makes another)."""
    names = set()
    for torch in supported_torch():
        base = "base" if torch == BASE_TORCH else f"base-torch-{torch}"
        names.add(f"{base}-{_digest(_base_requirements(torch))}")
        tag = "" if torch == BASE_TORCH else f"-torch{torch}"
        for version in supported_versions():
            names.add(f"deepspeed-{version}{tag}-{_digest(REQUIREMENTS / f'deepspeed-{version}.txt')}")
    for version in supported_transformers()[1:]:
        names.add(f"transformers-{version}-{_digest(REQUIREMENTS / f'transformers-{version}.txt')}")
    return names


def _size(path: pathlib.Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _installed() -> list:
    """(name, current) of each environment directory, by name."""
    root = cache_dir()
    if not root.is_dir():
        return []
    current = _current_names()
    return [(p.name, p.name in current) for p in sorted(root.iterdir()) if p.is_dir()]


def environments() -> list:
    """The installed environments, by name: (name, bytes, current). `current` is false for one
    that no requirements file makes any more (a pin changed since), and for an install that was
    interrupted (a temporary directory)."""
    return [(name, _size(cache_dir() / name), current) for name, current in _installed()]


def prune(everything: bool) -> list:
    """Removes the environments that are not current (every one with `everything`), under the
    install lock, and the install logs no remaining environment belongs to; returns (name,
    bytes) of each environment removed."""
    root = cache_dir()
    if not root.is_dir():
        return []
    removed = []
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, current in _installed():  # only what is removed is measured
            if current and not everything:
                continue
            removed.append((name, _size(root / name)))
            shutil.rmtree(root / name, ignore_errors=True)
        kept = [p.name for p in root.iterdir() if p.is_dir()]
        for log in root.glob("*-install.log"):
            stem = log.name[:-len("-install.log")]
            if not any(name.startswith(stem + "-") for name in kept):
                log.unlink(missing_ok=True)
    return removed
