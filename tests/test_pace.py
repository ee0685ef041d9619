"""Pace: a companion's CPU per training step stays within its share (liver/runtime/pace.py)."""

import threading
import time

import pytest

from liver.runtime.config import PrepareConfig
from liver.runtime.pace import Pace


class _Work:
    """A companion doing ``units`` units of ``unit_s`` CPU each (a fake CPU clock), pausing
    between them; records the CPU it spent between two boundaries of the training thread."""

    def __init__(self, pace_share: float, step_s: float, units: int, unit_s: float) -> None:
        self.cpu = 0.0
        self.units, self.unit_s = units, unit_s
        self.pace = Pace(pace_share, step_s, wait_s=5.0, clock=lambda: self.cpu)
        self.done = threading.Event()
        self.per_step: list[float] = [0.0]
        self.lock = threading.Lock()

    def run(self) -> None:
        for _ in range(self.units):
            self.pace()
            with self.lock:
                self.cpu += self.unit_s
                self.per_step[-1] += self.unit_s
        self.done.set()

    def boundary(self, step_s: float) -> None:
        with self.lock:
            self.per_step.append(0.0)
        self.pace.boundary(step_s)


def _drive(w: _Work, step_s: float, max_steps: int = 1000) -> int:
    t = threading.Thread(target=w.run)
    t.start()
    steps = 0
    while not w.done.is_set() and steps < max_steps:
        time.sleep(0.002)  # a training step
        w.boundary(step_s)
        steps += 1
    t.join(10)
    assert w.done.is_set()
    return steps


@pytest.mark.timeout(60)
def test_cpu_per_step_stays_within_the_share():
    # 60 units of 3 ms against a budget of 10 ms per step (share 1% of a 1 s step)
    w = _Work(0.01, 1.0, units=60, unit_s=0.003)
    steps = _drive(w, 1.0)
    # a step: the share, overshot by at most one unit (the pace is asked between units)
    assert max(w.per_step) <= 0.01 + 0.003 + 1e-9
    # the whole preparation: the share of the steps it ran beside, give or take one unit
    assert sum(w.per_step) == pytest.approx(0.18)
    assert sum(w.per_step) <= 0.01 * (steps + 1) + 0.003 + 1e-9
    assert w.pace.largest_unit_s == pytest.approx(0.003)


@pytest.mark.timeout(60)
def test_a_unit_larger_than_the_share_is_paid_back_from_later_steps():
    # units of 25 ms against 10 ms per step: one unit, then the steps it overshot are waited out
    w = _Work(0.01, 1.0, units=8, unit_s=0.025)
    steps = _drive(w, 1.0)
    assert max(w.per_step) <= 0.025 + 1e-9
    assert steps >= 0.2 / 0.01 - 3  # 200 ms of CPU at 10 ms a step
    assert w.pace.waits >= steps - 3


@pytest.mark.timeout(60)
def test_budget_follows_the_step_time():
    w = _Work(0.01, 1.0, units=40, unit_s=0.001)
    w.pace.boundary(0.1)  # steps of 0.1 s: 1 ms per step, one unit per step
    steps = _drive(w, 0.1)
    assert max(w.per_step) <= 0.001 + 0.001 + 1e-9
    assert steps >= 40 - 3


def test_a_forgiven_unit_is_not_charged():
    w = _Work(0.01, 1.0, units=0, unit_s=0.0)
    w.pace()
    w.cpu += 5.0  # a unit without the GIL (NCCL's communicator set-up)
    w.pace.forgive()
    w.pace()
    assert w.pace.credit == pytest.approx(0.01)  # untouched: no wait for a boundary
    w.cpu += 0.004
    w.pace()
    assert w.pace.credit == pytest.approx(0.006)  # a charged unit


@pytest.mark.timeout(30)
def test_unleash_lets_a_waiting_companion_go_on_without_boundaries():
    w = _Work(0.01, 1.0, units=200, unit_s=0.003)
    t = threading.Thread(target=w.run)
    t.start()
    end = time.time() + 10
    while w.pace.credit > 0 and time.time() < end:  # its credit spent: it waits for a boundary
        time.sleep(0.001)
    assert w.pace.credit <= 0 and not w.done.is_set()  # (a boundary that does not come; 5 s at most)
    w.pace.unleash()
    assert w.done.wait(5)
    t.join()


def test_share_zero_never_waits():
    w = _Work(0.0, 1.0, units=100, unit_s=1.0)
    w.run()
    assert w.done.is_set() and w.pace.waits == 0


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_bad_share_is_refused_naming_it(share):
    with pytest.raises(ValueError, match="share"):
        Pace(share)
    with pytest.raises(ValueError, match=r"prepare.companion_share=.*allowed"):
        PrepareConfig(companion_share=share)
