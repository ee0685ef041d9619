"""The controller's decisions that are not phase changes, as pure functions of what it knows,
tested in-process: which path a scale-in with a deadline takes, what a preemption notice does to a
pending scale-out, and when the job ends."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from liver.policy.events import EventKind


class NoticeAction(enum.Enum):
    WAIT = "wait"            # nothing to do now (no notice, or nothing pending it could cut short)
    MERGE = "merge"          # the pending scale-out is re-planned to the notice's smaller total
    DROP_THEN_BEGIN = "drop-then-begin"  # the scale-out is dropped; the scale-in is handled next
    DROP = "drop"            # the scale-out is dropped; the job already has the notice's total


def on_notice(pending_kind: EventKind | None, notice_kind: EventKind | None, notice_gpus: int, active_gpus: int,
              deadline: bool = True) -> NoticeAction:
    """A scale-in notice (one with a ``deadline``) that comes while a generation is pending: it must
    not wait behind a scale-out that has not switched (the provider takes the GPUs at the
    deadline). Nothing pending was committed, so dropping it loses nothing. Any other event,
    a scale-in without a deadline too, waits its turn: events are handled in order."""
    if notice_kind is not EventKind.SCALE_IN or pending_kind is not EventKind.SCALE_OUT or not deadline:
        return NoticeAction.WAIT
    if notice_gpus > active_gpus:
        return NoticeAction.MERGE
    if notice_gpus < active_gpus:
        return NoticeAction.DROP_THEN_BEGIN
    return NoticeAction.DROP


class ScaleInPath(enum.Enum):
    LIVE = "live"    # a live handoff: it is predicted to end before the deadline (or there is none)
    DROP = "drop"    # no handoff fits, and the survivors hold every shard (the leaving ranks are
    #                  replicas): the leaving processes stop at once, the survivors go on from their
    #                  own state (no transfer, no rollback; the step in flight is re-run)
    RUSH = "rush"    # no handoff fits, and some state is held only by the leaving ranks: the live
    #                  handoff, prepared in the foreground from the start; if the deadline still
    #                  comes first, the state is recovered from the checkpoint


#: a prediction must fit this many times over: the handoff times of a busy machine spread widely
PATH_MARGIN = 1.5


def scale_in_path(seconds_left: float | None, predicted_s: float, survivors_hold_all: bool,
                  margin: float = PATH_MARGIN) -> ScaleInPath:
    """The fastest path that keeps the state, decided before a scale-in starts, from the time to
    its deadline (None: no deadline), the predicted live handoff (prepare and switch) and whether
    the ranks that stay hold a copy of every element of the state."""
    if predicted_s < 0 or margin < 1:
        raise ValueError(f"predicted_s={predicted_s}, margin={margin}: allowed predicted_s >= 0, margin >= 1")
    if seconds_left is None or predicted_s * margin <= seconds_left:
        return ScaleInPath.LIVE
    return ScaleInPath.DROP if survivors_hold_all else ScaleInPath.RUSH


#: a transfer smaller than this says more of the link's latency than of its rate (a rate measured
#: on a larger one is still a lower bound: latency included, a prediction from it errs long)
RATE_MIN_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class PastHandoff:
    """What a done handoff of this job measured: its preparation and switch, the time its
    transfer took within the switch, and the most bytes one process sent or received in it."""
    prepare_s: float
    switch_s: float
    transfer_s: float
    max_rank_bytes: int
    joiners: bool  # its preparation started processes (not a handoff among running ones)


def predicted_handoff_s(past: list[PastHandoff], max_rank_bytes: int) -> float | None:
    """A handoff among running processes that moves at most ``max_rank_bytes`` through one
    process, predicted from this job's own: the slowest such handoff's preparation and switch less
    its transfer, plus those bytes at the slowest per-process rate any transfer of at least
    ``RATE_MIN_BYTES`` showed (the links as the job found them: a slow or shared link slows every
    handoff over it). None where the job has done no handoff among running processes yet."""
    warm = [h for h in past if not h.joiners]
    if not warm:
        return None
    fixed = max(h.prepare_s + h.switch_s - h.transfer_s for h in warm)
    transfer = link_transfer_s(past, max_rank_bytes)
    if transfer is None:
        return max(h.prepare_s + h.switch_s for h in warm)
    return max(0.0, fixed) + transfer


def link_transfer_s(past: list[PastHandoff], max_rank_bytes: int) -> float | None:
    """``max_rank_bytes`` through one process at the slowest per-process rate this job's transfers
    of at least ``RATE_MIN_BYTES`` showed (any handoff's, cold joiners' too); None where none did."""
    rates = [h.max_rank_bytes / h.transfer_s for h in past if h.max_rank_bytes >= RATE_MIN_BYTES and h.transfer_s > 0]
    return max_rank_bytes / min(rates) if rates else None


@dataclass(frozen=True, slots=True)
class EndState:
    step: int                       # the last step the Active World reported
    steps: int                      # the job's configured step count
    end_at: int                     # the step the controller ends it after (0: none set)
    active_exit_codes: tuple[int | None, ...]  # of the Active World's processes (None: running)


def last_step(steps: int, end_at: int) -> int:
    """The step the job ends after: its configured count, or earlier where the controller ends it
    (``end_at``; 0: none set)."""
    return min(steps, end_at) if end_at else steps


def job_finished(s: EndState) -> bool:
    """The job is over when its last step is done and every process of the Active World exited
    cleanly; processes of a pending generation, or leaving ones, do not keep it alive."""
    return s.step >= last_step(s.steps, s.end_at) and all(c == 0 for c in s.active_exit_codes)




JOIN_POLICIES = ("now", "better", "never")  # controller.on_join


def join_total(policy: str, n_now: int, capacity: int, step_time: Callable[[int], float | None]) -> int | None:
    """How many GPUs the job scales out to when a node offers its slots (``capacity``: every usable
    slot), or None to stay. ``step_time(n)``: the estimated step time of the best configuration
    for n GPUs, or None where no configuration is valid. "now": the largest valid count; "better":
    that one only if its steps are estimated faster per sample than now; "never": an operator
    decides (``liver scale``)."""
    if policy not in JOIN_POLICIES:
        raise ValueError(f"controller.on_join={policy!r}: allowed {', '.join(JOIN_POLICIES)}")
    if policy == "never" or capacity <= n_now:
        return None
    valid = [n for n in range(capacity, n_now, -1) if step_time(n) is not None]
    if not valid:
        return None
    n = valid[0]
    if policy == "better":
        now = step_time(n_now)
        if now is not None and not step_time(n) < now:
            return None
    return n


def trigger_time(at_step: int | None, at_time: float | None, step: int, step_end: float, step_s: float,
                 t_start: float | None, now: float, ends: dict[int, float] | None = None) -> float | None:
    """When an event's trigger happened, or None while it has not: ``at_step`` N is the end of
    step N (the latest step, ``step``, ended at ``step_end``; an earlier one is counted back at
    the latest step's time, ``step_s`` each, unless ``ends`` has its own: {step: end time}),
    ``at_time`` T is T seconds after the first step
    (``t_start``; ``now`` the time), neither: ``now`` (it came without a trigger). A notice's
    deadline counts from here, not from when the controller took it."""
    if at_step is not None:
        if step < at_step:
            return None
        return ends[at_step] if ends and at_step in ends else step_end - (step - at_step) * step_s
    if at_time is not None:
        return t_start + at_time if t_start is not None and now - t_start >= at_time else None
    return now


def is_notice(kind: EventKind, deadline_s: float | None) -> bool:
    """A scale-in with a deadline: the provider takes the GPUs then, whatever else is queued."""
    return kind is EventKind.SCALE_IN and deadline_s is not None


def next_event(queue: list, triggered: Callable[[object], bool]) -> int | None:
    """The position in ``queue`` of the event to handle next: the head once its trigger happened;
    else the first notice (``is_notice``) whose trigger happened, wherever it waits (it must not
    wait behind an event whose trigger is still to come). None: nothing is due."""
    if not queue:
        return None
    if triggered(queue[0]):
        return 0
    return next_notice(queue, triggered)


def next_notice(queue: list, triggered: Callable[[object], bool]) -> int | None:
    """The position of the first notice whose trigger happened, wherever it waits in ``queue``."""
    return next((i for i, ev in enumerate(queue) if is_notice(ev.kind, ev.deadline_s) and triggered(ev)), None)
