"""Sharing communicators between generations: every member of a group takes the same decision
(share or create) without talking, for any old and new layout and any placement of processes;
groups of the training thread never share with background work's groups; a shared communicator
outlives the generation that made it and is shut down by the last group that lets go."""

from datetime import timedelta

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from liver.topology import Layout, ModelConfig, ParallelConfig, TrainConfig
from liver.world import group as group_mod
from liver.world.group import Group
from liver.world.sharing import Sharing
from liver.world.world import World

MODEL = ModelConfig(num_layers=4, hidden_size=32, num_heads=4, ffn_size=64, vocab_size=64, seq_len=8)
CPU = torch.device("cpu")


class _FakePG:
    """Stands in for a communicator: the decision is what is tested here, not the traffic."""

    count = 0

    def __init__(self, name):
        _FakePG.count += 1
        self.group_name = name.replace("/", "_")


def _fake_create(store, name, members, my_rank, backend, device, timeout):
    rank = members.index(my_rank)
    if len(members) == 1:
        return group_mod.LocalGroup(name, members, 0, backend, device)
    return Group(name, members, rank, _FakePG(name), backend, device)


@st.composite
def handoffs(draw):
    def config():
        tp = draw(st.sampled_from([1, 2, 4]))
        pp = draw(st.sampled_from([1, 2, 4]))
        dp = draw(st.integers(1, 3))
        return ParallelConfig(tp=tp, pp=pp, dp=dp)

    old, new = config(), config()
    pool = list(range(old.world_size + new.world_size))
    old_procs = draw(st.permutations(pool))[:old.world_size]
    new_procs = draw(st.permutations(pool))[:new.world_size]
    if draw(st.booleans()):  # often the same processes (in-place reshape) or a subset/superset
        new_procs = (old_procs + [p for p in pool if p not in old_procs])[:new.world_size]
    return old, old_procs, new, new_procs


def _layout(p: ParallelConfig) -> Layout:
    return Layout(MODEL.num_layers, p, TrainConfig(global_batch=12 * p.dp, micro_batch=1))


@settings(max_examples=200, deadline=None)
@given(handoffs())
def test_every_member_takes_the_same_decision(monkeypatch_session, h):
    old, old_procs, new, new_procs = h
    decisions: dict[str, dict[int, tuple]] = {}  # group name -> process -> (shared?, its communicator's name)
    for proc in sorted(set(old_procs) | set(new_procs)):
        sharing = Sharing()
        if proc in old_procs:
            active = World.build(None, 0, _layout(old), old_procs.index(proc), cpu_groups=True, procs=old_procs)
            sharing = Sharing.of_active(active, old_procs)
        made = []
        if proc in new_procs:
            w = World.build(None, 1, _layout(new), new_procs.index(proc), cpu_groups=True, procs=new_procs,
                            sharing=sharing)
            made += w.every_group()
        members = sorted(set(old_procs) | set(new_procs))
        made.append(sharing.group(None, "liver/gen1/transfer", members, proc, "gloo", CPU, timedelta(1)))
        for g in made:
            if g.pg is not None:
                decisions.setdefault(g.name, {})[proc] = (g.inherited, g.pg.group_name)
    for name, by_proc in decisions.items():
        assert len(set(by_proc.values())) == 1, (name, by_proc)
    for name, by_proc in decisions.items():
        inherited, comm = next(iter(by_proc.values()))
        if comm.startswith("liver_gen1_cpu") or "cpu" in name:
            assert "cpu" in comm, (name, comm)  # background work's groups share only among themselves
        else:
            assert "cpu" not in comm, (name, comm)


@pytest.fixture(scope="module")
def monkeypatch_session():
    mp = pytest.MonkeyPatch()
    mp.setattr(Group, "create", staticmethod(_fake_create))
    yield mp
    mp.undo()


def test_reshape_on_the_same_processes_creates_no_training_communicator(monkeypatch_session):
    """tp2 -> dp2 on processes [0, 1]: the new World's groups over both processes and the
    transfer group take over the Active World's communicator."""
    old_procs = new_procs = [0, 1]
    before = _FakePG.count
    for proc in (0, 1):
        active = World.build(None, 0, _layout(ParallelConfig(tp=2)), proc, cpu_groups=True, procs=old_procs)
        made_for_old = _FakePG.count
        sharing = Sharing.of_active(active, old_procs)
        w = World.build(None, 1, _layout(ParallelConfig(dp=2)), proc, cpu_groups=True, procs=new_procs, sharing=sharing)
        t = sharing.group(None, "liver/gen1/transfer", [0, 1], proc, "gloo", CPU, timedelta(1))
        assert _FakePG.count == made_for_old  # nothing new
        assert w.all.inherited and w.dp.inherited and t.inherited and w.cpu_groups["all"].inherited
        assert w.all.pg is active.all.pg is t.pg
        assert w.cpu_groups["all"].pg is not w.all.pg
    assert _FakePG.count - before == 4  # per process: gen 0's "all" (= tp) and "cpu_all" (= cpu_tp)


def test_last_group_to_let_go_shuts_the_communicator():
    calls = []

    class _Backend:
        def shutdown(self):
            calls.append("shutdown")

    class _PG:
        group_name = "g"

        def _get_backend(self, device):
            return _Backend()

    a = Group("a", [0, 1], 0, _PG(), "nccl", CPU)
    b = a.share("b", [3, 4], inherited=True)
    assert b.rank == a.rank and b.pg is a.pg and b.members == [3, 4]
    comm = a.comm
    a.destroy()
    assert calls == [] and b.pg is not None
    b.destroy()
    assert calls == ["shutdown"]
    with pytest.raises(RuntimeError, match="already shut down"):
        comm.take()
