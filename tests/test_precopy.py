"""Pre-copy (liver/transfer/precopy.py, liver/runtime/mirror.py): what is mirrored, in which
slices (pure, over random plans), and live runs whose mirrored state, kept current by replaying
each step's update, equals bit for bit what a stop-and-restart computes, while the switch moves
only what was not mirrored."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from liver.engine.interface import load_adapter
from liver.engine.reference import ADAPTER
from liver.planner.plan import plan_transfer
from liver.topology import ParallelConfig
from liver.topology.presets import preset
from liver.transfer.precopy import choose

from test_run import check_continuous, liver

JOB = preset("tiny")
SPECS = ADAPTER.state_specs(JOB)


def _layouts(draw_parallel):
    return ADAPTER.layout(JOB, draw_parallel)


parallels = st.sampled_from([ParallelConfig(tp=t, pp=p, dp=d) for t in (1, 2) for p in (1, 2, 4) for d in (1, 2)
                             if t * p * d <= 8])


@settings(max_examples=300, deadline=None)
@example(old=ParallelConfig(pp=4), new=ParallelConfig(tp=2), extra=2, cap=1 << 17, slice_bytes=1 << 15, joiners=True)
@given(old=parallels, new=parallels, extra=st.integers(0, 3), cap=st.sampled_from([0, 1 << 14, 1 << 17]),
       slice_bytes=st.sampled_from([1, 1 << 15, 1 << 30, None]), joiners=st.booleans())
def test_mirrors_tile_the_moving_boxes_of_followers_within_the_cap_and_slices(old, new, extra, cap, slice_bytes,
                                                                              joiners):
    lo, ln = ADAPTER.layout(JOB, old), ADAPTER.layout(JOB, new)
    old_procs = list(range(lo.size))
    new_procs = list(range(max(0, ln.size - extra))) + list(range(100, 100 + min(extra, ln.size)))
    new_procs = new_procs[:ln.size]
    plan = plan_transfer(lo, ln, SPECS, old_procs, new_procs)
    followers = sorted(set(old_procs) | set(new_procs)) if joiners else old_procs
    pc = choose(plan, lambda n: True, cap, slice_bytes, to=followers if joiners else None)
    again = choose(plan, lambda n: True, cap, slice_bytes, to=followers if joiners else None)
    assert pc == again  # every process works out the same
    tasks = [t for t in plan.tasks if t.kind != "keep"]
    selected = [t for t in tasks if pc.selects(t)]
    # only boxes of processes that follow the steps, whole (every task into a mirrored box is
    # mirrored), never a keep
    assert all(t.dst_proc in followers for t in selected)
    keys = {(t.tensors, t.dst_proc) for t in selected}
    assert all(pc.selects(t) for t in tasks if (t.tensors, t.dst_proc) in keys)
    assert not any(pc.selects(t) for t in plan.tasks if t.kind == "keep")
    # every movable box of an old process is mirrored unless over the cap
    movable = {(t.tensors, t.dst_proc) for t in tasks if t.dst_proc in followers}
    assert movable == keys | set(pc.capped) and not keys & set(pc.capped)
    if cap:
        assert all(b <= cap for b in pc.mirror_bytes.values())
    else:
        assert not pc.capped
    # the bytes add up; the slices are disjoint whole layers in streaming order, each in budget
    # unless a single layer is larger
    assert pc.bytes_mirrored + pc.bytes_left == sum(t.nbytes for t in tasks)
    layers = [layer for s in pc.slices for layer in s]
    assert len(layers) == len(set(layers)) and set(layers) == {t.layer for t in selected}
    order = list(dict.fromkeys(t.layer for t in plan.tasks))
    assert layers == [x for x in order if x in set(layers)]
    if slice_bytes is None:
        assert len(pc.slices) == (1 if selected else 0)
    for s in pc.slices if slice_bytes is not None else ():
        if len(s) > 1:
            for p in {t.src_proc for t in selected} | {t.dst_proc for t in selected}:
                load = sum(t.nbytes for t in selected if t.layer in s and p in (t.src_proc, t.dst_proc))
                assert load <= slice_bytes


def equals_restart(tmp_path: Path, live: dict, actions: list[str], run, *args: str) -> None:
    """The live run's events again by stop-and-restart (``run``, forked), each cut at the step the live
    run switched: every step's loss and state digest the same, bit for bit."""
    total = live["steps"][-1]["step"]
    check_continuous(live, total)
    cuts = [e["last_old_step"] for e in live["events"]]
    events = tmp_path / "restart-events.txt"
    events.write_text("".join(f"at step {c}: {a}\n" for c, a in zip(cuts, actions)))
    restart = run(tmp_path / "restart", "--events", str(events), "--steps", str(total), "--mode", "restart-forked",
                  *args)
    assert restart["rc"] == 0
    assert [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in live["steps"]] == \
        [(s["step"], s["parallel"], s["loss"], s["digest"]) for s in restart["steps"]]


@pytest.mark.timeout(600)
def test_live_with_precopy_equals_restart_and_the_switch_moves_only_the_rest(tmp_path: Path):
    events = tmp_path / "events.txt"
    events.write_text("at step 3: reshape 1,2,2:3/1        # in place: every shard that moves, mirrored\n"
                      "at step +5: scale-in 2 as 2,1,1      # a notice: the survivors mirror what they take over\n"
                      "at step +5: scale-out 4 as 1,2,2     # cold joiners: theirs streams at the switch\n")
    # slices of 1 MiB: several a handoff; mirrors of at most 1 MiB a process: the rest streams at the switch
    common = ("--parallel", "2,1,2", "--gpus", "4", "--ckpt-every", "0", "--set", "prepare.precopy_slice_mib=1",
              "--set", "prepare.precopy_memory_mib=1")
    live = liver(tmp_path / "live", "--events", str(events), "--steps", "5000", "--end-after-events", "4",
                 "--precopy", *common)
    assert live["rc"] == 0
    assert [e["status"] for e in live["events"]] == ["done"] * 3
    for e in live["events"]:
        assert e["digest_equal"] is True, e
        pc = e["precopy"]
        assert pc["used"] and pc["bytes_precopied"] > 0 and pc["grad_bytes_per_step"] > 0, pc
        assert pc["mirrored_steps"] == pc["slices"] and pc["mirror_bytes"] <= 1 << 20, pc
    reshape, scale_in, scale_out = (e["precopy"] for e in live["events"])
    assert reshape["slices"] == 2
    # the switch moves only what was over the memory cap
    for pc in (reshape, scale_in, scale_out):
        assert pc["capped_shards"] > 0 and pc["bytes_streamed_at_switch"] > 0, pc
    # the cold joiners followed the old ranks' steps: their shards were mirrored too
    assert reshape["followers"] == scale_in["followers"] == 0 and scale_out["followers"] == 2, scale_out
    equals_restart(tmp_path, live, ["reshape 1,2,2:3/1", "scale-in 2 as 2,1,1", "scale-out 4 as 1,2,2"], liver, *common)


NATIVE = [("reshape 1,1,2", "tp1pp1dp2"),                  # TP2 -> FSDP2: every moving shard mirrored
          ("scale-in 1 as 1,1,1", "tp1pp1dp1"),            # a notice: the survivor mirrors the leaver's half
          ("scale-out 2 as 1,2,1", "tp1pp2dp1"),           # a cold joiner follows the steps: its stage mirrored
          ("reshape 2,1,1", "tp2pp1dp1")]                  # two pipeline stages -> TP2, in place


@pytest.mark.timeout(600)
def test_a_users_model_and_optimizer_mirrored_live_equal_restart(tmp_path: Path):
    """The example recipe (examples/llama.py): its own AdamW made again over the mirror's shards
    replays each step's update; live with pre-copy equals stop-and-restart through DCP."""
    from test_native import liver_native
    events = tmp_path / "events.txt"
    events.write_text("".join(f"at step {3 if i == 0 else '+4'}: {a}\n" for i, (a, _) in enumerate(NATIVE)))
    # --connect boundary (NCCL's default, here on gloo): each slice is copied at its boundary
    common = ("--set", "prepare.precopy_slice_mib=1", "--set", "parallel=2,1,1", "--gpus", "2", "--connect", "boundary")
    live = liver_native(tmp_path / "live", "--events", str(events), "--digest", "--end-after-events", "3",
                        "--steps", "100000", "--precopy", *common)
    assert live["rc"] == 0
    assert [e["new"] for e in live["events"]] == [n for _, n in NATIVE], [e["status"] for e in live["events"]]
    for i, e in enumerate(live["events"]):
        assert e["digest_equal"] is True, e
        pc = e["precopy"]
        assert pc["used"] and pc["bytes_precopied"] > 0 and pc["grad_bytes_per_step"] > 0, pc
        assert pc["bytes_streamed_at_switch"] == 0 and pc["followers"] == (1 if i == 2 else 0), pc
    equals_restart(tmp_path, live, [a for a, _ in NATIVE], liver_native, "--digest", *common)


class _Recorder:
    """A stand-in for the runtime's mirror in one process: what the engine hands it at its update."""

    def __init__(self) -> None:
        self.got = None

    def before_update(self) -> None:
        pass

    def after_update(self, grads, update) -> None:
        self.got = ({n: g.clone() for n, g in grads.items()}, update)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a GPU"))])
@pytest.mark.parametrize("name", ["SGD", "ADAGRAD", "NADAM", "FUSED_ADAMW"])
def test_a_recipes_optimizer_replayed_on_cut_shards_gives_its_own_bits_or_is_refused_with_why(name, device):
    """The engine's state after a step, against its state before the step cut in uneven pieces (each
    tensor in two rows' worth and the rest) and the step's update replayed on each piece: the same
    bits, or ``replay`` refuses with the reason (torch's fused AdamW on a CPU rounds by position; on
    a GPU it does not: replayed there)."""
    import torch

    from liver.engine.interface import NotReplayable
    from liver.engine.native.engine import NativeEngine
    from liver.world.world import World, make_store
    from test_native import ROOT, job_of

    adapter = load_adapter(f"{ROOT}/tests/recipes/biased.py:{name}")
    job = job_of(32, 4, 64, 64)
    store, _ = make_store()
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    world = World.build(store, 0, adapter.layout(job, ParallelConfig()), 0, "nccl" if device == "cuda" else "gloo", dev)
    world.activate()
    try:
        engine = NativeEngine(adapter.recipe, job, world, dev)
        engine.train_step()  # (the optimizer makes its state)
        try:
            replay = adapter.replay(job, dev, engine)
        except NotReplayable as why:
            assert name == "FUSED_ADAMW" and device == "cpu" and "fused=True" in str(why), why
            return
        assert name != "FUSED_ADAMW" or device == "cuda"
        before = {n: t.clone() for n, t in engine.state.items()}
        engine.mirror = rec = _Recorder()
        engine.train_step()
        grads, update = rec.got
        params = [n for n in grads if replay.replayable(n)]
        assert params and all(replay.replayable(f"{n}.{k}") for n in params for k in engine.kinds.keys)
        for cut in (0, 2):  # two pieces of every tensor along its first dimension (a scalar-like one whole)
            for part in (slice(None, cut), slice(cut, None)) if cut else (slice(None),):
                shards = {n: t[part].clone() if t.dim() else t.clone() for n, t in before.items()}
                replay(shards, {n: grads[n][part] if grads[n].dim() else grads[n] for n in params}, update)
                for n in params:
                    for key in ("", *(f".{k}" for k in engine.kinds.keys)):
                        got, want = shards[n + key], engine.state[n + key]
                        assert torch.equal(got, want[part] if want.dim() else want), (name, n + key, cut)
    finally:
        world.destroy()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a GPU"))])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_reference_engines_update_replayed_on_cut_shards_gives_its_own_bits(device, dtype):
    """The reference engine (fp32 master state, AdamW; compute in ``dtype``): its state after a step
    against the state before it, cut in two uneven pieces, with the step's update replayed on each."""
    import dataclasses

    import torch

    from liver.engine.reference.trainer import Engine
    from liver.world.world import World, make_store

    job = dataclasses.replace(JOB, compute_dtype=dtype)
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    store, _ = make_store()
    world = World.build(store, 0, ADAPTER.layout(job, ParallelConfig()), 0, "nccl" if device == "cuda" else "gloo", dev)
    world.activate()
    try:
        engine = Engine(job, world, dev)
        for _ in range(2):
            engine.train_step()
        replay = ADAPTER.replay(job, dev, engine)
        before = {n: t.clone() for n, t in engine.state.items()}
        engine.mirror = rec = _Recorder()
        engine.train_step()
        grads, update = rec.got
        assert update.grad_scale <= 1.0 and update.step == 2
        for cut in (3, 1):
            for part in (slice(None, cut), slice(cut, None)):
                shards = {n: t[part].clone() for n, t in before.items()}
                replay(shards, {n: g[part] for n, g in grads.items()}, update)
                for n, t in shards.items():
                    assert torch.equal(t, engine.state[n][part]), (n, cut)
    finally:
        world.destroy()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", ["precopy:2:0",    # a cold joiner killed as it copies its first slice
                                   "precopy:1:1"])   # an old rank killed right after its first mirrored update
def test_a_process_lost_while_mirroring_leaves_the_job_training_and_nothing_lost(tmp_path, monkeypatch, fault):
    """A pre-copy's peer lost: its group breaks under the others, who stall at the step they
    completed; the controller heals or recovers as for any lost process, and the job trains on: every
    step once, the state after it what it was."""
    from liver.host import faults
    monkeypatch.setenv(faults.ENV, fault)
    events = tmp_path / "events.txt"
    events.write_text("at step 6: scale-out 4 as 1,2,2\n")
    rep = liver(tmp_path / "run", "--parallel", "1,1,2", "--slots", "4", "--events", str(events), "--steps", "100000",
                "--end-after-events", "8", "--ckpt-every", "4", "--precopy")
    assert rep["rc"] == 0, rep
    # a joiner lost: the handoff is cancelled and re-planned on the slots left; an old rank lost: a
    # fail-stop, healed or recovered; either way the job ends its steps, each once
    first = rep["events"][0]
    if fault.startswith("precopy:2"):
        assert "died" in first["attempts"][0]["cancelled"] and first["status"] == "done", first
    else:
        assert any(e["event"]["kind"] == "fail-stop" for e in rep["events"]), [e["status"] for e in rep["events"]]
    check_continuous(rep, rep["steps"][-1]["step"])
    for e in rep["events"]:
        if e.get("digest_equal") is not None:
            assert e["digest_equal"] is True, e
