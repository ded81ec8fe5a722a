"""Unit tests of the recorder's pieces, without DeepSpeed: the op recorder's byte ranges, the
recording streams and events, the collectives' handshakes, the IR writer's buffers, and the
stand-ins for DeepSpeed's qgZ CUDA ops."""
from __future__ import annotations

import pytest
import torch

from hpzrec import accelerator, collectives, ir, ops, probes, recording, stand_ins


@pytest.fixture()
def rec():
    r = recording.start(rank=0, world_size=4)
    r.groups.append(recording.Group(ranks=(0, 1, 2, 3), creator="world"))
    return r


def logged(rec, kind):
    return [e for e in rec.entries if e.kind == kind]


def test_copy_into_a_narrowed_view_writes_exactly_its_bytes(rec):
    with ops.OpRecorder(seq_len=23, scale=1.0):
        secondary = torch.empty(16, dtype=torch.float32)
        full = torch.ones(64, dtype=torch.float32)
        secondary.narrow(0, 4, 8).copy_(full.narrow(0, 32, 8))
    alloc = logged(rec, "alloc")[0]
    assert alloc.fill == "nan"  # torch.empty: uninitialized, and no write logged for it
    copy = [e for e in logged(rec, "copy") if e.aten == "copy_"][-1]
    reads = [a[2:] for a in copy.accesses if a[1] == "r"]
    writes = [a[2:] for a in copy.accesses if a[1] == "w"]
    assert writes == [(16, 48)]  # elements 4..12 of 4-byte floats
    assert reads == [(128, 160)]  # elements 32..40 of the full tensor


def test_cat_reads_every_input_and_an_out_argument_is_written(rec):
    with ops.OpRecorder(seq_len=23, scale=1.0):
        a, b = torch.ones(4), torch.ones(6)
        out = torch.empty(20)
        torch.cat([a, b], out=out.narrow(0, 10, 10))
    cat = [e for e in rec.entries if e.aten == "cat"][-1]
    lives = {a[0] for a in cat.accesses if a[1] == "r"}
    assert len(lives) == 2
    assert [a[2:] for a in cat.accesses if a[1] == "w"] == [(40, 80)]


def test_item_is_a_host_sync_of_the_current_stream(rec):
    with ops.OpRecorder(seq_len=23, scale=1.0):
        torch.ones(3).sum().item()
    assert logged(rec, "host_stream_sync")[-1].stream == rec.current_stream


def test_ops_whose_cuda_kernels_wait_log_a_host_sync_and_one_hots_cpu_checks_do_not(rec):
    """nonzero (torch.where with one argument), boolean indexing and masked_select size their
    output from the data: on a GPU the host waits for the stream, on this CPU nothing calls
    .item(). one_hot with num_classes checks its classes with .item() on a CPU only, and a
    sum reads nothing back."""
    saved = torch.nn.functional.one_hot
    stand_ins.one_hot_as_on_cuda()
    try:
        mask = torch.tensor([True, False, True])
        values = torch.ones(3)
        cases = [("where", lambda: torch.where(mask), 1), ("bool index", lambda: values[mask], 1),
                 ("masked_select", lambda: torch.masked_select(values, mask), 1),
                 ("one_hot", lambda: torch.nn.functional.one_hot(torch.tensor([0, 2]), 3), 0),
                 ("sum", lambda: values.sum(), 0)]
        for name, op, waits in cases:
            before = len(logged(rec, "host_stream_sync"))
            with ops.OpRecorder(seq_len=23, scale=1.0):
                op()
            assert len(logged(rec, "host_stream_sync")) - before == waits, name
    finally:
        torch.nn.functional.one_hot = saved


def test_gemm_costs_scale_with_the_sequence_dimensions_only(rec):
    with ops.OpRecorder(seq_len=23, scale=10.0):
        torch.mm(torch.ones(23, 8), torch.ones(8, 5))  # m is the sequence: x10
        torch.bmm(torch.ones(2, 23, 8), torch.ones(2, 8, 23))  # scores: x100
    mm, bmm = [e for e in rec.entries if e.aten in ("mm", "bmm")]
    assert mm.flops == pytest.approx(2 * 23 * 8 * 5 * 10)
    assert bmm.flops == pytest.approx(2 * 2 * 23 * 8 * 23 * 100)


def test_streams_and_events_log_what_deepspeed_does_with_them(rec):
    s_ag = accelerator.RecordingStream()
    default = accelerator.RecordingStream(index=0)
    with accelerator._current_stream(s_ag.index):
        event = accelerator.RecordingEvent()
        event.record()
    default.wait_stream(s_ag)
    event.synchronize()
    s_ag.synchronize()
    kinds = [(e.kind, e.stream) for e in rec.entries]
    assert kinds == [("event_record", s_ag.index), ("event_record", s_ag.index),
                     ("stream_wait_event", 0), ("host_event_sync", -1),
                     ("host_stream_sync", s_ag.index)]
    assert rec.entries[3].event == rec.entries[0].event


def test_async_collective_handshakes_as_process_group_nccl(rec):
    out, inp = torch.empty(8), torch.ones(2)
    work = collectives.all_gather_into_tensor(out, inp, group=None, async_op=True)
    work.wait()
    kinds = [(e.kind, rec.streams[e.stream] if e.stream >= 0 else "host") for e in rec.entries]
    assert kinds[-5:] == [("event_record", "S0"), ("stream_wait_event", "nccl.world"),
                          ("all_gather", "nccl.world"), ("event_record", "nccl.world"),
                          ("stream_wait_event", "S0")]
    gather = logged(rec, "all_gather")[0]
    assert gather.comm_bytes == 8 and gather.group == 0
    assert torch.equal(out, torch.ones(8))  # filled with this rank's data, finite


def test_claimed_regions_become_parameter_buffers_and_padding_is_dropped(rec):
    rec.units.append({"name": "w", "layer": -1})
    full = torch.empty(10)  # 8 meaningful elements + 2 of padding
    with rec.paused_ops():
        life = rec.lifetime_of(full, fresh=True)
        rec.claim(full.narrow(0, 0, 8), "full", 0)
    rec.push("alloc", 0, lifetime=life, fill="nan")
    rec.push("kernel", 0, accesses=[(life, "w", 0, 40)])
    rec.push("kernel", 1, accesses=[(life, "r", 0, 40)])
    ops_, buffers = ir.rank_ops(rec)
    assert buffers == [{"name": "w.full", "role": "full", "bytes": 32, "unit": 0}]
    assert ops_[1]["accesses"] == [[0, "w", 0, 32]]
    assert ops_[2]["accesses"] == [[0, "r", 0, 32]]


def test_a_shards_elements_past_the_parameters_end_are_padding(rec):
    """A parameter of 30 elements on 4 ranks: shards of 8, the last one holding 6 of the
    parameter's and 2 of padding. A whole-shard copy writes and reads only those 6; a storage
    made by empty() inside reduce_scatter_coalesced (padding only) is read by nobody."""
    rec.units.append({"name": "w", "layer": -1})
    param = torch.nn.Parameter(torch.zeros(30))
    param.ds_numel = 30
    param.ds_tensor = torch.empty(8)
    rec.unit_of_param[id(param)] = 0
    rec.rank = 3
    with rec.paused_ops():
        life = rec.lifetime_of(param.ds_tensor, fresh=True)
    probes.claim_param(param)
    rec.push("alloc", 0, lifetime=life, fill="nan")
    rec.push("copy", 0, accesses=[(life, "w", 0, 32)])
    rec.push("copy", 1, accesses=[(life, "r", 0, 32)])
    rec.padding_allocs += 1
    with ops.OpRecorder(seq_len=23, scale=1.0):
        flat = torch.cat([torch.ones(6), torch.empty(2)])
    rec.padding_allocs -= 1
    with ops.OpRecorder(seq_len=23, scale=1.0):
        flat.sum()
    ops_, buffers = ir.rank_ops(rec)
    assert buffers[0] == {"name": "w.primary", "role": "primary", "bytes": 32, "unit": 0}
    assert ops_[1]["accesses"] == [[0, "w", 0, 24]]
    assert ops_[2]["accesses"] == [[0, "r", 0, 24]]
    cat = [op for op in ops_ if op["kind"] == "copy"][-1]
    assert [(m, n) for _, m, _, n in cat["accesses"]] == [("r", 24), ("w", 32)]  # ones -> flat
    assert all(b["bytes"] != 8 for b in buffers)  # the padding's storage is gone
    # Rank 0's shard is all the parameter's; rank 4 of 5 would hold none of it.
    assert probes._own(param, param.ds_tensor, 0) == 8
    assert probes._own(param, param.ds_tensor, 4) == 0


def test_folded_kernels_keep_their_outside_reads_and_drop_intermediates(rec):
    a = torch.ones(4)
    tmp = torch.empty(4)
    out = torch.empty(4)
    with rec.paused_ops():
        la, lt, lo = (rec.lifetime_of(t, fresh=True) for t in (a, tmp, out))
    for life in (lt, lo):
        rec.push("alloc", 0, lifetime=life, fill="nan")
    rec.push("kernel", 0, accesses=[(la, "r", 0, 16), (lt, "w", 0, 16)])
    rec.push("kernel", 0, accesses=[(lt, "r", 0, 16), (lo, "w", 0, 16)])
    rec.push("kernel", 1, accesses=[(lo, "r", 0, 16)])
    ops_, buffers = ir.rank_ops(rec)
    folded = [op for op in ops_ if op["kind"] == "kernel" and op["stream"] == 0]
    assert len(folded) == 1
    names = {buffers[b]["name"] for b, *_ in folded[0]["accesses"]}
    assert len(names) == 2  # a (read) and out (written, read later); tmp is gone
    assert all(b["name"] != f"tensor{lt}" for b in buffers)


def test_a_parameter_tensor_nothing_touches_keeps_its_alloc_and_free(rec):
    """A secondary that DeepSpeed 0.13.4's copy bounds leave unwritten and nothing reads before
    the optimizer invalidates it: still allocated and freed in the IR, as DeepSpeed did it; an
    untouched scratch tensor is dropped."""
    rec.units.append({"name": "w", "layer": -1})
    secondary, scratch = torch.empty(2), torch.empty(2)
    with rec.paused_ops():
        ls = rec.lifetime_of(secondary, fresh=True)
        rec.claim(secondary, "secondary", 0)
        lt = rec.lifetime_of(scratch, fresh=True)
    for life in (ls, lt):
        rec.push("alloc", 0, lifetime=life, fill="nan")
        rec.push("free", 0, lifetime=life, region=(0, 8))
    ops_, buffers = ir.rank_ops(rec)
    assert buffers == [{"name": "w.secondary", "role": "secondary", "bytes": 8, "unit": 0}]
    assert [(op["kind"], op["buffer"]) for op in ops_] == [("alloc", 0), ("free", 0)]


def test_other_ranks_use_their_own_groups():
    groups = [{"kind": "world", "creator": "world", "ranks": [0, 1, 2, 3]},
              {"kind": "hpz", "creator": "zero_param", "ranks": [0, 1]},
              {"kind": "hpz", "creator": "zero_param", "ranks": [2, 3]}]
    assert ir._group_map(groups, 0, 3) == {0: 0, 1: 2}
    assert ir._group_map(groups, 0, 1) == {0: 0, 1: 1}


@pytest.mark.parametrize("quant_type, columns", [(0, 1), (1, 2)], ids=["symmetric", "asymmetric"])
def test_qgz_stand_ins_have_deepspeeds_shapes_and_dtypes(quant_type, columns):
    """all_to_all_quant_reduce (runtime/comm/coalesced_collectives.py at v0.13.4) on a 64 x 64
    bf16 gradient, 2 nodes x 8 GPUs: the shapes and dtypes of csrc/quantization/pt_binding.cpp
    (swizzle_quant: int8 {numel / 2} and fp32 {groups, 1 or 2}; quantized_reduction: the last
    dim / devices_per_node; dequantize: dequantize<__half>, the last dim x 2 for 4 bits)."""
    kernels = stand_ins.QuantizedGradientKernels()
    grad = torch.linspace(-1, 1, 64 * 64).reshape(64, 64).to(torch.bfloat16)
    intra_groups = max(64, 64, 16)
    inter_groups = intra_groups // 8
    q, scales = kernels.swizzle_quant(grad, intra_groups, 4, quant_type, 1, 2, 8)
    assert (q.shape, q.dtype) == ((2048, ), torch.int8)
    assert (scales.shape, scales.dtype) == ((64, columns), torch.float32)
    reduced, reduced_scales = kernels.quantized_reduction(q, scales, intra_groups, inter_groups,
                                                          4, quant_type, 8)
    assert (reduced.shape, reduced.dtype) == ((256, ), torch.int8)
    assert (reduced_scales.shape, reduced_scales.dtype) == ((8, columns), torch.float32)
    out = kernels.dequantize(reduced, reduced_scales, reduced_scales.numel() // columns, 4,
                             quant_type)
    assert (out.shape, out.dtype) == ((512, ), torch.float16)
    assert torch.isfinite(out).all()
    # all_to_all_quant_reduce's last line: this rank's 1/16 of the gradient
    assert sum(out.chunk(2)).view(-1).numel() == 64 * 64 // 16
    # 8 bits: nothing packed, a 2-D input keeps its shape in reduction and dequantization
    q8, s8 = kernels.swizzle_quant(torch.ones(4, 16), 4, 8, quant_type, 1, 1, 2)
    assert (q8.shape, s8.shape) == ((64, ), (4, columns))
    r8, _ = kernels.quantized_reduction(q8.reshape(4, 16), s8, 4, 2, 8, quant_type, 2)
    assert r8.shape == (4, 8)
    assert kernels.dequantize(r8, s8[:2], 2, 8, quant_type).shape == (4, 8)


def test_qgz_stand_ins_are_kernels_that_read_their_inputs_and_write_their_outputs(rec):
    kernels = stand_ins.QuantizedGradientKernels()
    grad = torch.ones(32, 32, dtype=torch.bfloat16)
    with ops.OpRecorder(seq_len=23, scale=1.0):
        q, scales = kernels.swizzle_quant(grad, 32, 4, kernels.Symmetric, 1, 2, 8)
    lives = {rec.lifetime_of(t): t.numel() * t.element_size() for t in (grad, q, scales)}
    reads = {(a[0], a[2], a[3]) for e in rec.entries for a in e.accesses if a[1] == "r"}
    writes = {(a[0], a[2], a[3]) for e in rec.entries for a in e.accesses if a[1] == "w"}
    g, qq, s = lives
    assert (g, 0, lives[g]) in reads
    assert (qq, 0, lives[qq]) in writes and (s, 0, lives[s]) in writes


def test_qwz_dequantize_keeps_the_quantized_inputs_shape():
    """CUDAQuantizer.dequantize (runtime/zero/partition_parameters.py:761 at v0.13.4) on a single
    parameter's gather gets the int8 buffer viewed in the parameter's shape (1242) and the CUDA
    binding returns that shape (csrc/quantization/pt_binding.cpp:120-122); a coalesced gather's
    flat buffer stays flat."""
    kernels = stand_ins.QuantizerKernels(torch.bfloat16, torch.bfloat16)
    weight = torch.linspace(-1, 1, 16 * 32).reshape(16, 32)
    q, scales = kernels.quantize(weight, 4)
    assert (q.dtype, scales.numel()) == (torch.int8, 4)
    out = kernels.dequantize(q.reshape(16, 32), scales, 4)
    assert (out.shape, out.dtype) == ((16, 32), torch.bfloat16)
    assert kernels.dequantize(q, scales, 4).shape == (512, )
    assert torch.allclose(out.float(), weight, atol=1 / 127)
    # From 0.19.6 the stand-in writes fp16, as the CUDA binding does, and DeepSpeed casts it.
    half = stand_ins.QuantizerKernels(torch.bfloat16, torch.float16)
    assert half.dequantize(q.reshape(16, 32), scales, 4).dtype == torch.float16


def test_ranks_of_one_kind_hold_the_same_slices():
    """rank_kinds: 30 elements padded to 32 over 4 ranks (shards of 8), hpZ 2 (secondaries of
    16): rank 3's shard and the secondaries of ranks 1 and 3 end in padding; a parameter that
    divides adds no kind; hpZ off leaves only the primary's padding; slices past the end are
    told from a slice at the end."""
    from hpzrec import cli
    norm = {"numel": 30, "shard_numel": 8, "secondary_numel": 16}
    even = {"numel": 64, "shard_numel": 16, "secondary_numel": 32}
    doc = {"world_size": 4, "hpz_size": 2, "units": [norm, even]}
    assert cli.rank_kinds(doc) == [[0, 2], [1], [3]]
    assert cli.rank_kinds(dict(doc, units=[even])) == [[0, 1, 2, 3]]
    off = {"world_size": 4, "hpz_size": 1, "units": [dict(norm, secondary_numel=0)]}
    assert cli.rank_kinds(off) == [[0, 1, 2], [3]]
    # 6 elements over 8 ranks: rank 6's slice starts at the end (empty), rank 7's past it,
    # where DeepSpeed's narrow() raises: two kinds, though neither holds an element.
    six = {"world_size": 8, "hpz_size": 1,
           "units": [{"numel": 6, "shard_numel": 1, "secondary_numel": 0}]}
    assert cli.rank_kinds(six) == [[0, 1, 2, 3, 4, 5], [6], [7]]


def test_groups_are_named_by_the_function_that_made_them():
    """On one node of 4, hpZ's group (hpZ 4) and qgZ's intra-node group hold every rank, as the
    world and its clone do: each is still named for what it is, so that the world's names do
    not shift. On two nodes of 2, qgZ's groups are a node's ranks and a local rank's."""
    def kinds(groups, world, per_node):
        return [ir._group_kind(recording.Group(ranks=r, creator=c), world, per_node)
                for r, c in groups]
    everyone = (0, 1, 2, 3)
    assert kinds([(everyone, "world"), (everyone, "create_zero_param_parallel_group"),
                  (everyone, "get_local_all_to_all_group"), (everyone, "clone_world_group")],
                 4, 4) == ["world", "hpz", "intra_node", "world"]
    assert kinds([((0, 1), "get_local_all_to_all_group"), ((0, 2), "get_local_all_to_all_group"),
                  ((0, 1), "create_zero_param_parallel_group")],
                 4, 2) == ["intra_node", "inter_node", "hpz"]


def test_a_later_torch_base_is_its_own_environment(tmp_path, monkeypatch):
    """--torch 2.10.0: its own venv and DeepSpeed directories beside the default's, only its own
    transformers, and the releases torch 2.1.2 cannot run named with their reason. Nothing is
    installed: the names and refusals come before any build."""
    from hpzrec import env
    monkeypatch.setenv("HPZLAB_CACHE", str(tmp_path))
    assert env.supported_torch() == [env.BASE_TORCH, "2.10.0"]
    assert env.base_transformers() == "4.35.2" and env.base_transformers("2.10.0") == "5.24.0"
    assert env.transformers_dir("5.24.0", "2.10.0") is None
    with pytest.raises(env.EnvError, match="has transformers 5.24.0 and no other"):
        env.transformers_dir("4.51.3", "2.10.0")
    assert set(env.NEEDS_NEWER_TORCH) == {"0.18.3", "0.18.7", "0.18.8", "0.18.9", "0.19.0",
                                          "0.19.8"}
    assert set(env.NEEDS_NEWER_TORCH) <= set(env.supported_versions())
    assert not list(tmp_path.iterdir()), "nothing built"


def test_pins_besides_deepspeed_are_split_off():
    """DeepSpeed 0.10.0 to 0.11.1 need pydantic 1 (the base has 2): their requirements files pin
    it beside DeepSpeed, installed into the same target before DeepSpeed's setup.py runs. The
    later files pin DeepSpeed alone."""
    from hpzrec import env
    deepspeed, others = env._split_requirements(env.REQUIREMENTS / "deepspeed-0.11.0.txt")
    assert deepspeed.startswith("deepspeed==0.11.0 \\\n    --hash=sha256:")
    assert deepspeed.count("--hash=") == 1 and "pydantic" not in deepspeed
    assert others.startswith("pydantic==1.10.13 \\\n") and "deepspeed" not in others
    assert others.count("--hash=") > 1
    deepspeed, others = env._split_requirements(env.REQUIREMENTS / "deepspeed-0.14.4.txt")
    assert deepspeed.startswith("deepspeed==0.14.4 ") and others == ""


def test_with_a_load_rank_0_is_a_kind_of_its_own():
    """--load pretrained: only rank 0 copies the checkpoint in, so rank_kinds puts it alone and
    the first other rank of its kind is run too; without a load nothing changes."""
    from hpzrec import cli
    even = {"numel": 64, "shard_numel": 16, "secondary_numel": 32}
    norm = {"numel": 30, "shard_numel": 8, "secondary_numel": 16}
    doc = {"world_size": 4, "hpz_size": 2, "units": [even]}
    assert cli.rank_kinds(doc, rank0_alone=True) == [[0], [1, 2, 3]]
    assert cli.rank_kinds(doc) == [[0, 1, 2, 3]]
    padded = dict(doc, units=[norm, even])
    assert cli.rank_kinds(padded, rank0_alone=True) == [[0], [1], [2], [3]]


@pytest.mark.parametrize("rank,reads", [(0, True), (1, False)], ids=["source", "receiver"])
def test_a_loads_broadcast_is_write_only_on_the_receivers(rank, reads):
    """GatheredParameters' broadcast from rank 0 overwrites the receivers' buffers without
    reading them; outside a load every member still reads and writes (the recordings made
    before --load)."""
    rec = recording.start(rank=rank, world_size=4)
    t = torch.ones(8)
    with rec.context(phase=recording.CHECKPOINT_LOAD, purpose=recording.CHECKPOINT_LOAD):
        collectives.broadcast(t, 0)
    collectives.broadcast(t, 0)
    loaded, other = logged(rec, "all_reduce")
    assert {a[1] for a in loaded.accesses} == ({"r", "w"} if reads else {"w"})
    assert {a[1] for a in other.accesses} == {"r", "w"}
    assert loaded.ctx.purpose == "checkpoint_load" and loaded.comm_bytes == 32


def test_a_copy_from_the_checkpoints_host_memory_waits_for_the_stream(rec):
    """copy_ from a state dict (pageable host memory on a GPU run) is memcpy_and_sync; a copy
    between device tensors, or any copy outside a load, is not."""
    with ops.OpRecorder(seq_len=23, scale=1.0):
        host, full = torch.ones(8), torch.zeros(8)
        full.copy_(host)
        rec.host_storages = {host.untyped_storage()._cdata}
        full.copy_(host)
        full.copy_(full.clone())
        rec.host_storages = set()
    kinds = [e.kind for e in rec.entries if e.kind in ("copy", "host_stream_sync")]
    assert kinds == ["copy", "copy", "host_stream_sync", "copy", "copy"]


def test_the_checkpoint_holds_every_tensor_once_with_its_full_shape():
    """load.state_dict: a tied parameter under its first name only (as save_pretrained writes
    it), ZeRO-3's placeholders by ds_shape, the same values on every call, meta tensors off
    rank 0 where transformers 5 loads them so."""
    from hpzrec import load

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight
            self.norm = torch.nn.LayerNorm(4)

    model = Tied()
    model.norm.weight.data = torch.empty(0)  # a ZeRO-3 placeholder
    model.norm.weight.ds_shape = torch.Size([4])
    sd = load.state_dict(model, seed=1, rank=0, meta_off_rank0=False)
    assert list(sd) == ["embed.weight", "norm.weight", "norm.bias"]
    assert sd["norm.weight"].shape == (4, ) and sd["embed.weight"].shape == (10, 4)
    again = load.state_dict(model, seed=1, rank=3, meta_off_rank0=False)
    assert all(torch.equal(sd[k], again[k]) for k in sd)
    meta = load.state_dict(model, seed=1, rank=3, meta_off_rank0=True)
    assert all(t.device.type == "meta" for t in meta.values())
    assert load.state_dict(model, seed=1, rank=0, meta_off_rank0=True)["embed.weight"].device.type == "cpu"
