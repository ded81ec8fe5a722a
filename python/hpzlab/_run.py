"""Runs the packaged hpzlab program and turns its JSON into Python objects.

`check` and `sim` write the user's dict configs to a temporary directory, run
`hpzlab check|sim ... --json FILE` (the JSON to a file, so that standard output still carries the
text report, the explanation of each finding) and read both back. Exit codes (docs/ci.md):
0 clean, 1 findings (check) or a hung simulation (sim), 2 bad input (one line on stderr,
raised as HpzlabError), 70 an internal error (raised as HpzlabError too).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]
ConfigLike = Union[PathLike, Mapping[str, Any], Any]

BINARY_ENV = "HPZLAB_BINARY"


class HpzlabError(Exception):
    """hpzlab refused its input (exit 2) or failed (exit 70, or a signal).

    str(error) is the program's one-line message (`hpzlab: error: FILE: KEY: ...`); `returncode`,
    `argv` and `stderr` (all of it) are kept too.
    """

    def __init__(self, message: str, *, returncode: Optional[int] = None,
                 argv: Optional[Sequence[str]] = None, stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.argv = list(argv or [])
        self.stderr = stderr


def binary() -> str:
    """The hpzlab program this package runs: $HPZLAB_BINARY when set, else the one installed in
    the package (hpzlab/bin/hpzlab)."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise HpzlabError(f"{BINARY_ENV}={override}: no such executable file")
        return override
    path = pathlib.Path(__file__).resolve().parent / "bin" / "hpzlab"
    if not path.is_file():
        raise HpzlabError(f"the hpzlab package has no program at {path} (installed without "
                          f"`pip install`?); set {BINARY_ENV} to an hpzlab program")
    return str(path)


# --- the JSON, as objects ----------------------------------------------------------------------


@dataclasses.dataclass
class Finding:
    """One group of findings of one checked schedule (the JSON's `findings[]`, docs/checker.md):
    `count` findings like `first` vs `second` on `buffer`, with the missing edge (`detail`),
    what would add it in DeepSpeed (`fix`) and what a user does about it (`remedy`: the release
    that fixes it, or the config key that avoids it). `release` is the DeepSpeed release (or epoch of releases, "A-B")
    whose schedule has it, None when the check named none."""

    kind: str
    count: int
    scenario: str
    variant: str
    release: Optional[str]
    detail: str
    fix: str
    first: Dict[str, Any]
    second: Dict[str, Any]
    buffer: Dict[str, Any]
    ranks: List[int]
    layers: List[int]
    steps: List[int]
    raw: Dict[str, Any] = dataclasses.field(repr=False)

    @property
    def remedy(self) -> str:
        """What to do about it, in one sentence (the JSON's `remedy`)."""
        return str(self.raw.get("remedy", ""))

    @property
    def signature(self) -> str:
        """`race: secondary_partition_copy vs prefetch, on the secondary`, as the JSON's
        `releases.findings[].signature` and the README's table name it."""
        return (f"{self.kind}: {self.first.get('purpose')} vs {self.second.get('purpose')}, "
                f"on the {self.buffer.get('role')}")


@dataclasses.dataclass
class ReleaseVerdict:
    """The verdict on one DeepSpeed release: its epoch (the releases that issue the same
    schedule), whether it was checked (False: the builder refused it, `refused` says why),
    whether it is clean, the counts per finding kind, its findings, and the known DeepSpeed
    defects of that release on this run (`defects`: rule ids such as
    "qwz-quantizer-reads-half", bugs that are not ordering bugs; a defect makes it unclean)."""

    release: Optional[str]  # None: a verdict that names no one release
    scenario: str
    epoch: List[str]
    checked: bool
    clean: bool
    counts: Dict[str, int]
    refused: Optional[str] = None
    findings: List[Finding] = dataclasses.field(default_factory=list)
    defects: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CheckResult:
    """What `hpzlab check` said. `clean` is the exit status's verdict (0 clean, 1 findings);
    `verdicts` one per release (and scenario); `findings` every group of findings; `text` the
    program's text report: the explanation of each finding when one release was checked, a line
    per epoch and the findings' history across releases when several were."""

    clean: bool
    returncode: int
    verdicts: List[ReleaseVerdict]
    findings: List[Finding]
    clean_in: Dict[str, List[str]]
    history: List[Dict[str, Any]]
    notes: List[str]
    text: str
    json: Dict[str, Any] = dataclasses.field(repr=False)
    #: check(explain=True): per clean verdict, what orders the hpZ secondary copies (the JSON's
    #: "explain": "guards", each with "what", "races_without", "deepspeed_fix", "places_alone")
    #: and "keys_at_ten_times"; empty otherwise.
    why_clean: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    argv: List[str] = dataclasses.field(repr=False, default_factory=list)

    @property
    def explanation(self) -> str:
        """The text report (for one release: each group of findings explained)."""
        return self.text

    @property
    def releases(self) -> Dict[Any, ReleaseVerdict]:
        """Verdicts by release ("0.13.4"); by (scenario, release) when several scenarios were
        checked."""
        scenarios = {v.scenario for v in self.verdicts}
        if len(scenarios) <= 1:
            return {v.release: v for v in self.verdicts}
        return {(v.scenario, v.release): v for v in self.verdicts}

    def verdict(self, release: Optional[str], scenario: Optional[str] = None) -> ReleaseVerdict:
        """The verdict on `release` (of `scenario`, or the first scenario that has it)."""
        for v in self.verdicts:
            if v.release == release and (scenario is None or v.scenario == scenario):
                return v
        raise KeyError(f"release {release} was not checked"
                       + (f" for {scenario}" if scenario else ""))


@dataclasses.dataclass
class SimResult:
    """What `hpzlab sim` said: the step time, tokens/s per node, exposed communication, which
    races manifested in how many runs (`races`), the hardware the times assume (`cluster`: nodes,
    gpus_per_node, gpu, nic_gbps, ...), and the whole JSON (`json`); `hung` when a simulated run
    never finished (exit 1)."""

    scenario: str
    variant: str
    world_size: int
    steps: int
    step_time_s: float
    tokens_per_s_per_node: float
    exposed_comm_s: float
    races_manifested: int
    races: List[Dict[str, Any]]
    runs: List[Dict[str, Any]]
    hung: bool
    cluster: Dict[str, Any]
    notes: List[str]
    text: str
    returncode: int
    json: Dict[str, Any] = dataclasses.field(repr=False)
    argv: List[str] = dataclasses.field(repr=False, default_factory=list)


def _finding(raw: Mapping[str, Any], release: Optional[str]) -> Finding:
    return Finding(kind=raw.get("kind", ""), count=int(raw.get("count", 0)),
                   scenario=raw.get("scenario", ""), variant=raw.get("variant", ""),
                   release=release, detail=raw.get("detail", ""), fix=raw.get("fix", ""),
                   first=dict(raw.get("first", {})), second=dict(raw.get("second", {})),
                   buffer=dict(raw.get("buffer", {})), ranks=list(raw.get("ranks", [])),
                   layers=list(raw.get("layers", [])), steps=list(raw.get("steps", [])),
                   raw=dict(raw))


def _split_findings(doc: Mapping[str, Any]) -> List[List[Mapping[str, Any]]]:
    """The JSON's `findings` split by the checked schedule (`scenarios[]`) they belong to.

    The program lists each checked schedule's groups after the previous one's, in the order of
    `scenarios`, and a schedule's groups add up to its counts (cmd_check.cpp, json_report.cpp),
    so they are taken in turn until each schedule's total is reached."""
    findings = list(doc.get("findings", []))
    out: List[List[Mapping[str, Any]]] = []
    i = 0
    for s in doc.get("scenarios", []):
        total = sum(int(n) for n in s.get("counts", {}).values())
        mine: List[Mapping[str, Any]] = []
        taken = 0
        while i < len(findings) and taken < total and \
                findings[i].get("scenario") == s.get("scenario"):
            mine.append(findings[i])
            taken += int(findings[i].get("count", 0))
            i += 1
        out.append(mine)
    if i < len(findings) and out:  # not expected; keep them rather than lose them
        out[-1].extend(findings[i:])
    return out


def _check_result(doc: Dict[str, Any], text: str, returncode: int,
                  argv: List[str]) -> CheckResult:
    scenarios = list(doc.get("scenarios", []))
    per_schedule = _split_findings(doc)
    verdicts: List[ReleaseVerdict] = []
    findings: List[Finding] = []
    releases = doc.get("releases")
    if releases:
        # The epochs are the checked schedules in order, refused ones too (those have no
        # `scenarios` entry): the k-th checked epoch is scenarios[k].
        k = 0
        for epoch in releases.get("epochs", []):
            label = _epoch_label(epoch.get("releases", []))
            mine: List[Finding] = []
            if epoch.get("checked"):
                mine = [_finding(f, label) for f in
                        (per_schedule[k] if k < len(per_schedule) else [])]
                k += 1
            findings.extend(mine)
            for release in epoch.get("releases", []):
                verdicts.append(ReleaseVerdict(
                    release=release, scenario=epoch.get("scenario", ""),
                    epoch=list(epoch.get("releases", [])), checked=bool(epoch.get("checked")),
                    clean=bool(epoch.get("clean")), counts=dict(epoch.get("counts", {})),
                    refused=epoch.get("refused"), findings=mine,
                    defects=list(epoch.get("defects", []))))
    else:
        for s, raws in zip(scenarios, per_schedule):
            release = (s.get("source") or {}).get("deepspeed")
            mine = [_finding(f, release) for f in raws]
            findings.extend(mine)
            counts = {kind: n for kind, n in s.get("counts", {}).items() if n}
            defects = [d.get("rule", "") for d in doc.get("defects", [])
                       if d.get("scenario") == s.get("scenario")]
            verdicts.append(ReleaseVerdict(
                release=release, scenario=s.get("scenario", ""),
                epoch=[release] if release else [], checked=True,
                clean=bool(s.get("clean")) and not defects, counts=counts, findings=mine,
                defects=defects))
    clean_in = {c.get("scenario", ""): list(c.get("releases", []))
                for c in (releases or {}).get("clean_in", [])}
    return CheckResult(clean=bool(doc.get("clean")) and returncode == 0, returncode=returncode,
                       verdicts=verdicts, findings=findings, clean_in=clean_in,
                       history=list((releases or {}).get("findings", [])),
                       notes=list(doc.get("notes", [])), text=text, json=doc, argv=argv,
                       why_clean=list(doc.get("explain", [])))


def _epoch_label(releases: Sequence[str]) -> Optional[str]:
    if not releases:
        return None
    return releases[0] if len(releases) == 1 else f"{releases[0]}-{releases[-1]}"


def _sim_result(doc: Dict[str, Any], text: str, returncode: int, argv: List[str]) -> SimResult:
    return SimResult(scenario=doc.get("scenario", ""), variant=doc.get("variant", ""),
                     world_size=int(doc.get("world_size", 0)), steps=int(doc.get("steps", 0)),
                     step_time_s=float(doc.get("step_time_s", 0.0)),
                     tokens_per_s_per_node=float(doc.get("tokens_per_s_per_node", 0.0)),
                     exposed_comm_s=float(doc.get("exposed_comm_s", 0.0)),
                     races_manifested=int(doc.get("races_manifested", 0)),
                     races=list(doc.get("races", [])), runs=list(doc.get("runs", [])),
                     hung=bool(doc.get("hung", False)), cluster=dict(doc.get("cluster", {})),
                     notes=list(doc.get("notes", [])),
                     text=text, returncode=returncode, json=doc, argv=argv)


# --- running the program -----------------------------------------------------------------------


def _config_file(value: ConfigLike, name: str, tmp: pathlib.Path) -> str:
    """A path as it is; a dict (or an object with to_dict(), as a Hugging Face config) written to
    tmp/name as JSON."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: a path, a dict or an object with to_dict(), "
                        f"not {type(value).__name__}")
    path = tmp / name
    # default=str: a torch.dtype or a Path left in a config is written as its name.
    path.write_text(json.dumps(value, indent=2, default=str) + "\n")
    return str(path)


def _set_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _set_args(overrides: Union[None, Mapping[str, Any], Iterable[str]]) -> List[str]:
    if overrides is None:
        return []
    if isinstance(overrides, str):
        overrides = [overrides]
    items = ([f"{k}={_set_value(v)}" for k, v in overrides.items()]
             if isinstance(overrides, Mapping) else [str(o) for o in overrides])
    args: List[str] = []
    for item in items:
        args += ["--set", item]
    return args


def _releases_arg(deepspeed: Union[None, str, Iterable[str]]) -> Optional[str]:
    if deepspeed is None:
        return None
    if isinstance(deepspeed, str):
        return deepspeed
    return ",".join(str(v) for v in deepspeed)


# The keyword arguments check() and sim() share, as the one-command flags they become
# (tools/hpzlab/main.cpp's UserFlags): (keyword, flag). `deepspeed` may be a list; a bool is a
# switch.
_ONE_COMMAND_FLAGS: Tuple[Tuple[str, str], ...] = (
    ("nodes", "--nodes"), ("gpus_per_node", "--gpus-per-node"), ("deepspeed", "--deepspeed"),
    ("torch", "--torch"), ("step_stream", "--step-stream"), ("gpu", "--gpu"),
    ("nic_gbps", "--nic-gbps"),
    ("nics_per_node", "--nics-per-node"), ("nvlink_gbytes_per_s", "--nvlink-gbytes-per-s"),
    ("hf_trainer", "--hf-trainer"), ("from_config", "--from-config"))


def _one_command_args(tmp: pathlib.Path, given: Mapping[str, Any], *,
                      many_scenarios: bool) -> List[str]:
    """The program's arguments for the one-command keywords in `given` (a call's locals)."""
    args: List[str] = []
    scenario = given.get("scenario")
    if scenario is not None:
        if isinstance(scenario, (str, os.PathLike)):
            args.append(os.fspath(scenario))
        elif many_scenarios:
            args += [os.fspath(s) for s in scenario]
        else:
            raise TypeError("scenario: one path")
    if given.get("ds_config") is not None:
        args += ["--ds-config", _config_file(given["ds_config"], "ds_config.json", tmp)]
    if given.get("hf_config") is not None:
        args += ["--hf-config", _config_file(given["hf_config"], "config.json", tmp)]
    for keyword, flag in _ONE_COMMAND_FLAGS:
        value = given.get(keyword)
        if isinstance(value, bool):
            args += [flag] if value else []
        elif keyword == "deepspeed" and value is not None:
            args += [flag, _releases_arg(value)]
        elif value is not None:
            args += [flag, str(value)]
    return args + _set_args(given.get("set"))


def _call(subcommand: str, given: Mapping[str, Any], extra: List[str],
          timeout: Optional[float], *,
          many_scenarios: bool) -> Tuple[Dict[str, Any], str, int, List[str]]:
    with tempfile.TemporaryDirectory(prefix="hpzlab-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        args = _one_command_args(tmp, given, many_scenarios=many_scenarios) + extra
        return _run(subcommand, args, tmp / f"{subcommand}.json", timeout)


def _error_line(stderr: str, returncode: int) -> str:
    """The program's one line (`hpzlab: error: ...`, exit 2); for a crash, what killed it."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("hpzlab: error:") or line.startswith("hpzlab: internal error"):
            return line
    if returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    return f"hpzlab {how}" + (f": {lines[-1]}" if lines else " and said nothing")


def _run(subcommand: str, args: List[str], json_path: pathlib.Path,
         timeout: Optional[float]) -> Tuple[Dict[str, Any], str, int, List[str]]:
    argv = [binary(), subcommand] + args + ["--json", str(json_path)]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise HpzlabError(f"hpzlab {subcommand}: no answer in {timeout} s", argv=argv) from e
    if proc.returncode not in (0, 1):
        raise HpzlabError(_error_line(proc.stderr, proc.returncode), returncode=proc.returncode,
                          argv=argv, stderr=proc.stderr)
    try:
        doc = json.loads(json_path.read_text())
    except (OSError, ValueError) as e:
        raise HpzlabError(f"hpzlab {subcommand} exited {proc.returncode} without its JSON "
                          f"({e}); stderr: {_error_line(proc.stderr, proc.returncode)}",
                          returncode=proc.returncode, argv=argv, stderr=proc.stderr) from e
    return doc, proc.stdout, proc.returncode, argv


def check(ds_config: Optional[ConfigLike] = None, hf_config: Optional[ConfigLike] = None, *,
          nodes: Optional[int] = None, gpus_per_node: Optional[int] = None,
          deepspeed: Union[None, str, Iterable[str]] = "0.13.4", torch: Optional[str] = None,
          step_stream: Optional[str] = None, hf_trainer: bool = False, from_config: bool = False,
          gpu: Optional[str] = None, nic_gbps: Optional[float] = None,
          nics_per_node: Optional[int] = None, nvlink_gbytes_per_s: Optional[float] = None,
          scenario: Union[None, PathLike, Sequence[PathLike]] = None,
          set: Union[None, Mapping[str, Any], Iterable[str]] = None,  # noqa: A002 (the flag's name)
          explain: bool = False, timeout: Optional[float] = None) -> CheckResult:
    """`hpzlab check`: is the schedule DeepSpeed issues for this run free of ordering bugs?

    ds_config, hf_config: a path, a dict, or (hf_config) a Hugging Face config object (its
    to_dict()). nodes, gpus_per_node: the cluster; None leaves the program's default (2 x 8) or
    the scenario's. deepspeed: a release, several ("0.13.4,0.13.5" or a list), a range
    ("0.13.0..0.19.8"), "latest" or "all"; None with a scenario that names its own. torch: the
    run's torch version. step_stream: "default" or "side", the stream the training script issues
    forward and backward from (DeepSpeed issue 7898). gpu, nic_gbps, nics_per_node, nvlink_gbytes_per_s: the hardware (a GPU
    preset, one NIC's Gbit/s, NICs per node, NVLink GB/s per GPU); None keeps the scenario's.
    hf_trainer: the run uses the HF Trainer (its "auto" values filled as it
    fills them). from_config: the model is trained from its config (not fine-tuned). scenario: a
    scenario file (or several). set: scenario keys to override, {"zero.overlap_comm": False} or
    ["zero.overlap_comm=false"]. explain: on a clean verdict, say what orders each hpZ secondary
    copy and which keys would break it (`why_clean`; seconds to a minute). Raises HpzlabError
    with the program's one-line message on bad input.
    """
    doc, text, rc, argv = _call("check", locals(), ["--explain"] if explain else [], timeout,
                                many_scenarios=True)
    return _check_result(doc, text, rc, argv)


def sim(ds_config: Optional[ConfigLike] = None, hf_config: Optional[ConfigLike] = None, *,
        nodes: Optional[int] = None, gpus_per_node: Optional[int] = None,
        deepspeed: Optional[str] = "0.13.4", torch: Optional[str] = None,
        step_stream: Optional[str] = None, hf_trainer: bool = False, from_config: bool = False,
        gpu: Optional[str] = None, nic_gbps: Optional[float] = None,
        nics_per_node: Optional[int] = None, nvlink_gbytes_per_s: Optional[float] = None,
        scenario: Optional[PathLike] = None,
        set: Union[None, Mapping[str, Any], Iterable[str]] = None,  # noqa: A002
        runs: Optional[int] = None, trace: Optional[PathLike] = None,
        op_times: bool = False, timeout: Optional[float] = None) -> SimResult:
    """`hpzlab sim`: the step in simulated time (SimGrid) and which races manifest in it.

    The same arguments as check (deepspeed: one release), and runs (how many runs with
    different jitter seeds), trace (a Chrome trace-event JSON of the first run written there),
    op_times (every op's times in .json["op_times"]).
    """
    if deepspeed is not None and not isinstance(deepspeed, str):
        raise TypeError("sim: deepspeed is one release")
    extra: List[str] = []
    if runs is not None:
        extra += ["--runs", str(runs)]
    if trace is not None:
        extra += ["--trace", os.fspath(trace)]
    if op_times:
        extra.append("--op-times")
    doc, text, rc, argv = _call("sim", locals(), extra, timeout, many_scenarios=False)
    return _sim_result(doc, text, rc, argv)
