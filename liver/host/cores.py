"""Core binding of CPU workers: each slot gets cores of its own, as each GPU worker has a GPU of
its own.

Unbound, the OS moves a gloo rank between cores and lets the node's other threads (the store,
the controller, a joiner booting) land on the core a rank was running on, and its steps slow down
(`liver bench core-binding`). The binding applies only where
the node has at least one core per slot; with fewer (4 slots on 2 cores, as in the tests) the OS
keeps scheduling. The agent's templates and controller stay unbound; a cold joiner boots
unbound at idle priority (idle time on any core) and is bound when it takes its rank.

What is bound is training. A companion thread, and the threads of the groups it creates (gloo's
socket loop and workers), run on any of the node's cores while they prepare: where a core is
idle (a scale-out from 1 rank on 2 cores) the preparation takes it instead of the rank's (binding
the whole process raised the scale-out's overhead several-fold). At the switch the new
generation's threads are bound like the rest.
"""

from __future__ import annotations

import os

from liver.host.threads import each_thread


def available() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def per_slot(slots: int, cores: list[int]) -> dict[int, list[int]] | None:
    """Slot -> its cores: ``cores`` cut into ``slots`` equal runs, in order (the rest, fewer than
    a run, unused); None where there are fewer cores than slots."""
    if slots < 1:
        raise ValueError(f"slots={slots}: allowed a positive count")
    if len(cores) < slots:
        return None
    k = len(cores) // slots
    return {s: cores[s * k:(s + 1) * k] for s in range(slots)}


class Binding:
    """A worker's binding: ``cores`` (its slot's), and the node's cores it had before."""

    def __init__(self, cores: list[int] | None) -> None:
        self.cores = cores
        self.node = available()

    def bind(self) -> None:
        """Every thread of the process onto the slot's cores (no-op when unbound)."""
        if self.cores:
            bind(self.cores)

    def free_this_thread(self) -> None:
        """This thread, and the threads it starts from now on, onto the node's cores."""
        if self.cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, self.node)


def bind(cores: list[int]) -> None:
    """Every thread of this process, and any it starts later, onto ``cores``."""
    if hasattr(os, "sched_setaffinity"):
        each_thread(lambda tid: os.sched_setaffinity(tid, cores))

