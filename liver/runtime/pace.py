"""Pace: how much of a training process a companion may take while it prepares.

A companion shares its process with the training thread: its Python holds the GIL, and on a busy
machine its CPU time is a core the ranks do not get. Left alone, a preparation's few milliseconds
of CPU land in one or two steps (+15-20% on a 25 ms step, bench/results/issue4-bench-reconfig).
Paced, it runs at most ``share`` of each step's time (its thread's CPU time, measured), then waits
for the next iteration boundary: the cost is spread over as many steps as it needs, and each step
loses at most about ``share`` of its time. The preparation takes longer; preparing is not downtime.

The training thread calls ``boundary(step_s)`` after every step; the companion calls the pace
(``pace()``) between units of its work. ``unleash()`` lifts the limit: a deadline, or work that
now runs in the foreground (a scale-in whose notice is running out, a joiner, a boundary warm-up).
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class Pace:
    def __init__(self, share: float, step_s: float | None = None, wait_s: float = 1.0,
                 clock: Callable[[], float] = time.thread_time) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share={share!r}: allowed a fraction of a step from 0 (no limit) to 1")
        self.share = share
        self.clock = clock  # the companion thread's CPU time
        self.wait_s = wait_s  # longest wait for a boundary (training that stops does not hold it)
        self._cond = threading.Condition()
        self._ticks = 0
        self._step_s = step_s  # the last step's time (no limit until one is known)
        self._free = share == 0.0
        self._slice_start: float | None = None  # CPU time at the start of this step's slice
        self._slice_tick = 0
        self.waits = 0  # boundaries waited for: how many steps the preparation was spread over
        self.largest_unit_s = 0.0  # the most CPU time between two calls: how finely it is cut
        self._last: float | None = None

    def boundary(self, step_s: float) -> None:
        """Training thread, after each step: a new slice for the companion."""
        with self._cond:
            self._ticks += 1
            self._step_s = step_s
            self._cond.notify_all()

    def unleash(self) -> None:
        with self._cond:
            self._free = True
            self._cond.notify_all()

    @property
    def free(self) -> bool:
        return self._free

    def __call__(self) -> None:
        """Companion, between units of work: go on, or wait for the next boundary once this
        step's share is spent."""
        now = self.clock()
        if self._last is not None:
            self.largest_unit_s = max(self.largest_unit_s, now - self._last)
        self._last = now
        if self._free:
            return
        if self._slice_start is None or self._ticks != self._slice_tick:
            self._slice_start, self._slice_tick = now, self._ticks  # a new step: a new slice
            return
        if self._step_s is None or now - self._slice_start < self.share * self._step_s:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._free or self._ticks != self._slice_tick, timeout=self.wait_s)
        self.waits += 1
        self._slice_start = self._last = self.clock()
        self._slice_tick = self._ticks
