"""The worker's boundary decision (runtime/boundary.py), in-process: every rule over random cuts
and rank states, and the same decision on every rank that sees the same cut."""

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from liver.protocol.cut import Cut
from liver.runtime.boundary import Action, Local, after_force, decide

small = st.integers(0, 3)
cuts = st.builds(Cut, wanted=small, ready_min=small, ready_max=small, stop_at=st.integers(0, 6), force=small,
                 end_at=st.integers(0, 6), ckpt_busy=st.integers(0, 1), built_min=small, built_max=small,
                 precopy_min=st.integers(0, 2), precopy_max=st.integers(0, 2))
locals_ = st.builds(Local, step=st.integers(0, 6), generation=st.integers(0, 2), preparing=small,
                    built=st.booleans(), ready=st.booleans(), defer_connect=st.booleans(),
                    checkpoint_due=st.booleans(), precopied=st.integers(0, 2))


@settings(max_examples=3000, deadline=None)
@given(cut=cuts, me=locals_)
def test_every_rule_of_the_boundary(cut, me):
    a = decide(cut, me)
    if cut.stop_at and me.step >= cut.stop_at:
        assert a == Action(stop=True)  # restart mode's stop: nothing else happens at that boundary
        return
    assert a.end_at == cut.end_at
    assert a.abandon == (me.preparing != 0 and cut.wanted != me.preparing)
    still = 0 if a.abandon else me.preparing
    assert sum(map(bool, (a.prepare, a.force, a.connect))) <= 1
    if a.prepare:
        assert not still and a.prepare == cut.wanted > me.generation
    elif not still and cut.wanted > me.generation:
        raise AssertionError("a wanted generation was not prepared")
    if a.force:
        assert still and cut.force == still and not cut.switch_to
    if a.connect:
        assert still and me.defer_connect and me.built and not me.ready and cut.connect_now == still
    switchable = bool(still) and not a.force and cut.switch_to == still
    # a pre-copy's slice at every boundary where all are ready, until all are copied, only where every
    # rank has the same slices (one without a pre-copy: nobody mirrors); a deadline does not wait for
    # the rest (the switch streams what is not mirrored)
    slices = cut.precopy_min if cut.precopy_min == cut.precopy_max else 0
    assert a.precopy == (switchable and me.precopied < slices and cut.force != still)
    assert not (a.precopy and a.propose)
    if a.propose:
        # only what every rank is ready for and the controller still wants
        assert a.propose == still == cut.wanted == cut.ready_min == cut.ready_max and not a.force
        assert not cut.ckpt_busy  # (a checkpoint still written over the Active World's groups finishes first)
    else:
        assert not (switchable and not a.precopy and not cut.ckpt_busy)
    # never a checkpoint while the state is handed over or the last one is still written
    assert a.checkpoint == (me.checkpoint_due and not cut.ckpt_busy and not a.propose and not a.force)


@settings(max_examples=2000, deadline=None)
@given(cut=cuts, me=locals_, other_ready=st.booleans(), other_built=st.booleans())
def test_ranks_that_see_one_cut_take_one_decision(cut, me, other_ready, other_built):
    """Ranks differ in their own readiness only; the cut carries everyone's, so all but the
    local warm-up step decide alike."""
    a = decide(cut, me)
    b = decide(cut, replace(me, ready=other_ready, built=other_built))
    assert replace(a, connect=False) == replace(b, connect=False)


@settings(max_examples=500, deadline=None)
@given(second=cuts, preparing=st.integers(1, 3), due=st.booleans(), busy=st.booleans())
def test_after_a_forced_preparation(second, preparing, due, busy):
    a = after_force(second, preparing, due, busy)
    ready = second.ready_min == second.ready_max == preparing
    assert a.propose == (preparing if ready else 0)
    assert a.checkpoint == (due and not busy and not ready)
    assert not (a.abandon or a.prepare or a.force or a.connect or a.stop)


def test_the_handoff_cycle_as_ranks_see_it():
    """Wanted -> prepare; built (boundary connect) -> connect; ready -> propose; withdrawn -> abandon."""
    me = Local(step=5, generation=0)
    assert decide(Cut(1, 0, 0, 0, 0, 0, 0), me).prepare == 1
    me = replace(me, preparing=1, defer_connect=True, built=True)
    assert decide(Cut(1, 0, 0, 0, 0, 0, 0, built_min=1, built_max=1), me).connect
    me = replace(me, ready=True)
    assert decide(Cut(1, 1, 1, 0, 0, 0, 0, 1, 1), me).propose == 1
    assert decide(Cut(0, 1, 1, 0, 0, 0, 0, 1, 1), me).abandon  # the controller withdrew it
    assert decide(Cut(2, 1, 1, 0, 0, 0, 0), me) == Action(abandon=True, prepare=2)  # superseded
    # with a pre-copy of two slices on every rank: a slice at each of two boundaries, then the switch
    two = Cut(1, 1, 1, 0, 0, 0, 0, 1, 1, precopy_min=2, precopy_max=2)
    assert decide(two, me) == Action(precopy=True)
    assert decide(two, replace(me, precopied=1)) == Action(precopy=True)
    assert decide(two, replace(me, precopied=2)).propose == 1
    # a deadline switches at once: what is not mirrored streams
    assert decide(replace(two, force=1), replace(me, precopied=1)).propose == 1
    # a rank without a pre-copy (its copies did not fit): nobody mirrors
    assert decide(replace(two, precopy_min=0), me).propose == 1
