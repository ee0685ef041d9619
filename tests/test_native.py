"""A user's own PyTorch-native model (examples/llama.py: plain torch, TP by parallelize_module, FSDP2
by fully_shard) behind the Recipe API.

In-process: the Resource View from DTensor placements (every rank's box, from rank 0's placements
and the mesh's shape, equals what DTensor gives that rank), refusals naming the tensor, and the
private DeviceMesh arguments and DTensor caches the mesh construction relies on. With real
processes over gloo (`liver run`): TP2 -> FSDP2 -> TP2 -> scale-out to FSDP2 x TP2 with cold
joiners -> FSDP4 -> scale-in with a deadline -> two pipeline stages (torch.distributed.pipelining),
live and by restart through DCP, bit for bit; and a kill -9 recovered from the periodic DCP
checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from liver.engine.interface import load_adapter
from liver.engine.native.engine import build_model
from liver.engine.native.resource import local_box
from liver.topology import JobConfig, ModelConfig, ParallelConfig, TrainConfig
from liver.world.fake import FakeWorld
from liver.world.world import forget_meshes

ROOT = Path(__file__).resolve().parent.parent
# torch before 2.12 (the GPU image's 2.11): the fake process group's reduce-scatter leaves its
# output unwritten (pytorch/pytorch#178078), so a fake world's FSDP gradients are uninitialised memory
FAKE_REDUCE_SCATTER_WRITES = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 12)
EXAMPLE = f"{ROOT}/examples/llama.py:RECIPE"
CONFIG = str(ROOT / "configs" / "llama-native.toml")


def job_of(hidden: int, heads: int, ffn: int, vocab: int, layers: int = 2, batch: int = 24) -> JobConfig:
    return JobConfig(model=ModelConfig(num_layers=layers, hidden_size=hidden, num_heads=heads, ffn_size=ffn,
                                       vocab_size=vocab, seq_len=8),
                     train=TrainConfig(global_batch=batch, micro_batch=1))


def actual_boxes(adapter, job: JobConfig, parallel: ParallelConfig, rank: int) -> dict:
    """What DTensor itself gives rank ``rank``: the model built for that rank on a fake world."""
    layout = adapter.layout(job, parallel)
    world = FakeWorld.build_fake(0, layout, rank, "gloo", torch.device("cpu"))
    with world.registered():
        try:
            model, optimizer, placed = build_model(adapter.recipe, job, world, torch.device("meta"))
            names = dict(model.named_parameters())
            out = {}  # (a pipeline stage's model names only its own tensors)
            for p in placed:
                t = names[p.spec.param or p.spec.name]
                if p.spec.kind != "param":
                    t = optimizer.state[t][p.spec.kind]
                out[p.spec.name] = local_box(p.spec.name, t)
            return out
        finally:
            forget_meshes()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 3, 4]), vocab=st.sampled_from([4, 12, 20, 36]),
       hidden_mult=st.sampled_from([1, 3]), pp=st.sampled_from([1, 2, 3]))
def test_dtensor_view_is_every_ranks_own_box(tp, dp, vocab, hidden_mult, pp):
    """Uneven FSDP splits (hidden 24 over 3 or 4 ranks of 2-D shards, a 4-row vocabulary over 3
    ranks: empty shards) included, and pipeline stages (3 layers: uneven over 2); the boxes tile
    every tensor (BoxTable.build checks it); a rank holds only its stage's tensors."""
    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8 * hidden_mult, heads=4, ffn=8, vocab=vocab, layers=3)
    parallel = ParallelConfig(tp=tp, pp=pp, dp=dp)
    layout = adapter.layout(job, parallel)
    table = adapter.view(job, layout)
    specs = adapter.state_specs(job)
    assert [s.name for s in specs] == [s.name for s in table_specs(adapter, job, layout)]
    for rank in range(layout.size):
        got = actual_boxes(adapter, job, parallel, rank)
        for s in specs:
            assert table.box(s, rank) == got.get(s.name), (s.name, rank)


def table_specs(adapter, job, layout):
    return [p.spec for p in adapter.placed(job, layout)]


def test_strided_fsdp_over_tp_and_empty_shards_are_described():
    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=4)
    layout = adapter.layout(job, ParallelConfig(tp=2, dp=3))
    placed = {p.spec.name: p for p in adapter.placed(job, layout)}
    emb = placed["tok_embeddings.weight"]
    assert [type(p).__name__ for p in emb.placements] == ["_StridedShard", "Shard"]
    table = adapter.view(job, layout)
    rows = [table.box(emb.spec, r) for r in range(layout.size)]
    assert None in rows  # 2 rows per TP rank over 3 FSDP ranks: one rank holds nothing
    # the moments carry their parameter's geometry
    assert table.boxes["tok_embeddings.weight.exp_avg"] == table.boxes["tok_embeddings.weight"]


def test_what_cannot_be_described_is_refused_with_the_tensor_named():
    from torch import nn
    from torch.distributed.tensor import DTensor, Partial

    from liver.engine.native.resource import placed_state

    world = FakeWorld.build_fake(0, load_adapter(EXAMPLE).layout(job_of(8, 4, 8, 4), ParallelConfig(tp=2)), 0,
                                 "gloo", torch.device("cpu"))
    with world.registered():
        try:
            m = nn.Linear(4, 4, bias=False)
            m.weight = nn.Parameter(DTensor.from_local(torch.zeros(4, 4), world.mesh()["tp"], [Partial()]))
            with pytest.raises(ValueError, match="'weight' has placement Partial"):
                placed_state(m, None)
        finally:
            forget_meshes()
    from liver.engine.native.optim import describe
    for make, match in [(lambda m: torch.optim.LBFGS(m.parameters()), "LBFGS of the recipe 'r': one step over "
                         "stand-ins of the parameters failed"),
                        (lambda m: torch.optim.Adafactor(m.parameters()), "Adafactor of the recipe 'r': state "
                         "'(col|row)_var' has shape")]:
        with torch.device("meta"):
            m = nn.Linear(4, 4, bias=False)
        with pytest.raises(ValueError, match=match):
            describe(make, m, "r")


def test_bad_layouts_are_refused_naming_the_field():
    from liver.engine.native import Recipe
    from liver.engine.native.adapter import NativeAdapter

    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=4)
    flat = type("NoStages", (type(adapter.recipe),), {"stage": Recipe.stage})()  # a recipe that cannot cut stages
    with pytest.raises(ValueError, match="parallel.pp=2: the recipe 'llama' defines no stage()"):
        NativeAdapter(flat).layout(job, ParallelConfig(pp=2))
    with pytest.raises(ValueError, match="parallel.tp=3 does not divide model.num_heads=4"):
        adapter.layout(job, ParallelConfig(tp=3))
    with pytest.raises(ValueError, match="engine='nowhere.py:RECIPE': cannot import it"):
        load_adapter("nowhere.py:RECIPE")
    with pytest.raises(ValueError, match="not an EngineAdapter or a Recipe"):
        load_adapter("liver.topology:JobConfig")


def test_device_mesh_private_arguments_and_dtensor_caches_hold_on_this_torch():
    """Pinned: what ``World.mesh`` and ``forget_meshes`` rely on. A mesh built with
    ``_init_backend=False, _rank=r`` has rank r's coordinate, takes its groups from
    ``_dim_group_names``; the box function takes (shape, mesh shape, coordinate, placements); a
    fake mesh of rank 0 seen first must not leak into a model laid out for rank 1 afterwards."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh = DeviceMesh("cpu", torch.arange(4).reshape(1, 2, 2), mesh_dim_names=("pp", "dp", "tp"),
                      _init_backend=False, _rank=3)
    assert list(mesh.get_coordinate()) == [0, 1, 1]
    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=8)
    world = FakeWorld.build_fake(0, adapter.layout(job, ParallelConfig(tp=2, dp=2)), 3, "gloo", torch.device("cpu"))
    with world.registered():
        m = world.mesh()  # its axes' groups given by name (``_dim_group_names``), sliced by name
        assert m["tp"].get_group() is world.tp.pg and m["dp"].get_group() is world.dp.pg
        assert list(m["dp", "tp"].get_coordinate()) == [1, 1]
    assert _compute_local_shape_and_global_offset((5, 3), (2,), [1], [Shard(0)]) == ((2, 3), (3, 0))
    first = actual_boxes(adapter, job, ParallelConfig(tp=2), 0)
    second = actual_boxes(adapter, job, ParallelConfig(tp=2), 1)
    assert first["tok_embeddings.weight"] == ((0, 4), (0, 8)) and second["tok_embeddings.weight"] == ((4, 8), (0, 8))


def test_a_shard_that_stays_is_adopted_without_a_copy_except_into_fsdp2_buffers():
    """The new generation's model takes the old shards' storage (DTensor.from_local on its mesh)
    where the box stays on the process: parameters and Adam moments alike; not where FSDP2 owns
    the storage, nor where a shape differs."""
    from liver.engine.native.engine import NativeEngine
    from liver.world.world import World, make_store

    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=8)
    store, _ = make_store()
    world = World.build(store, 0, adapter.layout(job, ParallelConfig()), 0, "gloo", torch.device("cpu"))
    world.activate()
    try:
        old = NativeEngine(adapter.recipe, job, world, torch.device("cpu"))
        old.train_step()
        kept = dict(old.state)
        kept["norm.weight"] = torch.zeros(3)  # (a shape that does not fit: fresh storage)
        new = NativeEngine(adapter.recipe, job, world, torch.device("cpu"), initialise=False, adopt=kept)
        for name, t in new.state.items():
            same = t.data_ptr() == old.state[name].data_ptr()
            assert same == (name != "norm.weight"), name
        assert any(n.endswith(".exp_avg") for n in new.state)
        new.load_scalars(old.scalars())
        with torch.no_grad():
            new.state["norm.weight"].copy_(old.state["norm.weight"])
        assert new.train_step().step == 2
    finally:
        world.destroy()
    fsdp = FakeWorld.build_fake(0, adapter.layout(job, ParallelConfig(dp=2)), 0, "gloo", torch.device("cpu"))
    with fsdp.registered():
        try:
            first = NativeEngine(adapter.recipe, job, fsdp, torch.device("cpu"))
            second = NativeEngine(adapter.recipe, job, fsdp, torch.device("cpu"), initialise=False, adopt=first.state)
            assert all(t.data_ptr() != first.state[n].data_ptr() for n, t in second.state.items() if n in first.state)
            assert not any(n.endswith(".exp_avg") for n in first.state)  # (Adam makes its state at its first step)
        finally:
            forget_meshes()


@pytest.mark.parametrize("parallel,spare", [(ParallelConfig(tp=2, dp=2), 1 << 30), (ParallelConfig(dp=2), 1 << 30),
                                            (ParallelConfig(tp=2), 1 << 30), (ParallelConfig(tp=2), 0)])
def test_the_engine_prebuilt_in_another_thread_is_the_one_the_switch_would_build(parallel, spare):
    """Prepare makes the next generation's engine in the companion's thread, the World
    registered there alone (the training thread's default group stays its own): its model laid
    out on the new mesh, storage made and touched where it fits in the spare, the old engine's
    kept shard adopted (not FSDP2's parameters: it makes its own); the switch takes it as it is
    and gives the same engine as one built there: the same tensors, boxes and placements, and the
    same step. A kept shard whose storage changed after Prepare (a user's ``p.data = ...``)
    makes the switch build it anew, and say so. Over the spare: only the structure is made."""
    import threading

    import torch.distributed as dist

    from liver.engine.native.engine import NativeEngine, fsdp

    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=8)
    layout = adapter.layout(job, parallel)
    active = FakeWorld.build_fake(0, adapter.layout(job, ParallelConfig(tp=4)), 3, "gloo", torch.device("cpu"))
    shadow = FakeWorld.build_fake(1, layout, 1, "gloo", torch.device("cpu"))
    box = adapter._boxes(job, shadow)["norm.weight"]  # (the old engine's shard in the same box)
    kept = {"norm.weight": torch.full([hi - lo for lo, hi in box], 0.5)}
    seen = {}
    with active.registered():
        def companion():
            warm = FakeWorld.build_fake(9, layout, 1, "gloo", torch.device("cpu"))  # (a joiner's warm-up: an
            with warm.registered():  # equal mesh whose specs this thread's DTensor caches hold now)
                NativeEngine(adapter.recipe, job, warm, torch.device("cpu")).train_step()
            with shadow.registered_here():
                seen["companion"] = dist.get_rank()
                seen["prebuilt"] = adapter.prebuild(job, shadow, torch.device("cpu"), kept, spare)
        t = threading.Thread(target=companion)
        t.start()
        t.join()
        seen["training"] = dist.get_rank()
    assert (seen["companion"], seen["training"]) == (1, 3)
    pre = seen["prebuilt"]
    model = pre.engine.model if spare else pre.structure
    assert (pre.engine is not None) == bool(spare) and all(p.is_meta for p in model.parameters()) == (not spare)
    for p in model.parameters():  # laid out on the shadow's mesh, not on the warm-up's
        assert all("gen1" in g for g in getattr(p, "device_mesh", shadow.mesh())._dim_group_names), p
    assert pre.path == ("engine made before the pause" if spare else "structure made before the pause")
    if spare:
        assert set(pre.adopted) == (set() if fsdp(model) else {"norm.weight"})
        assert all(not t.any() for t in pre.storage.values())  # (touched: its pages are the process's now)
        assert set(pre.storage) | set(pre.adopted) == set(pre.engine.state)

    def fill(state):  # the transfer's part: a value per tensor, the same for both builds
        with torch.no_grad():
            for i, (name, t) in enumerate(sorted(state.items())):
                if name not in kept:
                    t.copy_(torch.arange(t.numel(), dtype=torch.float64).reshape(t.shape).to(t.dtype) / (i + 7))
                elif t.data_ptr() != kept[name].data_ptr():
                    t.copy_(kept[name])  # (the executor copies a kept shard it could not leave in place)
        return state

    with shadow.registered():
        try:
            built = [adapter.enter(job, shadow, torch.device("cpu"), fill, kept=k, prebuilt=p)  # (a kept shard each)
                     for p, k in ((pre, kept), (None, {n: t.clone() for n, t in kept.items()}))]
            assert pre.path == ("engine made before the pause" if spare else "structure made before the pause")
            if spare:
                assert built[0] is pre.engine
            a, b = (dict(e.model.named_parameters()) for e in built)
            laid = [{n: (getattr(p, "placements", None), p.shape) for n, p in x.items()} for x in (a, b)]
            assert laid[0] == laid[1]
            assert built[0].boxes == built[1].boxes
            assert [s.name for s in built[0].specs] == [s.name for s in built[1].specs]
            scalars = {"step": 4, "consumed_samples": 4 * job.train.global_batch, "seed": job.train.seed,
                       "optimizer": {"step": 4.0}, "lr": [1e-3]}
            for e in built:
                e.load_scalars(scalars)
            steps = [e.train_step() for e in built]
            assert steps[0].loss == steps[1].loss
            if FAKE_REDUCE_SCATTER_WRITES or parallel.dp == 1:  # (else the gradients are uninitialised memory)
                assert all(torch.equal(built[0].state[n], built[1].state[n]) for n in built[0].state)
            if pre.adopted:  # the kept shard's storage changed after Prepare: the engine made then is not used
                moved = {"norm.weight": kept["norm.weight"].clone()}
                again = adapter.enter(job, shadow, torch.device("cpu"), fill, kept=moved, prebuilt=pre)
                assert again is not pre.engine and pre.stale and pre.path.startswith("built at the switch")
                assert again.state["norm.weight"].data_ptr() == moved["norm.weight"].data_ptr()
        finally:
            forget_meshes()


UNSHARDED = " and its unsharded parameters"


@pytest.mark.parametrize("parallel,dtype,ahead", [
    (ParallelConfig(tp=2), "float32", "forward and backward and optimizer step"),
    (ParallelConfig(dp=2), "float32", "optimizer step and FSDP2's initialisation" + UNSHARDED),
    (ParallelConfig(tp=2, dp=2), "float32", "forward and backward and optimizer step and FSDP2's initialisation" + UNSHARDED),
    (ParallelConfig(tp=2, dp=2), "bfloat16",
     "forward and backward and optimizer step and FSDP2's initialisation" + UNSHARDED)])
def test_the_first_steps_sharding_is_worked_out_in_the_companion_and_changes_nothing(parallel, dtype, ahead,
                                                                                     monkeypatch):
    """The companion runs the new generation's first step's DTensor operators on the meta
    structure (``ahead.py``) into a table that the training thread takes at the switch: its first
    step then propagates nothing of its own (TP; FSDP2 over TP, its forward run with FSDP2's
    unsharded parameters standing in, in its compute dtype; FSDP-only, whose forward has no
    DTensor), and steps exactly as an engine entered without the table."""
    import dataclasses
    import threading

    from liver.world import sharding

    adapter = load_adapter(EXAMPLE)
    job = dataclasses.replace(job_of(hidden=8, heads=4, ffn=8, vocab=8), compute_dtype=dtype)
    cpu = torch.device("cpu")
    old = FakeWorld.build_fake(0, adapter.layout(job, ParallelConfig(tp=4)), 0, "gloo", cpu)
    new = FakeWorld.build_fake(1, adapter.layout(job, parallel), 0, "gloo", cpu)
    with old.registered():
        running = adapter.build(job, old, cpu)
        running.train_step()
        seen = {}

        def companion():
            with new.registered_here():
                seen["pre"] = adapter.prebuild(job, new, cpu, {}, 1 << 30)
        t = threading.Thread(target=companion)
        t.start()
        t.join()
    old.deactivate()
    pre = seen["pre"]
    assert pre.ahead["ahead"] == ahead and "ahead_error" not in pre.ahead, pre.ahead
    assert pre.sharding and all(p.grad is None for p in pre.engine.model.parameters())
    if ahead.endswith(UNSHARDED):  # what FSDP2's first all-gather makes once: made, its buffers' storage freed
        from torch.distributed.fsdp import FSDPModule

        from liver.engine.native.ahead import _param_groups
        made = [fp for m in pre.engine.model.modules() if isinstance(m, FSDPModule)
                for g in _param_groups(m) for fp in g.fsdp_params]
        assert made and all(hasattr(fp, "_unsharded_param") for fp in made)
        assert all(t.untyped_storage().size() == 0 for fp in made for t in fp.all_gather_outputs)

    def fill(state):
        with torch.no_grad():
            for i, (name, t) in enumerate(sorted(state.items())):
                t.copy_(torch.arange(t.numel(), dtype=torch.float64).reshape(t.shape).to(t.dtype) / (i + 7))
        return state

    scalars = {"step": 4, "consumed_samples": 4 * job.train.global_batch, "seed": job.train.seed,
               "optimizer": {"step": 4.0}, "lr": [1e-3]}
    from torch.distributed.tensor import DTensor
    prop, computed = DTensor._op_dispatcher.sharding_propagator, []
    propagate = prop.propagate_op_sharding_non_cached

    def seen(schema):  # (a propagation the training thread computes: not found in the table it holds)
        before = sharding.computed()
        out = propagate(schema)
        if sharding.computed() != before:
            computed.append(schema)
        return out
    monkeypatch.setattr(prop, "propagate_op_sharding_non_cached", seen)
    with new.registered():
        try:
            stats, states = [], []
            for p in (pre, None):  # with the companion's table; then built and propagated here
                e = adapter.enter(job, new, cpu, fill, prebuilt=p)
                e.load_scalars(scalars)
                stats.append(e.train_step())
                if p is pre:  # (what it does compute: the parameters' detach, as the engine takes them;
                    # operators whose float arguments differ, the learning rate and Adam's bias corrections,
                    # are found by their scalar-blind key, as DTensor's own cache finds them)
                    missed = [m for m in computed if str(m.op) != "aten.detach.default"]
                    assert not missed, missed
                    assert len(computed) == sharding.computed()
                computed.clear()
                states.append({n: t.clone() for n, t in e.state.items()})
            assert stats[0].loss == stats[1].loss
            if FAKE_REDUCE_SCATTER_WRITES or parallel.dp == 1:  # (else the gradients are uninitialised memory)
                assert stats[0].grad_norm == stats[1].grad_norm
                assert all(torch.equal(states[0][n], states[1][n]) for n in states[0])
        finally:
            forget_meshes()


def test_prebuilt_storage_is_made_only_where_the_spare_and_the_device_hold_it(monkeypatch):
    """All of it or none: over the spare, or the device short of memory now, the switch makes it."""
    from liver.engine.interface import Prebuilt, new_storage

    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=8)
    layout = adapter.layout(job, ParallelConfig(tp=2))
    specs, view, cpu = adapter.state_specs(job), adapter.view(job, layout), torch.device("cpu")
    made, wanted = new_storage(specs, view, 1, cpu, frozenset(), 1 << 30)
    assert wanted == sum(t.numel() * t.element_size() for t in made.values()) > 0
    assert all(not t.any() for t in made.values())  # (written: its pages are the process's now)
    assert new_storage(specs, view, 1, cpu, frozenset(), wanted - 1) == ({}, wanted)
    kept = frozenset(list(made)[:3])
    assert set(new_storage(specs, view, 1, cpu, kept, 1 << 30)[0]) == set(made) - kept

    def short(*a, **k):
        raise torch.OutOfMemoryError("no memory now")
    monkeypatch.setattr(torch, "zeros", short)
    assert new_storage(specs, view, 1, cpu, frozenset(), 1 << 30) == ({}, wanted)
    assert Prebuilt({}, object(), wanted).path == "structure made before the pause"
    assert Prebuilt({}, None, wanted).path == "built at the switch"


def test_recipe_job_file_runs_and_bad_input_is_refused_before_anything_starts(tmp_path, capsys):
    from liver.cli import main
    assert main(["run", "--config", CONFIG, "--set", "parallel=3,1,1", "--set", "gpus=3", "--run-dir",
                 str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "parallel.tp=3 does not divide model.num_heads=4" in err and "Traceback" not in err
    assert not (tmp_path / "a" / "logs").exists()


def liver_native(run_dir: Path, *args: str) -> dict:
    from test_run import liver
    return liver(run_dir, "--config", CONFIG, "--set", "checkpoint.every=0", *args)


def trained_alone(engine: str, job: JobConfig, steps: int) -> list:
    """The recipe ``engine`` trained ``steps`` steps in this process, on one rank: each step's stats."""
    from liver.engine.native.engine import NativeEngine
    from liver.world.world import World, make_store

    adapter = load_adapter(engine)
    store, _ = make_store()
    world = World.build(store, 0, adapter.layout(job, ParallelConfig()), 0, "gloo", torch.device("cpu"))
    world.activate()
    try:
        one = NativeEngine(adapter.recipe, job, world, torch.device("cpu"))
        return [one.train_step() for _ in range(steps)]
    finally:
        world.destroy()


EVENTS = [("reshape 1,1,2", "tp1pp1dp2"),                      # TP2 -> FSDP2
          ("reshape 2,1,1", "tp2pp1dp1"),                      # FSDP2 -> TP2
          ("scale-out 4 as 2,1,2", "tp2pp1dp2"),               # cold joiners; FSDP2 x TP2
          ("reshape 1,1,4", "tp1pp1dp4"),                      # 2-D -> FSDP4
          ("scale-in 2 deadline 60s as 1,1,2", "tp1pp1dp2"),   # FSDP4 -> FSDP2, a deadline
          ("reshape 1,2,1", "tp1pp2dp1")]                      # FSDP2 -> two pipeline stages


@pytest.mark.timeout(600)
def test_live_reshapes_of_a_users_model_equal_restart_through_dcp(tmp_path):
    from test_run import check_continuous
    events = tmp_path / "events.txt"
    events.write_text("".join(f"at step {3 if i == 0 else '+3'}: {a}\n" for i, (a, _) in enumerate(EVENTS)))
    # (steps: beyond what six events take however long a cold joiner's start is; the run ends 3 steps after the last)
    live = liver_native(tmp_path / "live", "--events", str(events), "--digest", "--end-after-events", "3",
                        "--steps", "100000")
    assert live["rc"] == 0
    assert [e["status"] for e in live["events"]] == ["done"] * len(EVENTS), [e["status"] for e in live["events"]]
    assert [e["new"] for e in live["events"]] == [n for _, n in EVENTS]
    for e in live["events"]:
        assert e["digest_equal"] is True, e
    assert live["events"][4]["deadline_met"] is True
    # FSDP2 -> TP2: the row halves that stay on their process are adopted by the TP model (no copy);
    # into FSDP2 the parameters are copied (its own padded buffers), their optimizer state adopted
    assert live["events"][1]["bytes_kept"] > 0 and live["events"][1]["bytes_kept_copied"] == 0
    assert 0 < live["events"][0]["bytes_kept_copied"] < live["events"][0]["bytes_kept"]
    for e in live["events"]:  # the new engine was made before the pause: its model, storage and optimizer
        assert e["build"] == "engine made before the pause", e
    total = live["steps"][-1]["step"]
    check_continuous(live, total)
    cuts = [e["last_old_step"] for e in live["events"]]
    events2 = tmp_path / "events2.txt"
    events2.write_text("".join(f"at step {c}: {a}\n" for c, (a, _) in zip(cuts, EVENTS)))
    restart = liver_native(tmp_path / "restart", "--events", str(events2), "--digest", "--steps", str(total),
                           "--mode", "restart-forked")  # (through DCP as "restart"; forked: faster)
    assert restart["rc"] == 0
    assert [e["last_old_step"] for e in restart["events"]] == cuts
    assert [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in live["steps"]] == \
        [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in restart["steps"]]


@pytest.mark.timeout(600)
def test_kill9_of_a_users_model_rank_recovers_from_the_dcp_checkpoint(tmp_path):
    import json

    from test_run import background, kill_and_recover, replays_as_restart, wait_for
    run_dir = tmp_path / "run"
    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    t, box = background(run_dir, "--config", CONFIG, "--events", str(empty), "--set", "parallel=1,1,2",
                        "--steps", "30", "--end-after-events", "-1", "--ckpt-every", "4",
                        "--set", "agent.slots=2")  # (no idle slot to take the lost rank's place: on one process)
    latest = run_dir / "ckpt" / "latest.json"
    wait_for(lambda: latest.exists() and json.loads(latest.read_text())["step"] >= 8, what="checkpoint 8")
    rep, rec = kill_and_recover(run_dir, t, box, proc=1)
    assert rec["status"] == "recovered" and rec["new"] == "tp1pp1dp1"
    # the header and report name the model that ran (the job file's shape), not the preset
    assert rep["model_description"].startswith("llama (2 layers, hidden 64, 4 heads, ffn 128, vocab 256, seq 32")
    assert rec["restored_step"] % 4 == 0 and rec["restored_step"] >= 8
    at_ckpt = [s for s in rep["steps"] if s["step"] == rec["restored_step"] and s["generation"] == 0]
    assert at_ckpt[-1]["digest"] == rec["digest_after"]  # the FSDP2 state, exactly, on one process
    assert rep["steps"][-1]["step"] == 30
    replays_as_restart(tmp_path, rep, rec, "1,1,2", 2, extra=("--config", CONFIG))


def test_the_example_does_not_import_the_reference_engine():
    text = (ROOT / "examples" / "llama.py").read_text()
    assert "liver.engine.reference" not in text and "import liver" not in text.replace("from liver.engine.native", "")
    assert len(text.splitlines()) <= 185  # ("about 150 lines": the model, its parallelize, recipe and loop)




@pytest.mark.timeout(600)
def test_a_users_persistent_buffers_move_with_the_state_live_and_through_dcp(tmp_path):
    """A model whose blocks hold persistent buffers that its forward changes (a running scale, a
    call counter: tests/recipes/buffered.py): they are part of the state (moved, checkpointed,
    digested), so live reshapes (TP2 -> FSDP2 -> two stages -> TP2) equal restarts through DCP."""
    from test_run import check_continuous
    engine = ("--set", f"engine={ROOT / 'tests' / 'recipes' / 'buffered.py'}:RECIPE")
    acts = ["reshape 1,1,2", "reshape 1,2,1", "reshape 2,1,1"]
    events = tmp_path / "events.txt"
    events.write_text("".join(f"at step {3 if i == 0 else '+3'}: {a}\n" for i, a in enumerate(acts)))
    live = liver_native(tmp_path / "live", *engine, "--events", str(events), "--digest", "--end-after-events", "3")
    assert live["rc"] == 0 and [e["status"] for e in live["events"]] == ["done"] * 3, live["events"]
    assert all(e["digest_equal"] is True for e in live["events"])
    total = live["steps"][-1]["step"]
    check_continuous(live, total)
    cuts = [e["last_old_step"] for e in live["events"]]
    events2 = tmp_path / "events2.txt"
    events2.write_text("".join(f"at step {c}: {a}\n" for c, a in zip(cuts, acts)))
    restart = liver_native(tmp_path / "restart", *engine, "--events", str(events2), "--digest", "--steps", str(total),
                           "--mode", "restart-forked")
    assert restart["rc"] == 0
    assert [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in live["steps"]] == \
        [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in restart["steps"]]


def test_persistent_buffers_are_logical_tensors_of_the_state():
    adapter = load_adapter(f"{ROOT}/tests/recipes/buffered.py:RECIPE")
    job = job_of(64, 4, 128, 256)
    specs = {s.name: s for s in adapter.state_specs(job)}
    assert specs["layers.0.decay.scale"].kind == "buffer" and specs["layers.0.decay.scale"].shape == (64,)
    assert specs["layers.1.decay.calls"].dtype == "int64" and specs["layers.1.decay.calls"].shape == ()


def test_a_recipe_file_imports_a_module_beside_it(tmp_path):
    """As Python does for a script it runs: the recipe's directory is on the import path (workers
    load the same file by the same absolute path)."""
    (tmp_path / "mymodels.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('mymodels_llama', {str(ROOT / 'examples' / 'llama.py')!r})\n"
        "llama = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(llama)\n"
        "class MyRecipe(llama.LlamaRecipe):\n    name = 'mine'\n")
    (tmp_path / "train.py").write_text("from mymodels import MyRecipe\nRECIPE = MyRecipe()\n")
    adapter = load_adapter(f"{tmp_path / 'train.py'}:RECIPE")
    assert adapter.name == "mine" and adapter.state_specs(job_of(64, 4, 128, 256))


def test_a_non_finite_loss_is_said_recorded_and_with_the_option_ends_the_job(tmp_path, capfd):
    from test_run import liver
    recipe = tmp_path / "nan.py"
    recipe.write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('nan_llama', {str(ROOT / 'examples' / 'llama.py')!r})\n"
        "llama = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(llama)\n"
        "class Diverges(llama.LlamaRecipe):\n"
        "    def criterion(self, logits, targets):\n"
        "        return super().criterion(logits, targets) * float('nan')\n"
        "RECIPE = Diverges()\n")
    none = tmp_path / "none.txt"
    none.write_text("# no events\n")
    rep = liver(tmp_path / "run", "--config", CONFIG, "--set", f"engine={recipe}:RECIPE", "--events", str(none),
                "--steps", "200", "--end-after-events", "-1", "--digest", "switch",
                "--set", "controller.stop_on_nonfinite_loss=true")
    assert rep["rc"] == 0
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "non-finite-loss"]
    assert "not finite" in rec["status"] and "the job ends here" in rec["status"]
    assert rep["steps"][-1]["step"] < 200  # ended early, not after every step
    assert "NON-FINITE LOSS" in capfd.readouterr().out  # (the step line, from the worker)


def test_layouts_whose_models_hold_other_tensors_are_refused_before_anything_starts(tmp_path, capsys):
    """A tie kept on one rank and broken by tensor parallelism (tests/recipes/tied.py): the TP
    layout's model holds a head the others lack, which no switch nor checkpoint could fill (the
    loss once jumped to 1e27). Refused before any process starts, naming the tensor."""
    from liver.cli import main
    adapter = load_adapter(f"{ROOT}/tests/recipes/tied.py:RECIPE")
    job = job_of(64, 4, 128, 256)
    adapter.layout(job, ParallelConfig(dp=2))  # FSDP2 keeps the tie: the same tensors
    with pytest.raises(ValueError, match=r"parallel=tp2pp1dp1: .*only under it: output.weight"):
        adapter.layout(job, ParallelConfig(tp=2))
    events = tmp_path / "events.txt"
    events.write_text("at step 3: reshape 2,1,1\n")
    assert main(["run", "--config", CONFIG, "--set", f"engine={ROOT / 'tests' / 'recipes' / 'tied.py'}:RECIPE",
                 "--set", "parallel=1,1,2", "--events", str(events), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "output.weight" in err and "Traceback" not in err and not (tmp_path / "run" / "logs").exists()


@pytest.mark.parametrize("parallel", ["2,1,2", "1,2,1"])
def test_the_first_state_is_the_models_own_initialisation_as_a_plain_run_makes_it(parallel):
    """On every rank of a layout, each tensor's box holds what a plain one-process
    ``torch.manual_seed(seed); Model(...)`` gives it: Kaiming-uniform weights and biases of
    ``nn.Linear``, LayerNorm's ones and zeros (tests/recipes/biased.py)."""
    from liver.engine.native.engine import NativeEngine
    adapter = load_adapter(f"{ROOT}/tests/recipes/biased.py:RECIPE")
    job = job_of(hidden=8, heads=4, ffn=12, vocab=8)
    torch.manual_seed(job.train.seed)
    plain = adapter.recipe.model(job).state_dict()  # eager, on CPU: the user's plain run
    layout = adapter.layout(job, ParallelConfig.parse(parallel))
    full = {n: torch.full_like(t, float("nan")) for n, t in plain.items()}
    for r in range(layout.size):
        world = FakeWorld.build_fake(0, layout, r, "gloo", torch.device("cpu"))
        with world.registered():
            try:
                e = NativeEngine(adapter.recipe, job, world, torch.device("cpu"), specs=adapter._specs(job, layout))
                for n, box in e.boxes.items():
                    full[n][tuple(slice(lo, hi) for lo, hi in box)] = e.state[n]
            finally:
                forget_meshes()
    assert {n: torch.equal(full[n], plain[n]) for n in plain} == {n: True for n in plain}
    b = plain["layers.0.feed_forward.w1.bias"]
    assert b.abs().max() > 0 and b.unique().numel() == b.numel()  # (drawn, not a constant)
    assert torch.equal(plain["layers.1.ffn_norm.bias"], torch.zeros(8))


def test_a_tensor_the_models_code_does_not_initialise_is_refused_naming_it():
    from torch import nn

    from liver.engine.native.init import initial_values

    class Scale(nn.Module):  # a parameter made from a value in __init__, no reset_parameters
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.gain = nn.Linear(2, 2), nn.Parameter(torch.ones(2))

    with torch.device("meta"):
        m = Scale()
    with pytest.raises(ValueError, match="tensor 'gain' is not initialised by the model's own code"):
        dict(initial_values(m, 0, None, {"lin.weight", "lin.bias", "gain"}))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("optimizer,dtype", [("SGD", "float32"), ("ADAGRAD", "float32"), ("NADAM", "bfloat16")])
def test_any_optimizers_state_moves_live_equal_to_restart_and_close_to_one_process(tmp_path, optimizer, dtype):
    """SGD's momentum, Adagrad's sums (from its own initial value), NAdam's moments and its 0-dim
    ``mu_product`` (in bf16 as TorchTitan trains: FSDP2's mixed precision, autocast without it):
    FSDP2 on two ranks, reshaped to TP2 from step 3 on, live and by restart through DCP: every step
    bit for bit (loss, gradient norm, digest); and both within float tolerance of the same recipe
    trained uninterrupted in one process."""
    from liver.config import jobfile

    recipe = f"{ROOT}/tests/recipes/biased.py:{optimizer}"
    events = tmp_path / "events.txt"
    events.write_text("at step 3: reshape 2,1,1\n")
    common = ("--set", f"engine={recipe}", "--set", "parallel=1,1,2", "--set", f"job.compute_dtype={dtype}")
    # (the live run ends 4 steps after its handoff, however long Prepare took on a loaded machine)
    live = liver_native(tmp_path / "live", *common, "--events", str(events), "--steps", "100000",
                        "--end-after-events", "4")
    assert live["rc"] == 0
    assert [e["status"] for e in live["events"]] == ["done"] and live["events"][0]["digest_equal"] is True
    n = live["steps"][-1]["step"]
    cut = tmp_path / "cut.txt"
    cut.write_text(f"at step {live['events'][0]['last_old_step']}: reshape 2,1,1\n")
    restart = liver_native(tmp_path / "restart", *common, "--events", str(cut), "--mode", "restart-forked",
                           "--steps", str(n), "--end-after-events", "-1")
    assert restart["rc"] == 0

    def steps(r):
        return [(s["step"], s["parallel"], s["loss"], s["grad_norm"], s["digest"]) for s in r["steps"]]

    assert steps(live) == steps(restart) and len(steps(live)) == n
    alone = [x.loss for x in trained_alone(recipe, jobfile.load(CONFIG, [{"job": {"compute_dtype": dtype}}]).job, n)]
    assert [s["loss"] for s in live["steps"]] == pytest.approx(alone, rel=1e-4 if dtype == "float32" else 2e-2)
    assert alone[-1] < alone[0]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("parallel, dtype, rel", [
    ("1,2,1", "float32", 1e-4),
    # (TP x FSDP2: the gradients' 2-D shards, FSDP2's _StridedShard, are summed over both
    # dimensions; torch 2.13 says is_shard() False for them, and their norm came out 7% short)
    ("2,1,2", "float32", 1e-4),
    # (FSDP2 computing in bfloat16 within pipeline stages: activations bfloat16 where the stages'
    # buffers are float32; sent as they were, every loss was NaN)
    ("1,2,2", "bfloat16", 5e-3)])
def test_pipeline_stages_train_the_model_a_single_stage_trains(tmp_path, parallel, dtype, rel):
    """Pipeline stages (torch.distributed.pipelining) and 2-D shards: every stage's gradients, the
    first's too (the activations between stages carry them back), every shard's in the norm, so the
    losses and gradient norms of the steps follow those of the same model on one process in float32
    (within float tolerance; bfloat16's, within its precision)."""
    from liver.config import jobfile

    empty = tmp_path / "none.txt"
    empty.write_text("# no events\n")
    gpus = str(eval(parallel.replace(",", "*")))
    run = liver_native(tmp_path / "pp", "--set", f"parallel={parallel}", "--set", f"gpus={gpus}",
                       "--set", f"job.compute_dtype={dtype}", "--events", str(empty), "--steps", "4",
                       "--end-after-events", "-1")
    assert run["rc"] == 0
    cfg = jobfile.load(CONFIG)
    alone = trained_alone(cfg.engine, cfg.job, 4)
    assert [s["loss"] for s in run["steps"]] == pytest.approx([s.loss for s in alone], rel=rel)
    assert [s["grad_norm"] for s in run["steps"]] == pytest.approx([s.grad_norm for s in alone], rel=10 * rel)


def test_pipeline_activations_cross_in_the_dtype_fsdp2_computes_them_in():
    """FSDP2 computing a stage in bfloat16 makes its outputs bfloat16: the activations between
    stages are received (and so sent) in bfloat16, half the bytes of float32 (they crossed as
    float32, widened, before; the losses, gradient norms and digests of a bf16 reshape to
    tp1pp2dp2 came out the same bit for bit both ways). Where FSDP2 does not cast (float32, or no
    data-parallel sharding: the example's autocast, whose residual stream stays float32), as the
    model makes them. Every stage of every stage's rank works the same dtypes out."""
    from dataclasses import replace

    from liver.engine.native.engine import fsdp_compute_dtype, stage_activations, structure

    adapter = load_adapter(EXAMPLE)
    inputs = torch.zeros(2, 8, dtype=torch.long)
    for dtype, parallel, wire in (("bfloat16", ParallelConfig(pp=2, dp=2), torch.bfloat16),
                                  ("bfloat16", ParallelConfig(tp=2, pp=2, dp=2), torch.bfloat16),
                                  ("bfloat16", ParallelConfig(pp=2), torch.float32),
                                  ("float32", ParallelConfig(pp=2, dp=2), torch.float32)):
        job = replace(job_of(hidden=8, heads=4, ffn=8, vocab=8), compute_dtype=dtype)
        lay = adapter.layout(job, parallel)
        for rank in range(lay.size):
            world = FakeWorld.build_fake(0, lay, rank, "gloo", torch.device("cpu"))
            with world.registered():
                try:
                    cast = fsdp_compute_dtype(structure(adapter.recipe, job, world))
                finally:
                    forget_meshes()
            x, y = stage_activations(adapter.recipe, job, lay, world.coord.pp, inputs, cast)
            assert (x.dtype if world.coord.pp else y.dtype) == wire, (dtype, parallel.short(), rank, x.dtype, y.dtype)


def test_the_examples_optimizer_never_mixes_dtensors_and_tensors_in_one_fused_update():
    """Tensor parallelism without FSDP2 leaves the norms plain tensors beside DTensors, which one
    fused or foreach update refuses ("got mixed torch.Tensor and DTensor", found on one H200):
    there the example updates a parameter at a time; with FSDP2 every parameter is a DTensor."""
    from liver.engine.native.engine import structure

    adapter = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=8)
    for parallel, foreach in ((ParallelConfig(tp=2), False), (ParallelConfig(tp=2, dp=2), None),
                              (ParallelConfig(dp=2), None)):
        world = FakeWorld.build_fake(0, adapter.layout(job, parallel), 0, "gloo", torch.device("cpu"))
        with world.registered():
            try:
                group = adapter.recipe.optimizer(structure(adapter.recipe, job, world), job).param_groups[0]
                assert group["foreach"] is foreach and not group["fused"], (parallel, group["foreach"])
            finally:
                forget_meshes()


def test_the_companions_table_answers_both_of_dtensors_ways_in():
    """DTensor asks for a propagation two ways: where its C++ dispatch misses (torch 2.13) and
    through its Python cache first (torch 2.11's dispatch). A thread holding a filled table gets
    the table's answer either way, computing nothing; another thread's Python cache is untouched."""
    import threading

    from torch.distributed.tensor import DTensor, Shard

    from liver.world import sharding

    prop = DTensor._op_dispatcher.sharding_propagator
    world = FakeWorld.build_fake(0, load_adapter(EXAMPLE).layout(job_of(8, 4, 8, 8), ParallelConfig(dp=2)), 0, "gloo",
                                 torch.device("cpu"))
    seen, out = [], {}
    with world.registered():
        try:
            x = DTensor.from_local(torch.ones(4, 3), world.mesh()["dp"], [Shard(0)], run_check=False)
            compute = prop.propagate_op_sharding_non_cached
            prop.propagate_op_sharding_non_cached = lambda s: seen.append(s) or compute(s)
            try:
                forget_meshes()
                with sharding.filling() as table:
                    (x * 2.5).sum()
            finally:
                prop.propagate_op_sharding_non_cached = compute
            assert seen and all(s in table for s in seen)

            def other():  # (the training thread at the switch: the companion's table, its own caches cleared)
                forget_meshes(keep=table)
                out["answers"] = [prop.propagate_op_sharding(s) for s in seen] + \
                    [prop.propagate_op_sharding_non_cached(s) for s in seen]
                out["computed"] = sharding.computed()
            t = threading.Thread(target=other)
            t.start()
            t.join()
            assert out["computed"] == 0 and all(a is table[s] for a, s in zip(out["answers"], seen + seen))
        finally:
            forget_meshes()


OWN = f"{ROOT}/tests/recipes/own_config.py:RECIPE"  # a model of a configuration of its own (MLPConfig)


def test_a_recipes_own_model_configuration_is_filled_checked_and_priced_through_its_facts():
    """``[job.model]`` fills the recipe's own dataclass (a preset gives its training options, not
    its Llama shape); its layouts, the target choice and the cost model read the facts its engine
    gives (parameters and blocks counted on the model, width and tokens a sample from the recipe);
    a field it does not have, a value of the wrong type or range is refused naming the field."""
    import re

    from liver.config import jobfile
    from liver.policy import costs, target
    from liver.policy.workload import Workload
    from liver.topology.presets import PRESETS

    cfg = jobfile.build({"engine": OWN, "preset": "1b", "job": {"model": {"depth": 4, "width": 32}}})
    m = cfg.job.model
    assert type(m).__name__ == "MLPConfig" and (m.depth, m.width, m.context, m.vocab) == (4, 32, 8, 64)
    assert cfg.job.train == PRESETS["1b"].train
    with torch.device("meta"):
        plain = sum(p.numel() for p in cfg.adapter.recipe.model(cfg.job).parameters())
    facts = cfg.adapter.facts(cfg.job)
    assert (facts.params, facts.layers, facts.width, facts.seq_len) == (plain, 4, 32, 8)
    assert facts.flops_per_token == 6 * (plain - 64 * 32)  # (its own count: no attention, no matmul in the lookup)
    assert cfg.adapter.layout(cfg.job, ParallelConfig(pp=2, dp=2)).layers_per_stage == (2, 2)
    with pytest.raises(ValueError, match="exceeds the model's 4 layers"):
        cfg.adapter.layout(cfg.job, ParallelConfig(pp=8))
    hw = target.Hardware.named("cpu")
    chosen = target.choose(cfg.adapter, cfg.job, 4, hw)
    lay = cfg.adapter.layout(cfg.job, chosen)
    assert chosen.world_size == 4 and costs.step_time(Workload(cfg.adapter, cfg.job), lay, hw.costs) > 0
    for table, words in [({"num_layers": 8}, "job.model.num_layers: no such field; allowed: depth, width, context, vocab"),
                         ({"depth": "x"}, "job.model.depth='x': expected an integer"),
                         ({"depth": 0}, "model.depth=0: must be a positive integer")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            jobfile.build({"engine": OWN, "job": {"model": table}})


@pytest.mark.timeout(600)
def test_a_model_of_its_own_configuration_reshapes_live_into_stages_equal_to_restart(tmp_path):
    """The job file's model table of the recipe's own fields, through `liver run`: FSDP2 on two
    ranks reshaped into two pipeline stages (cut by the blocks its facts count), live and by
    restart through DCP, every step bit for bit."""
    from test_run import liver

    events = tmp_path / "events.txt"
    events.write_text("at step 3: reshape 1,2,1\n")
    common = ("--set", f"engine={OWN}", "--set", "parallel=1,1,2", "--set", "job.model.depth=4",
              "--set", "checkpoint.every=0")
    live = liver(tmp_path / "live", *common, "--events", str(events), "--steps", "100000", "--end-after-events", "3")
    assert live["rc"] == 0 and [e["status"] for e in live["events"]] == ["done"], live["events"]
    assert live["events"][0]["digest_equal"] is True and live["events"][0]["new"] == "tp1pp2dp1"
    assert live["model_description"].startswith("mlp (depth 4, width 16, context 8, vocab 64: ")
    cut = tmp_path / "cut.txt"
    cut.write_text(f"at step {live['events'][0]['last_old_step']}: reshape 1,2,1\n")
    n = live["steps"][-1]["step"]
    restart = liver(tmp_path / "restart", *common, "--events", str(cut), "--steps", str(n), "--end-after-events", "-1",
                    "--mode", "restart-forked")
    assert restart["rc"] == 0
    assert [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in live["steps"]] == \
        [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in restart["steps"]]


def test_the_last_pipeline_stages_outputs_are_left_to_the_loss():
    """torch 2.11 checked a last stage's outputs against the float32 metadata worked out on the
    meta device, and refused a user's bf16 logits under its loop's autocast after a scale-out on
    NCCL (bench/results/gpu-1x-netns-nccl-two-nodes); LiveR's stage leaves them to the loss, as
    later torch does; a stage that sends its outputs is checked as torch checks it."""
    from types import SimpleNamespace

    from torch.distributed.pipelining import PipelineStage

    from liver.engine.native.engine import _stage_class

    Stage = _stage_class()
    assert issubclass(Stage, PipelineStage) and _stage_class() is Stage
    assert Stage._validate_fwd_outputs(SimpleNamespace(is_last=True), (torch.zeros(2, dtype=torch.bfloat16),)) is None


def test_a_pipelined_users_model_checkpoints_beside_a_preparation_and_switches_out_of_its_stages(tmp_path):
    """Two pipeline stages from the start, a checkpoint at every step, and a reshape to FSDP2: the
    checkpoints written while the next generation prepares are whole, and the switch happens.
    (The companion works out each stage's tensors on a fake world; it once made that world the
    default group of the whole process while it did, so a checkpoint writer beside it took the
    wrong rank: a rank's write failed, its peer's waited, and no switch nor checkpoint came again.)"""
    events = tmp_path / "events.txt"
    events.write_text("at step 4: reshape 1,1,2\n")
    run = liver_native(tmp_path / "run", "--set", "parallel=1,2,1", "--set", "checkpoint.every=1",
                       "--events", str(events), "--digest", "switch", "--end-after-events", "6", "--steps", "400")
    assert run["rc"] == 0
    (e,) = run["events"]
    assert (e["status"], e["new"], e["digest_equal"]) == ("done", "tp1pp1dp2", True), e
    steps = run["steps"]
    assert not any(s["checkpoint_failures"] for s in steps), [s["checkpoint_error"] for s in steps]
    during = {s["checkpoint_step"] for s in steps if s["preparing"]} - {None}
    assert during and max(during) > 4, during  # written beside the preparation
    assert steps[-1]["parallel"] == "tp1pp1dp2" and steps[-1]["checkpoint_step"] > e["last_old_step"]
    # every step, before the switch and after it, as the same change made through a checkpoint makes it
    # (its loss bit for bit; digests at the switch only: one after every step moves the race this finds)
    at = tmp_path / "restart.txt"
    at.write_text(f"at step {e['last_old_step']}: reshape 1,1,2\n")
    restart = liver_native(tmp_path / "restart", "--set", "parallel=1,2,1", "--events", str(at),
                           "--steps", str(steps[-1]["step"]), "--end-after-events", "-1", "--mode", "restart-forked",
                           "--digest", "switch")
    assert restart["rc"] == 0 and restart["events"][0]["digest_after"] == e["digest_after"]
    assert [(s["step"], s["parallel"], s["loss"]) for s in steps] == \
        [(s["step"], s["parallel"], s["loss"]) for s in restart["steps"]]


def test_working_out_a_layouts_tensors_leaves_other_threads_default_group_alone(monkeypatch):
    """The meta build of a layout (``NativeAdapter.placed``: a fake world as the default group) is
    its own thread's: another thread (the training thread, a checkpoint writer) sees torch's
    default group as it was for the whole build."""
    import threading

    import torch.distributed.distributed_c10d as c10d

    from liver.engine.native import adapter as native_adapter

    a = load_adapter(EXAMPLE)
    job = job_of(hidden=8, heads=4, ffn=8, vocab=12, layers=3)
    inside, release, seen = threading.Event(), threading.Event(), {}
    real = native_adapter.build_model

    def build(*args, **kwargs):
        seen.setdefault("builder", c10d._world.default_pg)
        inside.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(native_adapter, "build_model", build)
    before = c10d._world.default_pg
    t = threading.Thread(target=lambda: a.placed(job, a.layout(job, ParallelConfig(pp=2))))
    t.start()
    try:
        assert inside.wait(30)
        seen["other"] = c10d._world.default_pg  # (this thread, while the other builds)
    finally:
        release.set()
        t.join(60)
    assert seen["builder"] is not None and seen["builder"] is not before  # the fake world, there
    assert seen["other"] is before and c10d._world.default_pg is before
