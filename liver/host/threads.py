"""Every thread of this process: what a setting made per thread (CPU affinity, priority) must be
applied to, threads the process already started (its communicators') included."""

from __future__ import annotations

import os
from typing import Callable


def each_thread(apply: Callable[[int], None]) -> None:
    """``apply(tid)`` for every thread of this process (0, this thread, where /proc is missing);
    a thread that ended meanwhile is skipped."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            apply(tid)
        except ProcessLookupError:
            pass
