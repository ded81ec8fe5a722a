#!/usr/bin/env python3
"""On which CUDA stream does PyTorch run a parameter's post-accumulate-grad hook, and does
DeepSpeed's reduce stream then read the gradient before it is written?

DeepSpeed issue 7898 (fixed in 0.18.8 by waiting on the current stream instead of the default
one, stage3.py:1363) says that with torch >= 2.10 autograd runs AccumulateGrad, and so ZeRO-3's
gradient hook (register_post_accumulate_grad_hook since DeepSpeed 0.16.3), on a stream other than
the default one. hpzlab's release table (sim/deepspeed_releases.cpp, rule
accumulate-grad-off-compute-stream) takes that from the PR's author. This probe measures it on
the torch it runs with, without DeepSpeed: a two-layer model whose backward is slowed on the
stream autograd runs it on (torch.cuda._sleep in a custom Function), a post-accumulate-grad hook
per parameter that does what ZeRO-3's __add_grad_to_ipg_bucket does (the reduce stream waits on
the default stream, or on the current one as 0.18.8 does, then copies the gradient into a
bucket on the reduce stream), and after a full synchronize a comparison of each bucket copy with
the gradient: a copy that differs read the gradient before it was written.

Cases: the forward on the default stream (DeepSpeed's compute stream), and the forward on a side
stream entered with torch.cuda.stream (as a training loop inside a stream context would); each
with plain parameters, with parameters whose data a side stream made (ZeRO-3's gather), and with
parameters created while a side stream was current.
Writes one JSON object to stdout (or --out FILE); exit 0 when it ran, whatever it found.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


class SlowBackward(torch.autograd.Function):
    """Identity forward; its backward spins `cycles` on the stream autograd runs it on, so that
    the gradients after it are written late on that stream."""

    @staticmethod
    def forward(ctx, x, cycles):
        ctx.cycles = cycles
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(ctx.cycles)
        return grad * 1.0, None


def run_case(forward_on_side_stream: bool, wait_on: str, cycles: int, seed: int,
             data_from: str = "default") -> dict:
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    default = torch.cuda.default_stream()
    if data_from == "created-on-side-stream":
        # The leaf parameter made while a side stream is current.
        maker = torch.cuda.Stream()
        maker.wait_stream(default)
        with torch.cuda.stream(maker):
            w1 = torch.nn.Parameter(torch.randn(512, 512, device=dev) / 32)
            w2 = torch.nn.Parameter(torch.randn(512, 512, device=dev) / 32)
        default.wait_stream(maker)
    else:
        w1 = torch.nn.Parameter(torch.randn(512, 512, device=dev) / 32)
        w2 = torch.nn.Parameter(torch.randn(512, 512, device=dev) / 32)
    if data_from == "gathered-on-side-stream":
        # ZeRO-3's fetch: param.data replaced by a tensor the all-gather stream made, the
        # compute stream waiting for it (partition_parameters.py AllGatherCoalescedHandle.wait).
        gather = torch.cuda.Stream()
        for w in (w1, w2):
            gather.wait_stream(default)
            with torch.cuda.stream(gather):
                full = w.detach() * 1.0
            default.wait_stream(gather)
            w.data = full
    reduce_stream = torch.cuda.Stream()  # DeepSpeed's reduce_and_partition_stream
    buckets = {}
    seen = []

    def make_hook(name):
        def hook(p):
            cur = torch.cuda.current_stream()
            seen.append({"param": name, "hook_stream_is_default": cur == default,
                         "hook_stream": int(cur.cuda_stream)})
            # stage3.py __add_grad_to_ipg_bucket: before 0.18.8 wait_stream(default_stream()),
            # from 0.18.8 wait_stream(current_stream()); then the copy on the reduce stream.
            reduce_stream.wait_stream(default if wait_on == "default" else cur)
            with torch.cuda.stream(reduce_stream):
                buckets[name] = p.grad.detach().clone()
        return hook

    w1.register_post_accumulate_grad_hook(make_hook("w1"))
    w2.register_post_accumulate_grad_hook(make_hook("w2"))
    x = torch.randn(256, 512, device=dev)
    side = torch.cuda.Stream()
    ctx = torch.cuda.stream(side) if forward_on_side_stream else torch.cuda.stream(default)
    with ctx:
        if forward_on_side_stream:
            side.wait_stream(default)
        h = SlowBackward.apply(x @ w1, cycles)
        loss = (torch.relu(h) @ w2).square().mean()
        backward_caller_stream = torch.cuda.current_stream()
        loss.backward()
    torch.cuda.synchronize()
    stale = {n: bool(not torch.equal(buckets[n], p.grad)) for n, p in (("w1", w1), ("w2", w2))}
    return {
        "parameter_data": data_from,
        "forward_on_side_stream": forward_on_side_stream,
        "reduce_stream_waits_on": wait_on,
        "backward_called_on_default_stream": backward_caller_stream == default,
        "hooks": seen,
        "bucket_copy_read_the_gradient_early": stale,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--cycles", type=int, default=50_000_000, help="spin of the slow backward")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("grad-hook-stream: no CUDA device", file=sys.stderr)
        return 3
    result = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "cycles": args.cycles,
        "cases": [],
    }
    for data_from in ("default", "gathered-on-side-stream", "created-on-side-stream"):
        for side in (False, True):
            for wait_on in ("default", "current"):
                for r in range(args.repeats):
                    case = run_case(side, wait_on, args.cycles, seed=r, data_from=data_from)
                    case["repeat"] = r
                    result["cases"].append(case)
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
