"""CPU priority of a worker that boots beside training."""

import os


def background() -> None:
    """Idle-only CPU priority (SCHED_IDLE where there is one), for a cold joiner's boot: it must not
    slow the training it joins (it restores normal priority, where allowed, once it holds a rank)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
