"""The controller's decisions besides its phases (liver/policy/decisions.py), over every input."""

from hypothesis import given, strategies as st

import pytest

from liver.policy.decisions import (PATH_MARGIN, RATE_MIN_BYTES, EndState, NoticeAction, PastHandoff, ScaleInPath,
                                    job_finished, on_notice, predicted_handoff_s, scale_in_path)
from liver.policy.events import EventKind

KINDS = [None, *EventKind]


@given(pending=st.sampled_from(KINDS), notice=st.sampled_from(KINDS), gpus=st.integers(1, 9), active=st.integers(1, 9),
       deadline=st.booleans())
def test_a_notice_cuts_short_only_a_pending_scale_out(pending, notice, gpus, active, deadline):
    a = on_notice(pending, notice, gpus, active, deadline)
    if pending is not EventKind.SCALE_OUT or notice is not EventKind.SCALE_IN or not deadline:
        assert a is NoticeAction.WAIT  # any other event (a scale-in without a deadline too) waits its turn
    elif gpus > active:
        assert a is NoticeAction.MERGE  # still more than the job has: a smaller scale-out
    elif gpus < active:
        assert a is NoticeAction.DROP_THEN_BEGIN
    else:
        assert a is NoticeAction.DROP


@given(left=st.one_of(st.none(), st.floats(-10, 100)), predicted=st.floats(0, 100), replicas=st.booleans())
def test_a_scale_in_takes_the_fastest_path_that_keeps_the_state(left, predicted, replicas):
    path = scale_in_path(left, predicted, replicas)
    if left is None or predicted * PATH_MARGIN <= left:
        assert path is ScaleInPath.LIVE  # the handoff fits (with room): nothing is lost, the pause is shortest
    elif replicas:
        assert path is ScaleInPath.DROP  # the survivors already hold everything: no transfer to wait for
    else:
        assert path is ScaleInPath.RUSH  # state only the leaving ranks hold: move it, as early as possible
    # a longer deadline never makes the path worse; a slower handoff never makes it better
    if left is not None:
        assert scale_in_path(left + 1, predicted, replicas) is ScaleInPath.LIVE or path is not ScaleInPath.LIVE
        assert scale_in_path(left, predicted + 1, replicas) is path or path is ScaleInPath.LIVE


HANDOFFS = st.builds(PastHandoff, prepare_s=st.floats(0, 10), switch_s=st.floats(0, 10), transfer_s=st.floats(0, 5),
                     max_rank_bytes=st.integers(0, 1 << 32), joiners=st.booleans())


@given(past=st.lists(HANDOFFS, max_size=5), moved=st.integers(0, 1 << 32), more=st.integers(1, 1 << 30),
       slow=HANDOFFS)
def test_a_predicted_handoff_grows_with_its_bytes_and_with_a_slower_link(past, moved, more, slow):
    got = predicted_handoff_s(past, moved)
    if all(h.joiners for h in past):
        assert got is None  # nothing measured among running processes: the cost model predicts instead
        return
    assert got >= 0
    assert predicted_handoff_s(past, moved + more) >= got  # more bytes never predict a faster handoff
    if any(h.max_rank_bytes >= RATE_MIN_BYTES and h.transfer_s > 0 for h in past):  # a link's rate shown:
        assert predicted_handoff_s([*past, slow], moved) >= got * (1 - 1e-12)  # another handoff never speeds it


def test_a_handoff_over_a_link_the_job_found_slow_is_predicted_at_that_links_rate():
    """A scale-out whose joiner's shards came over a 2 MB/s link; a scale-in that moves 20 MB through
    one process is predicted at that rate (about 10 s), not at the 0.3 s the earlier handoff took."""
    fast = PastHandoff(prepare_s=0.2, switch_s=0.05, transfer_s=0.01, max_rank_bytes=1 << 10, joiners=False)
    slow = PastHandoff(prepare_s=4.0, switch_s=3.6, transfer_s=3.5, max_rank_bytes=7_000_000, joiners=True)
    assert predicted_handoff_s([fast], 20_000_000) == pytest.approx(0.25)  # no rate shown yet: as it took
    got = predicted_handoff_s([fast, slow], 20_000_000)
    assert got == pytest.approx(0.24 + 20_000_000 / 2_000_000)
    assert scale_in_path(5.0, got, survivors_hold_all=True) is ScaleInPath.DROP


def test_a_path_from_a_bad_prediction_is_refused():
    for bad in ({"predicted_s": -1.0}, {"predicted_s": 1.0, "margin": 0.5}):
        with pytest.raises(ValueError, match="allowed"):
            scale_in_path(1.0, survivors_hold_all=True, **bad)


@given(step=st.integers(0, 30), steps=st.integers(1, 30), end_at=st.integers(0, 30),
       codes=st.lists(st.sampled_from([None, 0, 1, -9]), min_size=1, max_size=4))
def test_the_job_ends_when_its_last_step_is_done_and_every_rank_exited_cleanly(step, steps, end_at, codes):
    done = job_finished(EndState(step=step, steps=steps, end_at=end_at, active_exit_codes=tuple(codes)))
    last = min(steps, end_at) if end_at else steps
    assert done == (step >= last and all(c == 0 for c in codes))


def test_the_end_during_a_preparation_is_the_active_worlds_alone():
    """The hang of a job whose end came while a scale-in prepared (the leaving rank exited last):
    only the Active World's exit codes count, and a leaving rank is one of them."""
    assert job_finished(EndState(step=60, steps=60, end_at=0, active_exit_codes=(0, 0, 0, 0)))
    assert not job_finished(EndState(step=60, steps=60, end_at=0, active_exit_codes=(0, 0, 0, None)))
    assert not job_finished(EndState(step=59, steps=60, end_at=0, active_exit_codes=(0, 0)))
    assert job_finished(EndState(step=25, steps=60, end_at=25, active_exit_codes=(0,)))


@given(at_step=st.one_of(st.none(), st.integers(0, 50)), at_time=st.one_of(st.none(), st.floats(0, 100)),
       step=st.integers(0, 60), step_s=st.floats(0.001, 5), late=st.floats(0, 200))
def test_a_trigger_counts_from_when_it_happened_not_from_when_the_controller_looked(at_step, at_time, step, step_s,
                                                                                      late):
    from liver.policy.decisions import trigger_time
    t_start, step_end = 1000.0, 1000.0 + step * step_s
    now = step_end + late  # the controller looks late (starved)
    t = trigger_time(at_step, at_time, step, step_end, step_s, t_start, now)
    if at_step is not None:
        if step < at_step:
            assert t is None
        else:  # the end of step at_step, whenever the controller saw it
            assert t == pytest.approx(t_start + at_step * step_s)
    elif at_time is not None:
        assert t is None if now - t_start < at_time else t == t_start + at_time
    else:
        assert t == now  # no trigger: it is due from when it came


class Ev:
    def __init__(self, kind, deadline_s=None, due=False):
        self.kind, self.deadline_s, self.due = kind, deadline_s, due


@given(st.lists(st.tuples(st.sampled_from(list(EventKind)), st.booleans(), st.booleans()),
                max_size=8))
def test_the_next_event_is_the_due_head_else_a_due_notice_wherever_it_waits(items):
    """In order, except that a notice (a scale-in with a deadline) whose trigger happened never
    waits behind an event whose trigger has not: the provider takes the GPUs at its deadline."""
    from liver.policy.decisions import next_event, next_notice
    queue = [Ev(k, 30.0 if d else None, due) for k, d, due in items]
    i = next_event(queue, lambda e: e.due)
    notices = [j for j, e in enumerate(queue) if e.kind == "scale-in" and e.deadline_s is not None and e.due]
    assert next_notice(queue, lambda e: e.due) == (notices[0] if notices else None)
    if queue and queue[0].due:
        assert i == 0
    else:
        assert i == (notices[0] if notices else None)


def test_a_step_triggers_exact_time_is_taken_from_the_recent_step_ends_where_the_record_has_it():
    from liver.policy.decisions import trigger_time
    ends = {5: 100.25, 6: 100.5, 7: 101.75}
    assert trigger_time(5, None, 7, 101.75, 0.01, 90.0, 130.0, ends) == 100.25  # not 101.73 estimated back
    assert trigger_time(4, None, 7, 101.75, 0.5, 90.0, 130.0, ends) == 101.75 - 3 * 0.5
