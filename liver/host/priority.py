"""CPU priority of a worker that boots beside training."""

import os
import sys
import threading

from liver.host.threads import each_thread


def background() -> None:
    """Idle-only CPU priority (SCHED_IDLE where there is one), for a cold joiner's boot: it must not
    slow the training it joins (it restores normal priority, where allowed, once it holds a rank)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def normal() -> None:
    """Back to normal priority where the system allows it, on every thread (those a cold joiner
    started while it booted, the communicators' among them, inherited the idle priority)."""
    def restore(tid: int) -> None:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, 0)
    try:
        each_thread(restore)
    except (AttributeError, OSError) as e:
        print(f"could not restore normal CPU priority ({e})", file=sys.stderr)


LOW_NICE = 10  # a small share of a busy core, yet scheduled within milliseconds of waking


def this_thread(low: bool) -> None:
    """The calling thread only: low priority (nice ``LOW_NICE``), or back to normal. A controller's
    loop polls at low priority beside training and acts at normal priority once something is due;
    not at idle-only priority (SCHED_IDLE): on a machine whose cores the ranks keep busy, a due
    event then waited 30 s for its turn."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOW_NICE if low else 0)
    except (AttributeError, OSError):
        pass  # (where the system does not allow it, the loop keeps the priority it has)
