"""The training loop's protocol (liver/engine/loop.py): LiveR's iterations as a loop sees them.

In-process: the iterator against a driver that records what the worker would do (the boundary
after each step, a stall on a broken collective and the iteration run again, the engine swapped
by a switch, the job left), and a user's own loop (examples/llama.py's ``loop``) against the
recipe's ``train_step``: the same losses, norms and state, bit for bit, on a real one-rank World
and on fake Worlds of TP2, FSDP2 and two pipeline stages. The distributed paths of the user's
loop (live reshapes, restarts, kill -9) are test_native.py's: the example's recipe runs its loop.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import torch

from liver.engine.interface import StepStats, load_adapter
from liver.engine.native.recipe import Recipe
from liver.engine.loop import LoopError, Step, Steps
from liver.topology import ParallelConfig
from liver.world.fake import FakeWorld
from liver.world.world import World, make_store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = f"{ROOT}/examples/llama.py:RECIPE"
BROKEN = "Connection closed by peer [127.0.0.1]:1234"


class CountingEngine:
    def __init__(self, step: int = 0, name: str = "a") -> None:
        self.step, self.name = step, name
        self.grads = False  # a gradient held (an attempt's backward ran)
        self.log: list[str] = []

    def train_step(self) -> StepStats:
        assert not self.grads, "an iteration began with gradients held"
        self.step += 1
        return StepStats(self.step, 1.0 / self.step, 0.0, 0.0, 0.0, 0.0)

    def drop_grads(self) -> None:
        self.grads = False
        self.log.append("drop")


class Driver:
    def __init__(self, engine, total: int, stallable: bool = True) -> None:
        self.engine, self.total_steps, self.stallable = engine, total, stallable
        self.after: list[tuple[str, int]] = []
        self.stalls: list[str] = []
        self.on_step = {}  # step -> what the boundary after it does

    def after_step(self, st: StepStats) -> None:
        self.after.append((self.engine.name, st.step))
        action = self.on_step.get(st.step)
        if action == "switch":
            self.engine = CountingEngine(self.engine.step, "b")
        elif action == "leave":
            self.engine = None

    def can_stall(self) -> bool:
        return self.stallable

    def stall(self, err: BaseException) -> None:
        self.stalls.append(str(err))
        grads = self.engine.grads  # (a heal adopts the survivor's tensors, gradients and all)
        self.engine = CountingEngine(self.engine.step, "healed")
        self.engine.grads = grads


def test_every_iteration_is_followed_by_its_boundary_across_a_switch_until_the_last_step():
    d = Driver(CountingEngine(), 6)
    d.on_step[2] = "switch"
    seen = []
    for step in Steps(d):
        with step:
            seen.append((step.engine.name, step.number))
            step.run()
    assert seen == [("a", 1), ("a", 2), ("b", 3), ("b", 4), ("b", 5), ("b", 6)]
    assert d.after == seen


def test_a_peer_lost_mid_iteration_is_a_stall_then_the_same_iteration_again_on_the_healed_engine():
    d = Driver(CountingEngine(), 4)
    failed = []
    seen = []
    for step in Steps(d):
        with step:
            seen.append((step.engine.name, step.number))
            if step.number == 3 and not failed:
                failed.append(True)
                step.engine.grads = True  # its backward ran, its reduction broke
                raise RuntimeError(BROKEN)  # (the state did not move: the optimizer had not stepped)
            step.run()
    assert d.stalls == [BROKEN]
    assert seen == [("a", 1), ("a", 2), ("a", 3), ("healed", 3), ("healed", 4)]
    assert [s for _, s in d.after] == [1, 2, 3, 4]


def test_errors_that_are_no_lost_peer_end_the_loop_and_so_does_a_stall_where_none_can_be_healed():
    with pytest.raises(ZeroDivisionError):
        for step in Steps(Driver(CountingEngine(), 3)):
            with step:
                1 / 0
    with pytest.raises(RuntimeError, match="shape mismatch"):
        for step in Steps(Driver(CountingEngine(), 3)):
            with step:
                raise RuntimeError("shape mismatch")
    with pytest.raises(RuntimeError, match="Connection closed"):
        for step in Steps(Driver(CountingEngine(), 3, stallable=False)):
            with step:
                raise RuntimeError(BROKEN)
    with pytest.raises(RuntimeError, match="Connection closed"):  # outside `with`: the process ends
        for step in Steps(Driver(CountingEngine(), 3)):
            raise RuntimeError(BROKEN)


def test_an_iteration_without_a_step_taken_is_refused_naming_what_to_call_and_leaving_ends_the_loop():
    with pytest.raises(LoopError, match=r"step 1: .*step.run\(\) or step.done"):
        for step in Steps(Driver(CountingEngine(), 3)):
            with step:
                pass
    d = Driver(CountingEngine(), 10)
    d.on_step[2] = "leave"
    assert [s.number for s in Steps(d) if s.run()] == [1, 2]
    assert isinstance(next(iter(Steps(Driver(CountingEngine(), 1)))), Step)


# ---- a user's own loop against the recipe's train_step ------------------------------------------

class OneRankDriver:
    def __init__(self, engine, total: int) -> None:
        self.engine, self.total_steps, self.stats = engine, total, []

    def after_step(self, st: StepStats) -> None:
        self.stats.append((st.step, st.loss, st.grad_norm, st.lr))

    def can_stall(self) -> bool:
        return False

    def stall(self, err: BaseException) -> None:
        raise err


def state_hash(engine) -> str:
    h = hashlib.sha256()
    for name in sorted(engine.state):
        h.update(name.encode())
        h.update(engine.state[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(adapter, job, world, steps: int, own_loop: bool):
    engine = adapter.build(job, world, torch.device("cpu"))
    d = OneRankDriver(engine, steps)
    if own_loop:
        adapter.drive(Steps(d, adapter.make_step))
    else:
        Recipe.loop(adapter.recipe, Steps(d, adapter.make_step))  # LiveR's loop: the recipe's train_step
    return d.stats, state_hash(engine), engine.scalars()


@pytest.mark.parametrize("parallel", [ParallelConfig(), ParallelConfig(tp=2), ParallelConfig(dp=2),
                                      ParallelConfig(pp=2)], ids=lambda p: p.short())
def test_the_examples_own_loop_equals_the_recipes_train_step_bit_for_bit(parallel):
    torch.set_num_threads(1)
    adapter = load_adapter(EXAMPLE)
    job = adapter.rehearsal_job()
    layout = adapter.layout(job, parallel)
    out = []
    for own in (True, False):
        if layout.size == 1:  # a real World of one rank (its groups are real, of one)
            store, _ = make_store()
            world = World.build(store, 0, layout, 0, "gloo", torch.device("cpu"))
            world.activate()
            try:
                out.append(run(adapter, job, world, 4, own))
            finally:
                world.destroy()
        else:  # rank 0 of a larger layout, every collective answered locally (its code paths)
            world = FakeWorld.build_fake(0, layout, 0, "gloo", torch.device("cpu"))
            with world.registered():
                out.append(run(adapter, job, world, 4, own))
    (own_stats, own_hash, own_scalars), (ref_stats, ref_hash, ref_scalars) = out
    assert [s[0] for s in own_stats] == [1, 2, 3, 4]
    assert own_stats == ref_stats and own_hash == ref_hash and own_scalars == ref_scalars


def test_a_pipeline_helper_on_a_generation_without_stages_is_refused_naming_the_layout():
    adapter = load_adapter(EXAMPLE)
    job = adapter.rehearsal_job()
    store, _ = make_store()
    world = World.build(store, 0, adapter.layout(job, ParallelConfig()), 0, "gloo", torch.device("cpu"))
    world.activate()
    try:
        step = adapter.make_step(adapter.build(job, world, torch.device("cpu")))
        assert not step.pipelined and step.inputs.is_contiguous()
        with pytest.raises(LoopError, match=r"parallel.pp=1"):
            step.schedule_step()
    finally:
        world.destroy()


def test_a_cold_joiners_warm_up_runs_the_recipes_own_loop_on_the_mock_world():
    from liver.engine.native.adapter import NativeAdapter
    from liver.runtime.mock import warm_up

    base = type(load_adapter(EXAMPLE).recipe)
    seen = []

    class Counting(base):
        def loop(self, steps):
            for step in steps:
                seen.append(step.number)
                with step:
                    step.run()

    adapter = NativeAdapter(Counting())
    job = adapter.rehearsal_job()
    engine = warm_up(adapter, job, adapter.layout(job, ParallelConfig(tp=2)), 1, "gloo", torch.device("cpu"), 2)
    assert seen == [1, 2] and engine.step == 2


class _Store:
    """The job's store as ``Member.stall`` uses it."""

    def __init__(self):
        self.kv = {}

    def set(self, k, v):
        self.kv[k] = v

    def check(self, keys):
        return all(k in self.kv for k in keys)


def test_a_switch_broken_half_streamed_stalls_for_the_controller_without_a_digest_of_its_state():
    """A peer lost mid-transfer: the switch's error reaches the loop after the switch has let go
    (``_switching`` is back to False), so the process stalls, staying alive for the controller's
    recovery from the checkpoint on its slot; it reports no part of a digest of the shards it
    streamed away (before, hashing them raised KeyError and the process died with its peer, and
    the job with both)."""
    import json
    from types import SimpleNamespace

    from liver.runtime.member import Member

    def released(*_):
        raise KeyError("embed.weight")  # what hashing a half-streamed engine's state does

    m = Member.__new__(Member)
    m._switching, m._half_streamed = False, False
    broken = RuntimeError("Connection closed by peer")

    def transfer_breaks(*_):
        raise broken

    m._switch_now = transfer_breaks
    with pytest.raises(RuntimeError):
        m._switch(None, {})
    m.engine = SimpleNamespace(world=SimpleNamespace(generation=3, abort=lambda: None, interrupt=lambda ports: 0,
                                                     all=SimpleNamespace(size=2)),
                               step=7, scalars=released, state={})
    m._store_port = 0
    assert m.can_stall()
    m.companion, m.ckpt, m.store, m.proc, m.digest = None, SimpleNamespace(abandon=lambda: None), _Store(), 0, "switch"
    m.config = SimpleNamespace(prepare=SimpleNamespace(group_timeout_s=0.05))
    with pytest.raises(RuntimeError, match="Connection closed"):
        m.stall(broken)  # no heal comes (the controller recovers a broken switch from the checkpoint)
    (report,) = [json.loads(v) for k, v in m.store.kv.items() if k.startswith("stalled/3/")]
    assert report["step"] == 7 and report["hashes"] is None and report["scalars"] is None


def test_a_checkpoint_write_broken_with_its_generation_is_abandoned_not_a_failed_checkpoint(monkeypatch, tmp_path):
    """A peer lost while a periodic checkpoint is written: the survivor's stall breaks the
    generation's groups, and the write, blocked on them, fails at once ("Group ... is not
    registered"). Its checkpointer abandons it before the groups break, so the write takes itself
    for abandoned: no failed checkpoint is counted or reported (a fresh clone's run reported one
    after every third heal, the write's thread having failed before the stall abandoned it)."""
    import threading
    from types import SimpleNamespace

    import liver.checkpoint.periodic as periodic
    from liver.runtime.member import Member

    groups_broken, write_ended = threading.Event(), threading.Event()

    def save(*_, **__):  # DCP's collective, blocked on the lost peer until the groups break
        try:
            groups_broken.wait(10)
            raise ValueError("Group <ProcessGroup> is not registered, please create group with "
                             "torch.distributed.new_group API")
        finally:
            write_ended.set()

    monkeypatch.setattr(periodic.dcp, "save", save)
    monkeypatch.setattr(periodic, "_state_dict", lambda engine, snap, cpu: snap)

    def abort():  # the write's thread fails on the broken groups before the stall goes on
        groups_broken.set()
        write_ended.wait(10)
        time.sleep(0.05)

    layout = SimpleNamespace(size=2, parallel=SimpleNamespace(to_dict=lambda: {"tp": 1, "pp": 1, "dp": 2}))
    world = SimpleNamespace(generation=3, rank=1, layout=layout, cpu_groups={"all": SimpleNamespace(pg=None)},
                            abort=abort, interrupt=lambda ports: 0, all=SimpleNamespace(size=2))
    engine = SimpleNamespace(world=world, step=10, state={"w": torch.ones(2)}, scalars=lambda: {})
    ckpt = periodic.PeriodicCheckpointer(tmp_path / "ckpt", every=5, proc=1)
    assert ckpt.start(engine) and ckpt.busy()

    m = Member.__new__(Member)
    m._switching, m._half_streamed = False, False
    m.engine, m.companion, m.ckpt, m.store, m.proc, m.digest = engine, None, ckpt, _Store(), 1, None
    m._store_port = 0
    m.config = SimpleNamespace(prepare=SimpleNamespace(group_timeout_s=0.05))
    broken = RuntimeError("Connection closed by peer")
    with pytest.raises(RuntimeError, match="Connection closed"):
        m.stall(broken)  # (no heal comes here)
    assert write_ended.is_set()
    assert ckpt.failures == 0 and ckpt.error is None, ckpt.error
    assert ckpt.standing()["checkpoint_failures"] == 0
