"""The controller's decisions besides its phases (controller/decisions.py), over every input."""

from hypothesis import given, strategies as st

from liver.controller.decisions import EndState, NoticeAction, job_finished, on_notice

KINDS = [None, "scale-out", "scale-in", "reshape"]


@given(pending=st.sampled_from(KINDS), notice=st.sampled_from(KINDS), gpus=st.integers(1, 9), active=st.integers(1, 9),
       deadline=st.booleans())
def test_a_notice_cuts_short_only_a_pending_scale_out(pending, notice, gpus, active, deadline):
    a = on_notice(pending, notice, gpus, active, deadline)
    if pending != "scale-out" or notice != "scale-in" or not deadline:
        assert a is NoticeAction.WAIT  # any other event (a scale-in without a deadline too) waits its turn
    elif gpus > active:
        assert a is NoticeAction.MERGE  # still more than the job has: a smaller scale-out
    elif gpus < active:
        assert a is NoticeAction.DROP_THEN_BEGIN
    else:
        assert a is NoticeAction.DROP


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
