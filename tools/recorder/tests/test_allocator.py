"""The allocator mode (--allocator): Tensor.record_stream as an IR op, every storage's free at its
deallocation (once), every buffer kept, "allocator": true; and ZeRO-2 with overlap_comm, whose
reduction stream the recording accelerator gives. The pieces run in-process (the torch of the
venv the tests run in: 2.1.2 in CI, where deallocations are seen by use count; a finalizer on
torch 2.10, Recording.start_allocator); the end-to-end test records DeepSpeed 0.13.4."""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import torch

from hpzrec import accelerator, ir, ops, recording, stand_ins

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DATA = HERE / "data"


@pytest.fixture()
def rec():
    saved = torch.Tensor.record_stream
    r = recording.start(rank=0, world_size=4)
    r.start_allocator()
    stand_ins.record_stream_as_recorded()
    yield r
    torch.Tensor.record_stream = saved


def frees_of(rec, life):
    return [e for e in rec.entries if e.kind == "free" and e.lifetime == life]


def test_record_stream_is_an_op_on_the_recorded_stream_and_the_tensors_buffer(rec):
    side = accelerator.RecordingStream()  # a stream DeepSpeed makes: index 1
    with ops.OpRecorder(seq_len=23, scale=1.0):
        other = torch.ones(4)
        t = torch.ones(8)
        t.narrow(0, 2, 4).record_stream(side)
    (entry, ) = [e for e in rec.entries if e.kind == "record_stream"]
    assert entry.stream == side.index == 1
    assert entry.lifetime == rec.lifetime_of(t) != rec.lifetime_of(other)
    assert entry.region == (8, 24)
    ops_, buffers = ir.rank_ops(rec)
    (op, ) = [o for o in ops_ if o["kind"] == "record_stream"]
    assert op["stream"] == 1 and "accesses" not in op
    assert {"phase", "purpose", "step"} <= set(op)
    allocs = [o["buffer"] for o in ops_ if o["kind"] == "alloc"]
    assert op["buffer"] == allocs[1] and buffers[op["buffer"]]["bytes"] == 32


def test_record_stream_of_a_split_storage_names_every_buffer_of_the_storage(rec):
    rec.units += [{"name": "a", "layer": -1}, {"name": "b", "layer": -1}]
    with ops.OpRecorder(seq_len=23, scale=1.0):
        flat = torch.zeros(16)
    with rec.paused_ops():
        rec.claim(flat.narrow(0, 0, 8), "full", 0)
        rec.claim(flat.narrow(0, 8, 6), "full", 1)  # 2 elements of padding after it
    flat.narrow(0, 4, 8).record_stream(accelerator.RecordingStream(index=0))
    ops_, buffers = ir.rank_ops(rec)
    names = [buffers[o["buffer"]]["name"] for o in ops_ if o["kind"] == "record_stream"]
    # recordStream marks the whole block, not the view's bytes: the padding too
    assert names == ["a.full", "b.full", f"tensor{rec.lifetime_of(flat)}.padding56"]
    # the storage's buffers add up to its size: the padding is a buffer of its own
    allocated = [buffers[o["buffer"]] for o in ops_ if o["kind"] == "alloc"]
    assert sum(b["bytes"] for b in allocated) == 64


def test_a_storage_is_freed_once_when_its_last_view_goes(rec):
    with ops.OpRecorder(seq_len=23, scale=1.0):
        a = torch.ones(100)
        view = a[10:20]
        life = rec.lifetime_of(a)
        del a
        rec.poll()
        assert frees_of(rec, life) == []  # the view keeps the storage
        del view
        rec.poll()
        (free, ) = frees_of(rec, life)
        assert free.region == (0, 400) and free.stream == rec.current_stream
        torch.ones(3).sum()  # later entries: no second free
        rec.poll()
    assert len(frees_of(rec, life)) == 1


def test_a_data_swap_frees_the_old_storage_and_a_free_comes_before_the_next_entry(rec):
    with ops.OpRecorder(seq_len=23, scale=1.0):
        p = torch.nn.Parameter(torch.ones(10))
        old = rec.lifetime_of(p)
        p.data = torch.empty(0)
        torch.zeros(2)  # the next entry: an alloc, after the free
    kinds = [(e.kind, e.lifetime) for e in rec.entries]
    at = kinds.index(("free", old))
    assert kinds[at + 1][0] == "alloc" and kinds.count(("free", old)) == 1


def test_every_buffer_keeps_its_alloc_and_free_and_the_document_says_allocator(rec):
    with ops.OpRecorder(seq_len=23, scale=1.0):
        x = torch.ones(8)
        y = (x * 2) + 1  # x * 2 lives inside one folded group: still kept
        del y
    rec.close()
    doc = ir.schedule(rec, 2, {"command": "test"}, "stock", 4, 1)
    assert doc["allocator"] is True
    ops_, buffers = doc["ranks"][0]["ops"], doc["ranks"][0]["buffers"]
    allocs = [o["buffer"] for o in ops_ if o["kind"] == "alloc"]
    frees = [o["buffer"] for o in ops_ if o["kind"] == "free"]
    assert sorted(allocs) == list(range(len(buffers))) and len(buffers) == 3
    assert len(frees) == len(set(frees)) == 2  # x * 2, and y; x is still held
    assert "allocator" not in ir.schedule(recording.start(0, 4), 2, {}, "stock", 4, 1)


def check_lifetimes(rank: dict) -> None:
    """Every free and record_stream names a buffer allocated before and not freed yet; every
    access is inside its buffer's lifetime; every buffer is allocated."""
    state = {}
    for i, op in enumerate(rank["ops"]):
        if op["kind"] == "alloc":
            assert op["buffer"] not in state, (i, op)
            state[op["buffer"]] = True
        elif op["kind"] in ("free", "record_stream"):
            assert state.get(op["buffer"]) is True, (i, op)
            if op["kind"] == "free":
                state[op["buffer"]] = False
        for buf, *_ in op.get("accesses", []):
            assert state.get(buf) is True, (i, op)
    assert len(state) == len(rank["buffers"])


def record(tmp: pathlib.Path, zero: dict, *extra: str) -> dict:
    ds = json.loads((DATA / "ds-hpz8.json").read_text())
    ds["zero_optimization"] = zero
    (tmp / "ds.json").write_text(json.dumps(ds))
    out = tmp / "schedule.json"
    run = subprocess.run([str(ROOT / "tools" / "record"), "--hf-config",
                          str(DATA / "llama-tiny.json"), "--ds-config", str(tmp / "ds.json"),
                          "--nodes", "2", "--gpus-per-node", "8", "--deepspeed", "0.13.4",
                          "--rank", "0", "--allocator", "--out", str(out), *extra],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


def test_zero2_overlap_comm_records_its_reduction_stream(tmp_path):
    """DeepSpeed 0.13.4's ZeRO-2 reduces the gradient buckets on its reduction_stream
    (stage_1_and_2.py average_tensor), all-reducing each bucket and copying this rank's slices;
    it calls record_stream nowhere (0.19.0 does, in allreduce_and_copy, PR 7965)."""
    doc = record(tmp_path, {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_scatter": True})
    assert doc["allocator"] is True and doc["hpz_size"] == 1
    rank = doc["ranks"][0]
    assert "S_reduction" in rank["streams"]
    reduction = rank["streams"].index("S_reduction")
    assert any(o["kind"] == "kernel" and o["stream"] == reduction and o["phase"] == "grad_reduce"
               for o in rank["ops"])
    assert [o for o in rank["ops"] if o["kind"] == "record_stream"] == []
    assert sum(o["kind"] == "all_reduce" and o["purpose"] == "grad_reduce"
               for o in rank["ops"]) == 2  # one bucket a step
    check_lifetimes(rank)


def test_zero3_record_streams_come_where_deepspeed_calls_them(tmp_path):
    """0.13.4's free_param records the compute stream on the gathered parameter before dropping
    it (partition_parameters.py:284), its gathers record the all-gather stream on each rank's
    part (:699): each record_stream op comes before its buffer's one free."""
    zero = json.loads((DATA / "ds-hpz8.json").read_text())["zero_optimization"]
    doc = record(tmp_path, zero)
    rank = doc["ranks"][0]
    streams = rank["streams"]
    recorded = [o for o in rank["ops"] if o["kind"] == "record_stream"]
    full = [o for o in recorded if rank["buffers"][o["buffer"]]["role"] == "full"]
    assert full and {streams[o["stream"]] for o in full} == {"S0"}
    assert any(streams[o["stream"]] == "S_ag" for o in recorded)
    frees = {}
    for i, o in enumerate(rank["ops"]):
        if o["kind"] == "free":
            assert o["buffer"] not in frees
            frees[o["buffer"]] = i
    for i, o in enumerate(rank["ops"]):
        if o["kind"] == "record_stream" and o["buffer"] in frees:
            assert i < frees[o["buffer"]]
    check_lifetimes(rank)
