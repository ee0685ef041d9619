"""Megatron-Core's GPT model as LiveR sees it (issue 31, first step): built on a generation's own
groups, its Resource View read from Megatron's own sharded-state metadata at emulated sizes (fake
process groups, one process, up to 64 ranks), and the distributed optimizer's flat ranges as
boxes. Megatron-Core is the optional extra ``liver[megatron]`` (``make env`` installs it)."""

import random
import subprocess
import sys
import warnings
from math import prod
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from liver.engine.megatron.ranges import range_boxes, shifted
from liver.topology import ParallelConfig, TrainConfig
from liver.resource_view.view import intersect
from liver.topology.layout import Layout

pytest.importorskip("megatron.core")
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
ROOT = Path(__file__).resolve().parents[1]

from liver.engine.megatron.config import GPTConfig  # noqa: E402
from liver.engine.megatron.view import layout_shards, rank_model, rank_shards, table, tiling_errors  # noqa: E402


@settings(max_examples=400, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_a_flat_range_is_at_most_2n_minus_1_disjoint_boxes_of_exactly_its_elements(shape, data):
    n = prod(shape)
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    boxes = range_boxes(tuple(shape), start, stop)
    assert len(boxes) <= 2 * len(shape) - 1
    flat = np.arange(n).reshape(shape)
    got = [x for b in boxes for x in flat[tuple(slice(lo, hi) for lo, hi in b)].ravel()]
    assert got == list(range(start, stop))  # disjoint, in order, exactly the range
    assert shifted(((0, 2), (1, 3)), (4, 5)) == ((4, 6), (6, 8))
    with pytest.raises(ValueError, match=r"flat range \[0, 7\) is outside a tensor of shape \[2, 3\]"):
        range_boxes((2, 3), 0, 7)


def layout(tp: int, pp: int, dp: int, layers: int = 8, stages=None) -> Layout:
    return Layout(layers, ParallelConfig(tp=tp, pp=pp, dp=dp, layers_per_stage=stages),
                  TrainConfig(global_batch=8 * dp, micro_batch=1))


GQA = GPTConfig(num_layers=8, hidden_size=64, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=96,
                vocab_size=128)
MHA = GPTConfig(num_layers=8, hidden_size=64, num_attention_heads=8, ffn_hidden_size=128, vocab_size=256,
                swiglu=False)


@pytest.mark.parametrize("config,shape", [
    (GQA, (1, 1, 1)), (GQA, (2, 1, 1)), (GQA, (1, 2, 1)), (GQA, (2, 2, 2)), (GQA, (4, 2, 8)),  # 64 ranks
    (GQA, (2, 4, 8)), (GQA, (1, 8, 8)), (GQA, (4, 1, 16)), (MHA, (8, 1, 8)), (MHA, (8, 2, 4)),
    (GQA, (1, 3, 2)),  # uneven stages (3, 3, 2)
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else ("gqa-swiglu" if v.swiglu else "mha-gelu"))
def test_megatrons_boxes_tile_every_tensor_exactly_once_at_emulated_sizes(config, shape):
    lay = layout(*shape)
    per_rank = layout_shards(config, lay)
    assert tiling_errors(per_rank) == []
    specs, tab = table(config, lay)  # (LiveR's own checks: one box a rank, every element held)
    assert {s.name for s in specs} == {s.name for s in table(config, layout(1, 1, 1))[0]}  # the same tensors
    params = sum(s.numel for s in specs)
    with rank_model(config, layout(1, 1, 1), 0) as (whole, _):  # the whole model, as one process builds it
        assert params == sum(p.numel() for p in whole.parameters())
    for r in random.Random(sum(shape)).sample(range(lay.size), min(3, lay.size)):  # as that rank itself
        assert rank_shards(config, lay, r) == per_rank[r]
    for s in specs:  # a layer's tensors are on its stage's ranks, and only there
        holders = {lay.coord(r).pp for r in range(lay.size) if tab.box(s, r) is not None}
        want = {0} if s.layer < 0 else {lay.pp - 1} if s.layer >= config.num_layers else {lay.stage_of_layer(s.layer)}
        assert holders == want, s.name


def test_a_model_built_to_be_loaded_carries_the_tensor_parallel_marks_megatrons_initialisation_gives():
    """Megatron marks the weights it cuts over TP (``tensor_model_parallel``: what its gradient
    norm, its optimizer and its checkpoints read) only where it initialises them; every engine
    after a handoff or a restart is built to be loaded, and without the marks its gradient norm
    counted a TP-cut weight on TP rank 0 only, and its TP-cut weights passed for replicas."""
    from liver.engine.megatron.model import collection, gpt
    from liver.world.fake import FakeWorld, fake_pg

    config, lay = GQA, layout(2, 2, 1)
    for rank in range(lay.size):
        marks = []
        for initialise in (True, False):
            world = FakeWorld.build_fake(0, lay, rank, "gloo", torch.device("cpu"))
            with world.registered_here(), torch.device("meta"):
                pgs = collection(world.tp.pg, world.pp.pg, world.dp.pg, fake_pg(f"solo-{rank}-{initialise}", 0, 1))
                model = gpt(config, lay.parallel, list(lay.layers_per_stage), lay.coord(rank).pp, pgs,
                            perform_initialization=initialise)
            marks.append({n: (p.tensor_model_parallel, p.partition_dim, p.partition_stride)
                          for n, p in model.named_parameters()})
        assert marks[0] == marks[1], rank
        assert {n for n, (cut, _, _) in marks[1].items() if not cut} == \
            {n for n in marks[1] if "norm" in n}, rank  # (only the norms are replicated)


def test_the_models_facts_are_counted_on_megatrons_own_model():
    from liver.engine.megatron.view import facts
    f = facts(GQA)
    h, kv = GQA.hidden_size, GQA.hidden_size // GQA.num_attention_heads * GQA.num_query_groups
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * GQA.ffn_hidden_size + 2 * h  # qkv, proj, SwiGLU, two norms
    assert f.params == GQA.num_layers * per_layer + 2 * GQA.vocab_size * h + h  # embedding, output, final norm
    assert (f.layers, f.width, f.seq_len) == (8, 64, GQA.seq_length)
    assert f.flops_per_token == 6.0 * f.params + 12.0 * 8 * 64 * GQA.seq_length


def test_swiglus_halves_are_two_tensors_each_cut_over_tp():
    lay = layout(2, 1, 1)
    specs, tab = table(GQA, lay)
    names = {s.name for s in specs}
    w, v = "decoder.layers.0.mlp.linear_fc1.weight_w", "decoder.layers.0.mlp.linear_fc1.weight_v"
    assert {w, v} <= names and "decoder.layers.0.mlp.linear_fc1.weight" not in names
    by = {s.name: s for s in specs}
    assert by[w].shape == by[v].shape == (GQA.ffn_hidden_size, GQA.hidden_size)
    assert [tab.box(by[w], r) for r in (0, 1)] == [((0, 48), (0, 64)), ((48, 96), (0, 64))]
    pieces = {s.name: s for s in rank_shards(GQA, lay, 1)}
    assert pieces[w].part == (0, 0, 2) and pieces[v].part == (0, 1, 2)  # halves of the rank's local weight


def test_a_plan_between_two_megatron_layouts_moves_every_element_once():
    from test_views import assert_exact

    from liver.planner import plan_transfer
    for a, b in (((2, 2, 1), (1, 1, 2)), ((1, 2, 2), (4, 1, 1)), ((2, 1, 2), (1, 3, 2))):
        la, lb = layout(*a), layout(*b)
        specs, old = table(GQA, la)
        _, new = table(GQA, lb)
        procs = list(range(max(la.size, lb.size)))
        assert_exact(plan_transfer(old, new, specs, procs[:la.size], procs[:lb.size]), specs, old, new)


DISTOPT_SHAPES = [(1, 1, 1), (1, 1, 2), (2, 1, 4), (1, 2, 3), (2, 2, 2), (4, 2, 8), (2, 4, 8), (1, 1, 64)]


def distopt_shapes(config) -> dict[str, tuple[int, ...]]:
    return {s.name: s.shape for s in table(config, layout(1, 1, 1))[0]}


@pytest.mark.parametrize("config,shape,bucket", [(GQA, s, None) for s in DISTOPT_SHAPES] +
                         [(MHA, (8, 1, 8), None), (GQA, (2, 2, 4), 3000), (MHA, (1, 1, 8), 5000)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else
                         ("gqa-swiglu" if v.swiglu else "mha-gelu") if isinstance(v, GPTConfig) else f"bucket{v}")
def test_the_distributed_optimizers_ranges_tile_every_tensor_once_at_emulated_sizes(config, shape, bucket):
    """Megatron's DDP over fake groups of the layout's sizes lays out its buffers, its distributed
    optimizer's own range arithmetic cuts them for every DP rank: as boxes, the main replicas of
    each tensor's fp32 weight and moments tile it exactly once, up to 64 ranks; a rank's boxes lie
    in its own TP and pipeline piece, and at one DP rank they are its pieces whole (``bucket``:
    Megatron's bucket size, small: each bucket is cut over the DP ranks on its own)."""
    from liver.engine.megatron.distopt import KINDS, layout_ranges, tiling_errors as range_errors
    lay = layout(*shape)
    per_rank = layout_ranges(config, lay, **({} if bucket is None else {"bucket_size": bucket}))
    assert range_errors(per_rank, distopt_shapes(config)) == []
    pieces = layout_shards(config, lay)
    for rank, row in enumerate(per_rank):
        mine = {p.name: p.box for p in pieces[rank]}
        for r in row:  # inside the rank's own piece of the tensor (its TP slice, on its stage)
            assert r.kind in KINDS and all(intersect(b, mine[r.name]) == b for b in r.boxes), (rank, r)
        if lay.dp == 1:
            assert {(r.name, r.boxes) for r in row} == {(n, (b,)) for n, b in mine.items()}


def test_a_plan_between_two_distributed_optimizer_layouts_writes_every_element_once_and_right():
    """The distributed optimizer's state moved between emulated layouts (DP, TP and PP changing
    together; the flat ranges cut anew): run on arrays, every element of every new rank's boxes is
    written exactly once, with the value of the same element of the tensor."""
    from liver.engine.megatron.distopt import layout_ranges, plan_ranges
    for a, b in (((1, 1, 4), (2, 1, 2)), ((2, 2, 2), (1, 4, 3)), ((1, 1, 2), (4, 2, 1))):
        old, new = layout_ranges(GQA, layout(*a)), layout_ranges(GQA, layout(*b))
        check_range_plan(plan_ranges(old, new), old, new)


def check_range_plan(moves, old, new) -> None:
    """``moves`` run on arrays: every element of every new rank's boxes written exactly once, with
    the value of the same element of the tensor, from an old rank that holds it."""
    shapes = distopt_shapes(GQA)
    whole = {n: np.random.default_rng(len(n)).standard_normal(s) for n, s in shapes.items()}
    written = {(rank, r.name, r.kind): np.zeros(shapes[r.name], dtype=int) for rank, row in enumerate(new) for r in row}
    got = {k: np.full(shapes[k[1]], np.nan) for k in written}
    held = {(rank, r.name, r.kind): r.boxes for rank, row in enumerate(old) for r in row}
    for m in moves:
        assert any(intersect(m.box, s) == m.box for s in held[(m.src, m.name, m.kind)]), m  # the source holds it
        sl = tuple(slice(lo, hi) for lo, hi in m.box)
        written[(m.dst, m.name, m.kind)][sl] += 1
        got[(m.dst, m.name, m.kind)][sl] = whole[m.name][sl]
    for rank, row in enumerate(new):
        for r in row:
            want = np.zeros(shapes[r.name], dtype=int)
            for box in r.boxes:
                want[tuple(slice(lo, hi) for lo, hi in box)] = 1
            key = (rank, r.name, r.kind)
            assert (written[key] == want).all(), key
            assert np.array_equal(got[key][want == 1], whole[r.name][want == 1]), key


@pytest.mark.parametrize("kwargs,shape,words", [
    (dict(num_attention_heads=6, num_query_groups=None), None, "model.num_attention_heads=6: allowed a divisor of hidden_size=64"),
    (dict(num_query_groups=3), None, "model.num_query_groups=3: allowed a divisor of num_attention_heads=8"),
    (dict(num_layers=0), None, "model.num_layers=0: allowed a positive integer"),
    (dict(hidden_dropout=1.0), None, "model.hidden_dropout=1.0: allowed a probability from 0 to below 1"),
    (dict(hidden_size=48, num_attention_heads=16), None, "head dimension must be even"),
    ({}, (8, 1, 1), "parallel.tp=8: Megatron-Core needs it to divide model.num_query_groups=4"),
    ({}, (1, 4, 1, [1, 3, 2, 2]), "parallel.layers_per_stage=[1, 3, 2, 2]: Megatron-Core needs the stages"),
])
def test_a_configuration_or_layout_megatron_cannot_build_is_refused_naming_the_field(kwargs, shape, words):
    with pytest.raises(ValueError) as e:
        config = GPTConfig(**{**GQA.__dict__, **kwargs})
        if shape is not None:
            layout_shards(config, layout(*shape[:3], stages=shape[3] if len(shape) > 3 else None))
    assert words in str(e.value)


@pytest.mark.timeout(300)
def test_megatrons_model_on_a_worlds_own_gloo_groups_steps_as_the_model_built_whole(pool):
    """TP=2 over a LiveR World's gloo groups (no ``initialize_model_parallel``), the CPU shims
    installed (``cpu.py``): its forward, backward and an SGD step from the whole model's values,
    copied into each rank's boxes by the Resource View, equal the whole model's in the same
    processes (to float tolerance: TP sums in another order)."""
    from megatron_segments import tp_step_matches_one_process
    config = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=48,
                  vocab_size=64, seq_length=16)
    out = pool.run(tp_step_matches_one_process, [dict(rank=r, parallel=dict(tp=2, pp=1, dp=1), config=config) for r in range(2)])
    for o in out:
        assert abs(o["loss"] - o["whole_loss"]) < 1e-5, o
        assert o["max_diff"] < 1e-5 and o["max_abs"] > 0, o
    assert out[0]["whole_loss"] == out[1]["whole_loss"]  # (the same batch and values on both ranks)


MEGATRON_JOB = ROOT / "configs" / "megatron.toml"
LIVE_EVENTS = [("reshape 1,1,2", "tp1pp1dp2"),                     # TP2 -> DP2, in place
               ("reshape 1,2,1", "tp1pp2dp1"),                     # a pipeline of two stages
               ("scale-out 4 as 2,2,1", "tp2pp2dp1"),              # cold joiners
               ("scale-in 2 deadline 60s as 1,1,2", "tp1pp1dp2")]  # with a deadline


@pytest.mark.timeout(600)
def test_live_reshapes_of_a_megatron_model_equal_restart(tmp_path):
    """Megatron-Core's GPT (configs/megatron.toml, with dropout) reshaped live: TP2 -> DP2, into two
    pipeline stages, a scale-out onto cold joiners, a scale-in with a deadline; each switch keeps the digest,
    and every step after is bit-equal (loss and digest) to the same changes made by stop-and-restart
    through a checkpoint, at the same steps."""
    from test_run import check_continuous, liver
    events = tmp_path / "events.txt"
    events.write_text("".join(f"at step {3 if i == 0 else '+3'}: {a}\n" for i, (a, _) in enumerate(LIVE_EVENTS)))
    # (with dropout: Megatron's RNGs are seeded at every build, the new generation's as a restart's)
    common = ("--config", str(MEGATRON_JOB), "--digest", "--set", "job.model.hidden_dropout=0.1",
              "--set", "job.model.attention_dropout=0.1")
    # (the live job writes its periodic checkpoints beside the preparations: none may fail)
    live = liver(tmp_path / "live", *common, "--events", str(events), "--end-after-events", "3", "--steps", "100000")
    assert live["rc"] == 0
    assert [e["status"] for e in live["events"]] == ["done"] * len(LIVE_EVENTS), [e["status"] for e in live["events"]]
    assert [e["new"] for e in live["events"]] == [n for _, n in LIVE_EVENTS]
    for e in live["events"]:
        assert e["digest_equal"] is True, e
    assert live["events"][3]["deadline_met"] is True
    total = live["steps"][-1]["step"]
    check_continuous(live, total)
    cuts = [e["last_old_step"] for e in live["events"]]
    events2 = tmp_path / "events2.txt"
    events2.write_text("".join(f"at step {c}: {a}\n" for c, (a, _) in zip(cuts, LIVE_EVENTS)))
    restart = liver(tmp_path / "restart", *common, "--events", str(events2), "--steps", str(total),
                    "--mode", "restart-forked", "--set", "checkpoint.every=0")
    assert restart["rc"] == 0
    assert [e["last_old_step"] for e in restart["events"]] == cuts
    assert {e["checkpoint_format"] for e in restart["events"]} == {"megatron-dist-checkpointing"}
    assert [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in live["steps"]] == \
        [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in restart["steps"]]


@pytest.mark.timeout(600)
def test_tp_replicas_that_megatron_let_drift_apart_are_handed_off_as_its_checkpoint_saves_them(tmp_path, monkeypatch):
    """Megatron lets its TP ranks' copies of a norm weight drift apart (seen on GPUs; here TP rank
    1's copy moved by one unit in the last place after step 2, fault ``drift``). A live TP2 -> DP2
    handoff carries TP rank 0's copy to both ranks, as Megatron's checkpoint saves it and a restart
    loads it: the handoff's digests agree, and every step after is bit-equal to the same change
    made by stop-and-restart through Megatron's checkpoint (before the alignment, rank 1 kept its
    own copy: the digest after the switch found two replicas, and the losses parted). The restart's
    save aligns them too, which changes nothing Megatron saves and lets its digest be taken."""
    from liver.host import faults
    from test_run import liver
    monkeypatch.setenv(faults.ENV, "drift:1:2")
    events = tmp_path / "events.txt"
    events.write_text("at step 3: reshape 1,1,2\n")
    common = ("--config", str(MEGATRON_JOB), "--parallel", "2,1,1", "--gpus", "2", "--digest", "switch",
              "--set", "checkpoint.every=0", "--steps", "9")
    live = liver(tmp_path / "live", *common, "--events", str(events))
    (ev,) = live["events"]
    assert live["rc"] == 0 and ev["status"] == "done" and ev["digest_equal"] is True, ev
    cut = tmp_path / "cut.txt"  # the restart stops where the live run switched
    cut.write_text(f"at step {ev['last_old_step']}: reshape 1,1,2\n")
    restart = liver(tmp_path / "restart", *common, "--events", str(cut), "--mode", "restart-forked")
    (rv,) = restart["events"]
    assert restart["rc"] == 0 and rv["status"] == "done" and rv["last_old_step"] == ev["last_old_step"] < 9, rv
    assert rv["digest_equal"] is True, rv  # (its save aligns them first: Megatron's checkpoint keeps TP rank 0's)
    assert [(s["step"], s["parallel"], s["loss"]) for s in live["steps"]] == \
        [(s["step"], s["parallel"], s["loss"]) for s in restart["steps"]]
    assert ev["digest_after"] == rv["digest_after"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_megatrons_own_checkpoint_of_the_engine_loads_back_exactly(tmp_path, dtype):
    """The Megatron engine's restart save is Megatron's ``dist_checkpointing`` (its metadata beside
    torch's); loaded into a new engine, the state and the next step are the same to the bit. In
    bf16 the state is the fp32 main weights (Megatron's ``fp32_param``) and the model computes in
    bf16 copies of them."""
    import torch

    from liver.engine.digest import state_digest
    from liver.engine.megatron import ADAPTER
    from liver.engine.megatron.checkpoint import is_megatron
    from liver.topology import JobConfig
    from liver.topology.presets import preset
    from liver.world.world import World, make_store

    job = JobConfig(model=GPTConfig(num_query_groups=2), train=preset("tiny").train, compute_dtype=dtype)
    store, _ = make_store()
    world = World.build(store, 0, ADAPTER.layout(job, ParallelConfig()), 0, "gloo", torch.device("cpu"))
    world.activate()
    try:
        one = ADAPTER.build(job, world, torch.device("cpu"))
        assert {p.dtype for p in one.model.parameters()} == {getattr(torch, dtype)}
        assert {t.dtype for t in one.state.values()} == {torch.float32}
        for _ in range(2):
            one.train_step()
        ADAPTER.save_for_restart(one, str(tmp_path / "ckpt"))
        assert is_megatron(tmp_path / "ckpt")
        two = ADAPTER.build(job, world, torch.device("cpu"), initialise=False)
        ADAPTER.load_checkpoint(two, str(tmp_path / "ckpt"))
        assert two.step == 2 and state_digest(two) == state_digest(one)
        a, b = one.train_step(), two.train_step()
        assert (a.loss, a.grad_norm) == (b.loss, b.grad_norm) and state_digest(two) == state_digest(one)
    finally:
        world.destroy()


# ---- on a GPU: Megatron's DDP, distributed optimizer and schedule (skipped without CUDA) ---------
gpu = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="Megatron's distributed optimizer needs CUDA")


def test_the_gpu_adapter_refuses_what_it_cannot_run_naming_the_field():
    import torch

    from liver.engine.megatron import GPU_ADAPTER
    from liver.topology import JobConfig
    job = JobConfig(model=GPTConfig(num_query_groups=2), train=TrainConfig(global_batch=8, micro_batch=1))
    with pytest.raises(ValueError, match=r"parallel.dp=2: allowed 1"):
        GPU_ADAPTER.check(job, ParallelConfig(dp=2))
    GPU_ADAPTER.check(job, ParallelConfig(tp=2, pp=2))
    if not torch.cuda.is_available():
        from liver.world.world import World, make_store
        store, _ = make_store()
        world = World.build(store, 0, GPU_ADAPTER.layout(job, ParallelConfig()), 0, "gloo", torch.device("cpu"))
        try:
            with pytest.raises(ValueError, match=r"device cpu: Megatron's distributed optimizer and schedule need a GPU"):
                GPU_ADAPTER.build(job, world, torch.device("cpu"))
        finally:
            world.destroy()


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_megatrons_distributed_optimizer_trains_and_its_state_moves_and_loads_back_exactly(tmp_path, dtype):
    """World size 1 on a GPU (NCCL): Megatron's DDP, distributed optimizer and schedule train; an
    engine built from the state (as a switch builds the new generation's) and one loaded from
    Megatron's checkpoint take the next step to the same bits."""
    import torch

    from liver.engine.digest import state_digest
    from liver.engine.megatron import GPU_ADAPTER
    from liver.engine.megatron.gpu_engine import MegatronGpuEngine
    from liver.topology import JobConfig
    from liver.world.world import World, make_store
    job = JobConfig(model=GPTConfig(num_query_groups=2), train=TrainConfig(global_batch=4, micro_batch=1),
                    compute_dtype=dtype)
    store, _ = make_store()
    dev = torch.device("cuda", 0)
    world = World.build(store, 0, GPU_ADAPTER.layout(job, ParallelConfig()), 0, "nccl", dev)
    world.activate()
    try:
        one = GPU_ADAPTER.build(job, world, dev)
        assert isinstance(one, MegatronGpuEngine) and type(one.optimizer).__name__ == "DistributedOptimizer"
        assert {t.dtype for t in one.state.values()} == {torch.float32}
        losses = [one.train_step().loss for _ in range(4)]
        assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
        moved = GPU_ADAPTER.build(job, world, dev, initialise=False, state={k: v.clone() for k, v in one.state.items()})
        moved.load_scalars(one.scalars())
        GPU_ADAPTER.save_for_restart(one, str(tmp_path / "ckpt"))
        loaded = GPU_ADAPTER.build(job, world, dev, initialise=False)
        GPU_ADAPTER.load_checkpoint(loaded, str(tmp_path / "ckpt"))
        assert state_digest(moved) == state_digest(one) == state_digest(loaded)
        a, b, c = one.train_step(), moved.train_step(), loaded.train_step()
        assert (a.loss, a.grad_norm) == (b.loss, b.grad_norm) == (c.loss, c.grad_norm)
        assert state_digest(moved) == state_digest(one) == state_digest(loaded)
        assert a.mfu > 0
    finally:
        world.destroy()


def megatron_optimizer_rows(lay: Layout, ranks) -> dict[int, list]:
    """What Megatron's real distributed optimizer holds on each of ``ranks`` of ``lay`` (built on the
    GPU over fake groups as that rank, bf16): its own record of each parameter's flat range
    (``_get_model_param_range_map``: what its checkpoints describe) as boxes of the parameter's
    pieces, a ``distopt.RangeShard`` per piece and kind. (Megatron 0.16 refuses to build its own
    flat-range ShardedTensors, ``fully_sharded_model_space``: "flattened_range is not supported".)"""
    import torch
    from megatron.core.optimizer import get_megatron_optimizer

    from liver.engine.megatron import cpu
    from liver.engine.megatron.distopt import KINDS, RangeShard, full_collection, piece_boxes, wrap
    from liver.engine.megatron.engine import owner
    from liver.engine.megatron.gpu_engine import one_optimizer, optimizer_config
    from liver.engine.megatron.model import gpt
    from liver.engine.megatron.view import shards
    from liver.topology import JobConfig
    from liver.world.fake import FakeWorld, fake_pg
    dev = torch.device("cuda", 0)
    cpu.install(dev)  # (Megatron's own CUDA answers, where a CPU test of this process had shimmed them)
    job = JobConfig(model=GQA, train=TrainConfig(global_batch=8, micro_batch=1), compute_dtype="bfloat16")
    out = {}
    for rank in ranks:
        world = FakeWorld.build_fake(0, lay, rank, "nccl", dev)
        with world.registered_here():
            pgs = full_collection(world.tp.pg, world.pp.pg, world.dp.pg, fake_pg(f"solo-{rank}", 0, 1))
            with torch.device(dev):
                model = gpt(GQA, lay.parallel, list(lay.layers_per_stage), lay.coord(rank).pp, pgs, torch.bfloat16)
            model.to(torch.bfloat16)
            params = list(model.parameters())
            opt = one_optimizer(get_megatron_optimizer(optimizer_config(job), [wrap(model, pgs)], pg_collection=pgs,
                                                       use_gloo_process_groups=False))
            pieces = shards(model, world.dp.pg, GQA.num_layers)
        row = []
        for piece in pieces:
            param = params[owner(piece.data, params)]
            if param not in opt.model_param_gbuf_map:
                continue  # (none of it on this DP rank)
            got = opt._get_model_param_range_map(param)["param"]
            boxes = tuple(piece_boxes(piece, tuple(param.shape), got.start, got.end))
            if boxes:
                row += [RangeShard(piece.name, kind, boxes, not any(piece.replica[:-1])) for kind in KINDS]
        out[rank] = row
    return out


@pytest.fixture
def fake_object_gather(monkeypatch):
    """Megatron agrees its parameter groups by all_gather_object over the default group: over a fake
    one, every emulated rank has this one's, as every rank of a dense GPT does."""
    import torch.distributed as dist
    monkeypatch.setattr(dist, "all_gather_object", lambda out, obj, group=None: out.__setitem__(slice(None), [obj] * len(out)))


@gpu
@pytest.mark.parametrize("shape", [(1, 1, 4), (2, 2, 2), (2, 1, 8), (1, 4, 16)], ids=lambda s: "x".join(map(str, s)))
def test_megatrons_own_distributed_optimizer_records_are_the_box_table_at_emulated_sizes(fake_object_gather, shape):
    """Megatron's real distributed optimizer, as emulated ranks of a layout (up to 64), holds of each
    parameter exactly the boxes of that rank's row of LiveR's table (``distopt.layout_ranges``:
    Megatron's DDP and range arithmetic for every DP rank at once), and the table tiles every tensor
    once."""
    import torch

    from liver.engine.megatron.distopt import layout_ranges, tiling_errors as range_errors
    lay = layout(*shape)
    ours = layout_ranges(GQA, lay, torch.device("cuda", 0))
    assert range_errors(ours, distopt_shapes(GQA)) == []
    for rank, row in megatron_optimizer_rows(lay, sorted({0, lay.size - 1, lay.size // 2})).items():
        assert set(row) == set(ours[rank]), rank


@gpu
def test_a_plan_between_emulated_layouts_made_from_megatrons_own_records_is_liver_s_and_exact(fake_object_gather):
    """Every rank of two layouts built as Megatron's real distributed optimizer: the plan between
    what they hold is the plan between LiveR's tables, and it writes every element of every new
    rank's boxes exactly once, from an old main replica that holds it."""
    import torch

    from liver.engine.megatron.distopt import layout_ranges, plan_ranges
    dev = torch.device("cuda", 0)
    for a, b in (((1, 1, 4), (2, 1, 2)), ((2, 2, 2), (1, 4, 3))):
        la, lb = layout(*a), layout(*b)
        theirs = [megatron_optimizer_rows(x, range(x.size)) for x in (la, lb)]
        theirs = [[t[r] for r in range(len(t))] for t in theirs]
        ours = [layout_ranges(GQA, x, dev) for x in (la, lb)]
        assert [list(map(set, t)) for t in theirs] == [list(map(set, o)) for o in ours]
        moves = plan_ranges(*theirs)
        assert sorted(moves, key=repr) == sorted(plan_ranges(*ours), key=repr)
        check_range_plan(moves, *theirs)




def test_a_job_naming_megatron_where_it_is_not_installed_is_refused_in_words(tmp_path):
    """On a machine without megatron-core (the lent GPU image had none), a job file naming the
    engine is refused before anything starts, saying how to install it: no traceback."""
    code = ("import sys; sys.modules['megatron'] = None\n"  # (any import of megatron... fails)
            "from liver.cli import main\n"
            f"sys.exit(main(['run', '--config', 'configs/megatron.toml', '--steps', '1', '--run-dir', {str(tmp_path)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2, r.stderr[-2000:]
    assert "liver: error: the Megatron-Core engine needs megatron-core" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.timeout(300)
def test_a_scale_in_no_handoff_fits_lets_megatrons_pipelined_replicas_go_and_the_survivors_go_on(tmp_path):
    """Megatron on two pipeline stages of two replicas; a scale-in to 2 whose deadline (0.1 s) no
    handoff fits: the leaving replicas are stopped and the survivors, holding every shard, go on
    from their own state (the drop path), nothing rolled back. A survivor blocked in a collective
    with a stalled peer used to wait for the whole heal timeout (30 s), then the job rolled back to
    its checkpoint, in 3 of 4 runs: Megatron's model holds its process groups, so letting a group
    go did not close gloo's connections; a stalled rank now cuts them (``World.interrupt``)."""
    from test_run import liver
    events = tmp_path / "events.txt"
    events.write_text("at step 3: scale-out 4 as 1,2,2\nat step +4: scale-in 2 deadline 0.1s\n")
    common = ("--config", str(MEGATRON_JOB), "--parallel", "1,1,2", "--gpus", "2", "--digest", "switch")
    live = liver(tmp_path / "live", *common, "--set", "checkpoint.every=2", "--events", str(events),
                 "--end-after-events", "4", "--steps", "100000")
    assert live["rc"] == 0
    out, drop = live["events"]  # (no fail-stop record: nothing recovered from the checkpoint)
    assert out["status"] == "done" and out["new"] == "tp1pp2dp2", out
    assert drop["status"].startswith("done: no handoff fits the deadline"), drop
    assert drop["deadline_met"] is True and drop["lost_steps"] == 0 and drop["heal_s"] < 10, drop
    # every step after it is the step the same changes made through a checkpoint compute, bit for bit
    cuts = tmp_path / "cuts.txt"
    cuts.write_text(f"at step {out['last_old_step']}: scale-out 4 as 1,2,2\n"
                    f"at step {drop['restored_step']}: scale-in 2 as 1,1,2\n")
    total = live["steps"][-1]["step"]
    restart = liver(tmp_path / "restart", *common, "--events", str(cuts), "--steps", str(total),
                    "--mode", "restart-forked", "--set", "checkpoint.every=0")
    assert restart["rc"] == 0

    def after(r):
        return [(x["step"], x["parallel"], x["loss"], x["grad_norm"]) for x in r["steps"] if x["step"] > drop["restored_step"]]

    assert after(live) and after(live) == after(restart)
