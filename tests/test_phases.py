"""The controller's phases (controller/phases.py): the table's rules over every reachable phase
and random event sequences."""

import pytest
from hypothesis import given, settings, strategies as st

from liver.controller.phases import PENDING, TRANSITIONS, Phase, TransitionError, Trigger, advance


def reachable() -> set[Phase]:
    seen, todo = {Phase.STABLE}, [Phase.STABLE]
    while todo:
        p = todo.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is p and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    return seen


def test_every_phase_is_reachable_and_every_live_one_returns_to_stable():
    assert reachable() == set(Phase)
    for p in Phase:
        if p is not Phase.ENDED:
            assert advance(p, Trigger.FAIL_STOP) is Phase.STABLE
            assert advance(p, Trigger.END) is Phase.ENDED
    for t in Trigger:
        with pytest.raises(TransitionError):
            advance(Phase.ENDED, t)


def test_the_switch_comes_only_from_a_pending_generation_and_is_not_cancelled():
    into_switch = {src for (src, _), dst in TRANSITIONS.items() if dst is Phase.SWITCH}
    assert into_switch == set(PENDING)
    out_of_switch = {t for (src, t) in TRANSITIONS if src is Phase.SWITCH}
    assert out_of_switch == {Trigger.SWITCHED, Trigger.FAIL_STOP, Trigger.END}  # no withdrawal once committed
    assert {src for (src, _), dst in TRANSITIONS.items() if dst is Phase.CLEANUP} == {Phase.SWITCH}


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(list(Trigger)), max_size=40))
def test_random_event_sequences_follow_the_table(triggers):
    """Whatever arrives, the phase moves only along the table (an unknown transition is refused
    and changes nothing), and a live handoff and a restart never interleave."""
    phase, history = Phase.STABLE, [Phase.STABLE]
    for t in triggers:
        try:
            nxt = advance(phase, t)
        except TransitionError:
            assert (phase, t) not in TRANSITIONS
            continue
        assert TRANSITIONS[(phase, t)] is nxt
        live = {Phase.PREPARE, Phase.READY, Phase.SWITCH, Phase.CLEANUP}
        restart = {Phase.STOP, Phase.START}
        assert not (phase in live and nxt in restart) and not (phase in restart and nxt in live)
        phase = nxt
        history.append(phase)
    # a switch is always followed by its cleanup before the next event begins
    for a, b in zip(history, history[1:]):
        if a is Phase.SWITCH:
            assert b in (Phase.CLEANUP, Phase.STABLE, Phase.ENDED)
