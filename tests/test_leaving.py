"""Which ranks leave a scale-in that names none (liver/policy/leaving.py), over random layouts
in-process: replicas where a set of them exists (found by brute force here), else no more bytes
than the most recently added slots would move."""

from __future__ import annotations

import itertools

from hypothesis import assume, given, settings, strategies as st

from liver.policy import heal
from liver.policy.leaving import choose_leaving
from liver.policy.target import Hardware, choose
from liver.engine.reference import ADAPTER
from liver.planner.plan import plan_transfer
from liver.topology import ParallelConfig
from liver.topology.presets import preset

JOB = preset("tiny")
SPECS = ADAPTER.state_specs(JOB)


def layouts():
    out = []
    for tp, pp, dp in itertools.product((1, 2), (1, 2, 4), (1, 2, 3, 4)):
        if 2 <= tp * pp * dp <= 8:
            try:
                out.append(ADAPTER.layout(JOB, ParallelConfig(tp=tp, pp=pp, dp=dp)))
            except ValueError:
                pass
    return out


LAYOUTS = layouts()


def covered(layout, procs, leaving) -> bool:
    return heal.uncovered(heal.surviving_view(layout, tuple(procs), leaving), SPECS) is None


@settings(max_examples=60, deadline=None)
@given(i=st.integers(0, len(LAYOUTS) - 1), data=st.data())
def test_replicas_leave_where_they_can_else_the_fewest_bytes(i, data):
    old = LAYOUTS[i]
    n = old.size
    k = data.draw(st.integers(1, n - 1))
    procs = [10 + r for r in range(n)]
    slots = data.draw(st.permutations(range(n)))
    slot_of = {p: s for p, s in zip(procs, slots)}.__getitem__
    try:
        new = ADAPTER.layout(JOB, choose(ADAPTER, JOB, n - k, Hardware.named("cpu")))
    except ValueError:  # no layout of the model for n - k GPUs: the event would be refused before
        assume(False)

    def moved(stay):
        return plan_transfer(old, new, SPECS, procs, stay).bytes_moved

    got = choose_leaving(old, procs, k, SPECS, slot_of, moved)
    assert len(got.procs) == k == len(set(got.procs)) and set(got.procs) <= set(procs)
    safe_exists = any(covered(old, procs, list(c)) for c in itertools.combinations(procs, k))
    assert got.replicas == safe_exists
    if safe_exists:
        assert covered(old, procs, got.procs)
    else:
        recent = sorted(procs, key=slot_of, reverse=True)[:k]
        stay = lambda leave: [p for p in procs if p not in leave]  # noqa: E731
        assert moved(stay(got.procs)) <= moved(stay(recent))


def test_from_two_stages_with_two_replicas_one_rank_of_each_stage_leaves_not_a_whole_stage():
    """The case that turned a lossless drop into a rollback: tp1pp2dp2, 2 of 4 leave, the slots
    added last being ranks 2 and 3 (all of one stage under the pipeline-major order)."""
    old = ADAPTER.layout(JOB, ParallelConfig(tp=1, pp=2, dp=2))
    procs = [0, 1, 2, 3]
    got = choose_leaving(old, procs, 2, SPECS, lambda p: p, lambda stay: 0)
    assert got.replicas and covered(old, procs, got.procs)
    stages = {old.coord(p).pp for p in got.procs}
    assert stages == {0, 1}, got


def test_a_count_outside_the_job_is_refused_naming_it():
    import pytest
    old = LAYOUTS[0]
    with pytest.raises(ValueError, match="leaving=.*allowed 1 to"):
        choose_leaving(old, list(range(old.size)), old.size, SPECS, lambda p: p, lambda stay: 0)
