#!/usr/bin/env python3
"""Real DeepSpeed ZeRO-3 on one GPU: which stream its gradient hooks run on (DeepSpeed issue 7898).

PR 7897 (first in v0.18.8) changed `__add_grad_to_ipg_bucket` (stage3.py:1363 at v0.18.7) from
`reduce_and_partition_stream.wait_stream(default_stream())` to `wait_stream(current_stream())`.
The two differ only where the gradient hook runs on another stream than the default one.
tools/gpu-probes/grad-hook-stream.py measured torch's side of it with a model of the hook; this
probe runs DeepSpeed's own code (a source tree of one release, given by --deepspeed-src) and
logs, for every call of `__add_grad_to_ipg_bucket`:
  - the stream it runs on (current) and whether that is the default stream;
  - whether the bucket copy read the gradient before it was written: right behind the copy, a
    clone of the bucket slice on the reduce stream; then a device synchronize; then the clone is
    compared with the gradient's own storage, finished by then;
and per step the loss and whether every weight partition is finite.

Modes (--modes): `plain` (the training loop DeepSpeed's examples and the HF Trainer run: forward,
engine.backward, engine.step, all from the default stream); `checkpoint-nonreentrant` and
`checkpoint-reentrant` (each block under torch.utils.checkpoint); `side-stream` (the positive
control: the forward and backward issued under `torch.cuda.stream(s)`, as a framework that runs
its step on a stream of its own would).

Run on a GPU machine, one process per release (two releases cannot share a process):
  python3 tools/gpu-probes/deepspeed-grad-hook-stream.py --deepspeed-src ds-0.18.7 --out a.json
"""

import argparse
import json
import os
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepspeed-src", required=True,
                    help="a DeepSpeed source tree (deepspeed/, op_builder/, accelerator/)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", default="plain,checkpoint-nonreentrant,checkpoint-reentrant,side-stream")
    return ap.parse_args()


def main():
    args = parse_args()
    src = os.path.abspath(args.deepspeed_src)
    if not os.path.isdir(os.path.join(src, "deepspeed")):
        print(f"{args.deepspeed_src}: no deepspeed/ in it (--deepspeed-src wants a source tree)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, src)
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}.items():
        os.environ.setdefault(k, v)
    import torch
    import deepspeed
    from deepspeed.runtime.zero import stage3
    from torch.utils.checkpoint import checkpoint

    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(0)
    version = open(os.path.join(src, "version.txt")).read().strip()

    calls = []  # one per __add_grad_to_ipg_bucket call of the current run
    cls = stage3.DeepSpeedZeroOptimizer_Stage3
    original = cls._DeepSpeedZeroOptimizer_Stage3__add_grad_to_ipg_bucket

    def add_grad_to_ipg_bucket(self, param):
        current = torch.cuda.current_stream()
        default = torch.cuda.default_stream()
        storage = param.grad.data  # the gradient's own storage; the call points param.grad elsewhere
        original(self, param)
        copied = param.grad.data.data_ptr() != storage.data_ptr()
        snapshot = None
        if copied:
            with torch.cuda.stream(self.reduce_and_partition_stream):
                snapshot = param.grad.detach().clone()
        torch.cuda.synchronize()
        calls.append({
            "param": getattr(param, "ds_id", -1),
            "numel": param.grad.numel(),
            "hook_stream_is_default": current == default,
            "hook_stream": int(current.stream_id),
            "bucket_copy": copied,
            "bucket_copy_read_the_gradient_early": bool(copied and not torch.equal(snapshot, storage)),
        })

    cls._DeepSpeedZeroOptimizer_Stage3__add_grad_to_ipg_bucket = add_grad_to_ipg_bucket

    class Block(torch.nn.Module):

        def __init__(self, h):
            super().__init__()
            self.fc = torch.nn.Linear(h, h, bias=False)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x))

    class Net(torch.nn.Module):

        def __init__(self, h, n, mode):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block(h) for _ in range(n))
            self.mode = mode

        def forward(self, x):
            for b in self.blocks:
                if self.mode == "checkpoint-nonreentrant":
                    x = checkpoint(b, x, use_reentrant=False)
                elif self.mode == "checkpoint-reentrant":
                    x = checkpoint(b, x, use_reentrant=True)
                else:
                    x = b(x)
            return x.float().pow(2).mean()

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "contiguous_gradients": True,
            # Every gradient fits the bucket: each goes through the copy that PR 7897 orders.
            "reduce_bucket_size": args.hidden * args.hidden * args.layers + 1,
            "stage3_param_persistence_threshold": 0,
        },
        # torch's AdamW, passed in: DeepSpeed's FusedAdam would compile its extension first.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000000,
    }
    runs = []
    for mode in args.modes.split(","):
        torch.manual_seed(0)
        with deepspeed.zero.Init(config_dict_or_path=config):
            net = Net(args.hidden, args.layers, mode)
        engine, _, _, _ = deepspeed.initialize(model=net,
                                               optimizer=torch.optim.AdamW(net.parameters(), lr=1e-5),
                                               config=config)
        side = torch.cuda.Stream()
        steps = []
        for step in range(args.steps):
            calls.clear()
            x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
            if mode == "checkpoint-reentrant":
                x.requires_grad_(True)
            t0 = time.time()
            if mode == "side-stream":
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    loss = engine(x)
                    engine.backward(loss)
                torch.cuda.current_stream().wait_stream(side)
            else:
                loss = engine(x)
                engine.backward(loss)
            engine.step()
            torch.cuda.synchronize()
            finite = all(bool(torch.isfinite(p.ds_tensor).all()) for p in net.parameters())
            steps.append({"step": step, "loss": float(loss.item()), "weights_finite": finite,
                          "seconds": round(time.time() - t0, 3), "calls": list(calls)})
            early = sum(c["bucket_copy_read_the_gradient_early"] for c in calls)
            off = sum(not c["hook_stream_is_default"] for c in calls)
            print(f"deepspeed {version} torch {torch.__version__} {mode} step {step}: "
                  f"{len(calls)} hooks, {off} off the default stream, {early} early reads, "
                  f"loss {loss.item():.6g}, weights finite {finite}", flush=True)
        runs.append({"mode": mode, "steps": steps})
        engine.destroy()
        del engine, net
        torch.cuda.empty_cache()
    out = {
        "deepspeed": version,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "hidden": args.hidden,
        "layers": args.layers,
        "tokens": args.tokens,
        "runs": runs,
    }
    with open(args.out + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
