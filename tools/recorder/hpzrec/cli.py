"""`hpzlab record`: arguments, checks of the input, the environment, then the recording.

This module runs first under the system's python3 (standard library only): it checks what it
can without DeepSpeed, makes sure the pinned environment exists (hpzrec.env), then runs
hpzrec.run inside it. Bad input is one line naming the file and key, exit 2; the output file is
written whole or not at all.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from . import env
from .slices import own_elements

EXIT_INPUT = 2
RECORD_SEQ_LEN = 23  # no model dimension equals it, so activation dimensions are identifiable


class InputError(Exception):
    """Bad input: the message is the one line the user sees."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hpzlab record",
        description="Run real DeepSpeed on this CPU (torch's fake process group, nothing sent) "
        "and write the schedule it issues for one rank, and every rank by symmetry, as hpzlab's "
        "schedule IR, which `hpzlab check|sim|repro --schedule FILE` read.")
    p.add_argument("--hf-config", required=True, help="the model's Hugging Face config.json")
    p.add_argument("--ds-config", required=True, help="the DeepSpeed config (JSON)")
    p.add_argument("--nodes", type=int, required=True, help="nodes of the cluster")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (ranks) per node")
    p.add_argument("--deepspeed", default="0.13.4", help="DeepSpeed version (default 0.13.4)")
    p.add_argument("--transformers", default=None,
                   help=f"transformers version that builds the model (default "
                   f"{env.BASE_TRANSFORMERS}, or the one --torch's environment has; a later one "
                   f"for families {env.BASE_TRANSFORMERS} does not have)")
    p.add_argument("--torch", default=env.BASE_TORCH,
                   help=f"the torch environment DeepSpeed runs in (default {env.BASE_TORCH}, "
                   "with transformers 4.35.2; a later one, with its own transformers, for the "
                   "DeepSpeed releases that need it)")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per GPU per micro-step (default: the ds_config's "
                   "train_micro_batch_size_per_gpu, else 1)")
    p.add_argument("--seq-len", type=int, default=2048,
                   help="sequence length the kernel costs are scaled to (default 2048); "
                   f"DeepSpeed itself runs with {RECORD_SEQ_LEN} tokens, which changes no "
                   "decision of its")
    p.add_argument("--grad-checkpointing", choices=("on", "off"), default="on",
                   help="transformers' gradient checkpointing (default on)")
    p.add_argument("--batch-copy", choices=("blocking", "non-blocking"), default="blocking",
                   help="how the training script moves each micro-batch to the GPU: blocking "
                   "(batch.to(device), the HF Trainer's and accelerate's default: the host waits "
                   "for the compute stream first) or non-blocking (pinned, non_blocking=True); "
                   "default blocking")
    p.add_argument("--rank", type=_rank, default="auto",
                   help="which ranks DeepSpeed runs as. 'auto' (the default): rank 0, and one "
                   "rank of each other kind where the model's parameters do not divide by the "
                   "world (their padding makes those ranks' slices, and DeepSpeed's code paths, "
                   "differ), and with --load pretrained one rank other than 0 (only rank 0 "
                   "copies the checkpoint in); every other rank is written as the copy of its "
                   "kind's on its own groups. A number: that rank alone, every other rank its "
                   "copy (not with --load pretrained). 'all': DeepSpeed runs once as each rank")
    p.add_argument("--load", choices=("none", "pretrained"), default="none",
                   help="what is loaded into the model before deepspeed.initialize: none (the "
                   "default: zero.Init's own values), or pretrained (a state dict of every "
                   "parameter, copied in as transformers' from_pretrained does under ZeRO-3: "
                   "GatheredParameters with modifier_rank=0, rank 0 copies, a broadcast, a "
                   "repartition; logged in phase checkpoint_load)")
    p.add_argument("--param-groups", choices=("model", "hf-trainer"), default="model",
                   help="the optimizer's parameter groups: model (the default: one group, "
                   "model.parameters(), as DeepSpeed's own optimizer from a ds_config "
                   "\"optimizer\" section has them) or hf-trainer (the HF Trainer's own optimizer, "
                   "which it makes when the ds_config has no \"optimizer\" section: two groups, "
                   "with weight decay and without, as Trainer.create_optimizer makes them)")
    p.add_argument("--allocator", action="store_true",
                   help="record what PyTorch's caching allocator needs: every storage's "
                   "allocation and free (none dropped), and each Tensor.record_stream call as a "
                   "record_stream op; the file says \"allocator\": true, and the checker "
                   "applies its allocator rules to it")
    p.add_argument("--out", required=True, help="where to write the schedule JSON")
    p.add_argument("--verbose", action="store_true", help="DeepSpeed's own INFO logs too")
    p.add_argument("--in-env", action="store_true", help=argparse.SUPPRESS)
    return p


def _rank(text: str):
    """--rank: a number, "auto" or "all"."""
    if text in ("all", "auto"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank number, 'auto' or 'all', got {text!r}")


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: {what}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: {what}: cannot read it ({e.__class__.__name__})")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: {what}: not JSON (line {e.lineno}: {e.msg})")
    except RecursionError:
        raise InputError(f"{path}: {what}: nested too deeply")
    if not isinstance(value, dict):
        raise InputError(f"{path}: {what}: expected a JSON object at the top level")
    return value


def validate(args: argparse.Namespace) -> None:
    """Everything that can be checked without DeepSpeed."""
    versions = env.supported_versions()
    if args.deepspeed not in versions:
        raise InputError(f"--deepspeed: unknown version '{args.deepspeed}' "
                         f"(supported: {', '.join(versions)})")
    torches = env.supported_torch()
    if args.torch not in torches:
        raise InputError(f"--torch: unknown version '{args.torch}' "
                         f"(supported: {', '.join(torches)})")
    if args.torch == env.BASE_TORCH and args.deepspeed in env.NEEDS_NEWER_TORCH:
        later = [t for t in torches if t != env.BASE_TORCH]
        raise InputError(f"--deepspeed {args.deepspeed} does not run on torch {env.BASE_TORCH}: "
                         f"{env.NEEDS_NEWER_TORCH[args.deepspeed]}"
                         + (f"; add --torch {later[-1]}" if later else ""))
    if args.torch == env.BASE_TORCH:
        known = env.supported_transformers()
    else:
        known = [env.base_transformers(args.torch)]
    if args.transformers is None:
        args.transformers = known[0]
    if args.transformers not in known:
        raise InputError(f"--transformers: unknown version '{args.transformers}' "
                         f"(supported: {', '.join(known)}"
                         + (f" with --torch {args.torch})" if args.torch != env.BASE_TORCH
                            else ")"))
    for name, low, high in (("nodes", 1, 4096), ("gpus_per_node", 1, 64), ("steps", 1, 100),
                            ("seq_len", 1, 1 << 20)):
        value = getattr(args, name)
        if not low <= value <= high:
            raise InputError(f"--{name.replace('_', '-')}: {value} out of range "
                             f"(allowed: {low} to {high})")
    if args.micro_batch is not None and not 1 <= args.micro_batch <= 4096:
        raise InputError(f"--micro-batch: {args.micro_batch} out of range (allowed: 1 to 4096)")
    world = args.nodes * args.gpus_per_node
    if args.rank not in ("all", "auto") and not 0 <= args.rank < world:
        raise InputError(f"--rank: {args.rank} is not a rank of a world of {world}")
    if args.rank not in ("all", "auto") and args.load == "pretrained":
        raise InputError(f"--rank {args.rank} with --load pretrained: only rank 0 copies the "
                         "checkpoint in, so one rank cannot stand for the others; use --rank "
                         "auto (rank 0 and one other) or all")
    _read_json(args.hf_config, "model config")
    ds = _read_json(args.ds_config, "DeepSpeed config")
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict) or zero.get("stage") not in (1, 2, 3) or isinstance(
            zero.get("stage"), bool):
        raise InputError(f"{args.ds_config}: zero_optimization.stage: the recorder records "
                         f"ZeRO stages 1, 2 and 3 (allowed: 1, 2, 3); got {zero.get('stage')!r}"
                         if isinstance(zero, dict) else
                         f"{args.ds_config}: zero_optimization: expected an object")
    stage = zero["stage"]
    if stage < 3 and zero.get("zero_hpz_partition_size", 1) != 1:
        raise InputError(f"{args.ds_config}: zero_optimization.zero_hpz_partition_size: "
                         f"{zero['zero_hpz_partition_size']!r} with stage {stage}: hpZ exists "
                         "only in stage 3 (allowed: 1 below stage 3)")
    if stage < 3 and args.load == "pretrained":
        raise InputError(f"--load pretrained with zero_optimization.stage {stage}: the load is "
                         "transformers' ZeRO-3 loader (GatheredParameters); below stage 3 "
                         "from_pretrained loads before DeepSpeed partitions anything (allowed: "
                         "--load none)")
    for key in ("offload_param", "offload_optimizer"):
        # DeepSpeed offloads to host memory when the device is "cpu" or "nvme" (a missing or
        # "none" device, or a null section, offloads nothing: runtime/zero/offload_config.py).
        section = zero.get(key)
        device = section.get("device", "none") if isinstance(section, dict) else None
        if device not in (None, "none"):
            raise InputError(f"{args.ds_config}: zero_optimization.{key}.device: {device!r}: "
                             "the recorder runs DeepSpeed on a CPU, where the host memory it "
                             "offloads to and the GPU's memory are one, so the copies between "
                             "them and the host waits they make cannot be recorded (allowed: "
                             "'none', or no offload section)")
    hpz = zero.get("zero_hpz_partition_size", 1)
    if not isinstance(hpz, int) or hpz < 1 or world % hpz:
        raise InputError(f"{args.ds_config}: zero_optimization.zero_hpz_partition_size: {hpz!r} "
                         f"does not divide the world size {world}")
    out_dir = pathlib.Path(args.out).resolve().parent
    if not out_dir.is_dir():
        raise InputError(f"--out: {args.out}: no such directory {out_dir}")


def _pinned(args: argparse.Namespace) -> tuple:
    """The pinned environment's python and the environment hpzrec.run runs in (made on first
    use)."""
    if args.transformers is None:  # hpzrec.run's arguments: validate() resolved it before
        args.transformers = env.base_transformers(args.torch)
    python = env.base_env(args.torch) / "bin" / "python"
    ds_dir = env.deepspeed_dir(args.deepspeed, args.torch)
    tf_dir = env.transformers_dir(args.transformers, args.torch)
    recorder = pathlib.Path(__file__).resolve().parent.parent
    run_env = dict(os.environ, DS_ACCELERATOR="cpu",
                   PYTHONPATH=os.pathsep.join([str(ds_dir)] + ([str(tf_dir)] if tf_dir else [])
                                              + [str(recorder)]))
    if not args.verbose:
        run_env.setdefault("PYTHONWARNINGS", "ignore")
    run_env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    return python, run_env


def run_in_env(argv: list) -> None:
    """Replaces this process with hpzrec.run under the pinned environment's python."""
    python, run_env = _pinned(parser().parse_args(argv))
    os.execve(str(python), [str(python), "-m", "hpzrec.run"] + argv, run_env)


def _with(argv: list, flag: str, value: str) -> list:
    """argv with `flag`'s value replaced (or the flag added)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 2
            continue
        if argv[i].startswith(flag + "="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out + [flag, value]


def rank_kinds(doc: dict, rank0_alone: bool = False) -> list:
    """The ranks grouped by what their slices hold: for every unit, how its primary slice and
    its secondary slice meet the parameter's end (slices.own_elements). hpZ groups are blocks of
    consecutive ranks (utils/groups.py:505-530), and a rank's code paths (_partition_param,
    _partition_param_sec, reduce_scatter_coalesced's chunks) depend on these bounds and its
    groups only, so ranks of one kind issue the same schedule on their own groups. With
    `rank0_alone` (--load pretrained) rank 0 is a kind of its own: only it runs
    `module._load_from_state_dict` inside GatheredParameters and is the broadcast's source
    (transformers' ZeRO-3 loader, hpzrec.load). Ascending, rank 0's first."""
    world, hpz = doc["world_size"], max(1, doc["hpz_size"])
    if zero_stage(doc) < 3:
        # ZeRO-1/2 partition the flattened group of every parameter, not each parameter: each
        # rank copies and steps its own slice of the gradient buckets (allreduce_and_copy with
        # its bucket_ranks, average_tensor's partition ids), so every rank is a kind of its own.
        return [[r] for r in range(world)]
    kinds: dict = {}
    for r in range(world):
        key = tuple((own_elements(u["numel"], u["shard_numel"], r),
                     own_elements(u["numel"], u["secondary_numel"], r % hpz)
                     if u["secondary_numel"] else 0) for u in doc["units"])
        kinds.setdefault((rank0_alone and r == 0, key), []).append(r)
    return sorted(kinds.values())


def zero_stage(doc: dict) -> int:
    """The ZeRO stage a recording ran with (its source's ds_config_used)."""
    try:
        used = json.loads(doc["source"]["ds_config_used"])
        return int(used["zero_optimization"]["stage"])
    except (KeyError, TypeError, ValueError):
        return 3


def _run_ranks(argv: list, args: argparse.Namespace, ranks: list, tmp: str,
               first: dict | None = None) -> tuple:
    """DeepSpeed run once as each of `ranks` not in `first` (each in the pinned environment, as
    run_in_env would): ({rank: its document}, 0), or (None, the run's exit code) when one
    failed (its own message printed). The runs must agree on everything but the ranks (units,
    labels, groups), as DeepSpeed's ranks do."""
    import subprocess
    python, run_env = _pinned(args)
    docs = dict(first or {})
    for n, r in enumerate(ranks):
        if r in docs:
            continue
        print(f"hpzlab record: rank {r} ({n + 1} of {len(ranks)})", file=sys.stderr, flush=True)
        part = pathlib.Path(tmp) / f"rank{r}.json"
        one = _with(_with(argv, "--rank", str(r)), "--out", str(part))
        done = subprocess.run([str(python), "-m", "hpzrec.run"] + one, env=run_env)
        if done.returncode != 0:
            if done.returncode != EXIT_INPUT:  # bad input said its one line already
                print(f"hpzlab record: the run as rank {r} failed (exit {done.returncode}, its "
                      f"output above); nothing written to {args.out}", file=sys.stderr)
            return None, done.returncode
        docs[r] = json.loads(part.read_text())
        base = docs[min(docs)]
        for key in ("world_size", "hpz_size", "dtype_bytes", "labels", "units", "groups"):
            if docs[r][key] != base[key]:
                raise InputError(f"--rank: rank {r}'s run disagrees with rank {min(docs)}'s on "
                                 f"'{key}': DeepSpeed's ranks did not build the same model, "
                                 "which one document cannot hold")
    return docs, 0


def _write(argv: list, args: argparse.Namespace, doc: dict, recorded: str, tmp: str) -> None:
    """The document, as the user's command made it, written in one rename."""
    doc["source"]["recorded_rank"] = recorded
    doc["source"]["command"] = "hpzlab record " + " ".join(a for a in argv if a != "--in-env")
    doc["scenario"] = doc["source"]["command"]
    tmp_out = pathlib.Path(tmp) / "out.json"
    tmp_out.write_text(json.dumps(doc, separators=(",", ":")))
    os.replace(tmp_out, args.out)


def record_ranks(argv: list, args: argparse.Namespace) -> int:
    """--rank all: DeepSpeed runs as each rank, and each rank's own schedule is written.
    --rank auto: rank 0 first; where the model's parameters do not divide by the world, also
    the first rank of each other kind (rank_kinds), and every rank is written as the copy of
    its kind's first rank on its own groups (one kind: rank 0's document as --rank 0 writes
    it)."""
    import tempfile
    world = args.nodes * args.gpus_per_node
    out_dir = pathlib.Path(args.out).resolve().parent
    with tempfile.TemporaryDirectory(prefix=".hpzlab-record.", dir=out_dir) as tmp:
        if args.rank == "all":
            kinds = [[r] for r in range(world)]
            recorded, what = "all", "each recorded as itself"
            docs, code = _run_ranks(argv, args, list(range(world)), tmp)
        else:
            docs, code = _run_ranks(argv, args, [0], tmp)
            if docs is None:
                return code
            loads = args.load == "pretrained"
            kinds = rank_kinds(docs[0], rank0_alone=loads)
            firsts = [k[0] for k in kinds]
            recorded = ",".join(map(str, firsts))
            what = f"ranks {recorded} recorded, every other a copy of its kind's"
            if len(kinds) == 1:
                what = "rank 0 recorded, every other its copy"
            else:
                slices = len(rank_kinds(docs[0])) if loads else len(kinds)
                why = (f"the model's parameters do not divide by {world} ranks, so the ranks "
                       f"hold {slices} kinds of slices" if slices > 1 else "")
                if zero_stage(docs[0]) < 3:
                    why = (f"ZeRO stage {zero_stage(docs[0])}: each rank copies and steps its "
                           "own slice of the flattened gradients")
                    recorded, what = "all", "each recorded as itself"
                if loads:
                    why += ("; " if why else "") + ("only rank 0 copies the checkpoint in "
                                                    "(--load pretrained)")
                print(f"hpzlab record: {why}; recording ranks "
                      f"{', '.join(map(str, firsts[1:]))} too (first of each kind)",
                      file=sys.stderr, flush=True)
                docs, code = _run_ranks(argv, args, firsts, tmp, docs)
        if docs is None:
            return code
        merged = docs[0]
        for kind in kinds:
            for r in kind:
                merged["ranks"][r] = docs[kind[0]]["ranks"][r]
        _write(argv, args, merged, recorded, tmp)
    print(f"hpzlab record: wrote {args.out}: {world} ranks, {what}", file=sys.stderr)
    return 0


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def manage_envs(argv: list) -> int:
    """`--envs`: the cached environments, each with its size and whether the pinned
    requirements still make it; `--prune-envs [all]`: removes those they do not (all of them
    with `all`). Each environment is several GB (torch, DeepSpeed, transformers)."""
    if argv[0] == "--envs" and len(argv) == 1:
        envs = env.environments()
        for name, size, current in envs:
            print(f"{name}  {_gib(size)}  {'current' if current else 'stale: prune it'}")
        total = sum(size for _, size, _ in envs)
        print(f"{len(envs)} environments, {_gib(total)}, in {env.cache_dir()}"
              + ("" if all(c for _, _, c in envs) else
                 "; `hpzlab record --prune-envs` removes the stale ones"))
        return 0
    if argv[0] == "--prune-envs" and argv[1:] in ([], ["all"]):
        removed = env.prune(everything=argv[1:] == ["all"])
        for name, size in removed:
            print(f"removed {name} ({_gib(size)})")
        print(f"{len(removed)} environments removed, {_gib(sum(s for _, s in removed))} freed")
        return 0
    print("hpzlab record: --envs takes nothing, --prune-envs nothing or 'all' (allowed: "
          "hpzlab record --envs, hpzlab record --prune-envs [all])", file=sys.stderr)
    return EXIT_INPUT


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--envs", "--prune-envs"):
        return manage_envs(argv)
    args = parser().parse_args(argv)
    try:
        validate(args)
        if args.rank in ("all", "auto"):
            return record_ranks(argv, args)
        run_in_env(argv)
    except (InputError, env.EnvError) as e:
        print(f"hpzlab record: {e}", file=sys.stderr)
        return EXIT_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
