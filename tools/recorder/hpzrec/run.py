"""The recording itself, inside the pinned environment (started by hpzrec.cli).

Order matters: the stand-ins go in before DeepSpeed is imported (its CPU accelerator imports
the Intel extensions; the last of them, qgZ's quantizer, is the first to import DeepSpeed),
the recording accelerator is set before anything asks DeepSpeed for one,
and the op recorder is active from model construction (zero.Init) to the last step.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings

from . import cli, recording, stand_ins


def fill_auto(ds: dict, hidden: int, micro_batch: int) -> None:
    """The "auto" values the Hugging Face Trainer fills (transformers 4.35
    integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process and
    trainer_config_finalize), so a Trainer user's ds_config records as their run would."""
    zero = ds.get("zero_optimization", {})
    hf = {"reduce_bucket_size": hidden * hidden,
          "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
          "stage3_param_persistence_threshold": 10 * hidden}
    for key, value in hf.items():
        if zero.get(key) == "auto":
            zero[key] = value
    for key, value in (("train_micro_batch_size_per_gpu", micro_batch),
                       ("gradient_accumulation_steps", 1), ("gradient_clipping", 1.0)):
        if ds.get(key) == "auto":
            ds[key] = value
    if ds.get("train_batch_size") == "auto":
        del ds["train_batch_size"]
    for section in ("bf16", "fp16"):
        if isinstance(ds.get(section), dict) and ds[section].get("enabled") == "auto":
            ds[section]["enabled"] = section == "bf16"
    for path, value in _walk(ds):
        if value == "auto":
            raise cli.InputError(f"{path}: \"auto\" is filled by the Hugging Face Trainer only "
                                 "for reduce_bucket_size, stage3_prefetch_bucket_size, "
                                 "stage3_param_persistence_threshold, batch sizes, gradient "
                                 "accumulation and clipping, and bf16/fp16.enabled; give a value")


def _walk(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else k)
    else:
        yield path, value


def write_atomically(path: str, text: str) -> None:
    """The whole file or nothing: a temporary file beside it, renamed over it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hpzlab-record.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or e.__class__.__name__
    return " ".join(text.split())[:400]


def main() -> int:
    args = cli.parser().parse_args(sys.argv[1:])
    world = args.nodes * args.gpus_per_node
    started = time.time()
    ds = json.load(open(args.ds_config))
    micro = args.micro_batch or (ds.get("train_micro_batch_size_per_gpu")
                                 if isinstance(ds.get("train_micro_batch_size_per_gpu"), int)
                                 else 1)
    rec = recording.start(args.rank, world)
    if args.allocator:
        rec.start_allocator()
    stand_ins.install(args.rank, world, args.gpus_per_node)

    import deepspeed
    from deepspeed.accelerator import set_accelerator
    from deepspeed.utils import logger as ds_logger

    if not args.verbose:  # DeepSpeed logs its whole config to standard output at INFO
        ds_logger.setLevel(logging.WARNING)
        warnings.filterwarnings("ignore")

    from . import accelerator, ir, model, ops, probes
    set_accelerator(accelerator.make_accelerator(args.gpus_per_node))
    stand_ins.agree_with_rank0()
    probes.install()
    stand_ins.grouped_mm_as_on_gpu()
    try:
        config = model.load_model_config(args.hf_config)
    except model.ConfigError as e:
        raise cli.InputError(f"{args.hf_config}: {e}")
    except Exception as e:  # transformers' own complaint, whatever its type
        raise cli.InputError(f"{args.hf_config}: transformers cannot read it: {_first_line(e)}")
    hidden = getattr(config, "hidden_size", 0)
    fill_auto(ds, hidden, micro)
    ds["train_micro_batch_size_per_gpu"] = micro
    ds.setdefault("gradient_accumulation_steps", 1)
    if isinstance(ds.get("train_batch_size"), int):
        pass  # DeepSpeed checks it against micro-batch x accumulation x world, as it would
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
        with recording.current().paused_ops():
            DeepSpeedConfig(json.loads(json.dumps(ds)))
    except Exception as e:  # DeepSpeed's own reason, whatever its type
        raise cli.InputError(f"{args.ds_config}: DeepSpeed {deepspeed.__version__} rejects it: "
                             f"{_first_line(e)}")
    training = model.Training(steps=args.steps, micro_batch=micro, seq_len=cli.RECORD_SEQ_LEN,
                              grad_accum=int(ds.get("gradient_accumulation_steps", 1)),
                              grad_checkpointing=args.grad_checkpointing == "on",
                              batch_copy=args.batch_copy, load=args.load,
                              param_groups=args.param_groups)
    print(f"hpzlab record: DeepSpeed {deepspeed.__version__}, rank {args.rank} of {world}, "
          f"{args.steps} steps", file=sys.stderr, flush=True)
    try:
        with ops.OpRecorder(seq_len=cli.RECORD_SEQ_LEN, scale=args.seq_len / cli.RECORD_SEQ_LEN):
            facts = model.train(config, ds, training)
    except model.ConfigError as e:
        raise cli.InputError(f"{args.hf_config}: {e}")
    zero = ds["zero_optimization"]
    hpz = int(zero.get("zero_hpz_partition_size", 1))
    source = {
        "recorder": "hpzlab record", "deepspeed": deepspeed.__version__,
        "torch": __import__("torch").__version__,
        "transformers": __import__("transformers").__version__,
        "hf_config": args.hf_config, "ds_config": args.ds_config,
        "recorded_rank": str(args.rank), "nodes": str(args.nodes),
        "gpus_per_node": str(args.gpus_per_node), "steps": str(args.steps),
        "micro_batch": str(micro), "seq_len": str(args.seq_len),
        "recorded_seq_len": str(cli.RECORD_SEQ_LEN), "dtype": facts["dtype"],
        "grad_checkpointing": args.grad_checkpointing,
        "batch_copy": args.batch_copy,
        "command": "hpzlab record " + " ".join(a for a in sys.argv[1:] if a != "--in-env"),
        "ds_config_used": json.dumps(ds, sort_keys=True),
    }
    if args.param_groups != "model":  # absent for one group: the recordings made before stay
        source["param_groups"] = args.param_groups
    if args.load != "none":  # absent without a load: the recordings made before --load stay
        source["load"] = args.load
    if "skipped_steps" in facts:  # fp16's overflow, 0.19.8's invalid norm (run.skipped_steps)
        source["skipped_steps"] = facts["skipped_steps"]
    if args.allocator:  # how deallocations were observed (Recording.start_allocator)
        source["storage_frees"] = rec.storage_frees
    if probes.missing:
        source["unlabelled"] = ", ".join(probes.missing)
    dtype_bytes = {"bfloat16": 2, "float16": 2}.get(facts["dtype"], 4)
    doc = ir.schedule(rec, args.gpus_per_node, source, "stock", dtype_bytes, hpz)
    write_atomically(args.out, json.dumps(doc, separators=(",", ":")))
    ops_count = len(doc["ranks"][args.rank]["ops"])
    streams = doc["ranks"][args.rank]["streams"]
    print(f"hpzlab record: wrote {args.out}: {world} ranks, {ops_count} ops a rank, "
          f"{len(doc['groups'])} process groups, {len(streams)} streams "
          f"({', '.join(streams)}); {time.time() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints; our output is a file
            code = main()
        sys.exit(code)
    except cli.InputError as e:
        print(f"hpzlab record: {e}", file=sys.stderr)
        sys.exit(cli.EXIT_INPUT)
