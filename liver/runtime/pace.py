"""Pace: how much of a training process a companion may take while it prepares.

A companion shares its process with the training thread: its Python holds the GIL, and on a busy
machine its CPU time is a core the ranks do not get. Left alone, a preparation's few milliseconds
of CPU land in one or two steps and slow them by a large fraction.
Paced, it gets ``share`` of each step's time as credit (its thread's CPU time, measured) and waits
for the next iteration boundary while its credit is spent; a unit of work that overshoots is paid
back from the following steps' credit. Over the preparation it takes at most ``share`` of the
steps' time, spread over as many steps as it needs; a single step loses at most ``share`` plus one
unit. The preparation takes longer; preparing is not downtime.

The training thread calls ``boundary(step_s)`` after every step; the companion calls the pace
(``pace()``) between units of its work; ``forgive()`` after a unit that ran without the GIL
(NCCL's communicator set-up, on a GPU host with cores to spare) leaves that unit uncharged.
``unleash()`` lifts the limit: a deadline, or work that
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
        self._credit = share * step_s if step_s else 0.0  # CPU seconds it may still spend
        self.waits = 0  # boundaries waited for: how many steps the preparation was spread over
        self.largest_unit_s = 0.0  # the most CPU time between two calls: how finely it is cut
        self._last: float | None = None

    def boundary(self, step_s: float) -> None:
        """Training thread, after each step: this step's share as new credit (none saved up
        beyond one step's: an idle companion does not come back with a burst)."""
        with self._cond:
            self._ticks += 1
            self._step_s = step_s
            self._credit = min(self._credit + self.share * step_s, self.share * step_s)
            self._cond.notify_all()

    def unleash(self) -> None:
        with self._cond:
            self._free = True
            self._cond.notify_all()

    @property
    def free(self) -> bool:
        return self._free

    @property
    def credit(self) -> float:
        """CPU seconds it may spend before it waits for a boundary (negative: a debt)."""
        return self._credit

    def forgive(self) -> None:
        """The CPU time since the last call is not charged (a unit that held no GIL)."""
        self._last = self.clock()

    def __call__(self) -> None:
        """Companion, between units of work: pay for the last unit, then go on, or wait for
        boundaries until there is credit again."""
        now = self.clock()
        if self._last is not None:
            unit = now - self._last
            self.largest_unit_s = max(self.largest_unit_s, unit)
            with self._cond:
                self._credit -= unit
        self._last = now
        if self._free or self._step_s is None:
            return
        with self._cond:
            while self._credit <= 0.0 and not self._free:
                tick = self._ticks
                if not self._cond.wait_for(lambda: self._free or self._ticks != tick, timeout=self.wait_s):
                    break  # no boundary came: training has stopped; do not hold the preparation
                self.waits += 1
        self._last = self.clock()
