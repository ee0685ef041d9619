"""Healing a fail-stop from the survivors' memory: what the controller decides, as pure functions.

A rank lost without notice leaves its generation's groups broken; the other ranks stop at the last
step they completed (an engine changes its state only after its step's last collective) and report
it (``Stalled``). Where every element of every tensor is still held by a survivor (data-parallel
replicas), and the survivors stopped at one step, the next generation is built from their state
over the network, as a handoff is: no rollback to the checkpoint, only the step in flight is lost.
Otherwise the checkpoint is the fallback.
"""

from __future__ import annotations

from typing import Iterable

from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable, RankView, Survivors
from liver.topology import Layout


def surviving_view(view: "Layout | RankView", procs: tuple[int, ...], dead: Iterable[int]) -> Survivors:
    """The old generation's view, restricted to the ranks whose processes are alive."""
    gone = set(dead)
    return Survivors(view, tuple(r for r, p in enumerate(procs) if p not in gone))


def uncovered(view: Survivors, specs: list[TensorSpec]) -> str | None:
    """None where the survivors hold every element of every tensor; else what is missing."""
    if not view.ranks:
        return "no rank survived"
    try:
        BoxTable.of_view(view, specs)
    except ValueError as e:
        return str(e)
    return None


def common_step(steps: Iterable[int]) -> int | None:
    """The step every survivor stopped at, or None where they differ (a peer vanished inside a
    collective that some of them had completed: their states are of different steps)."""
    distinct = set(steps)
    return distinct.pop() if len(distinct) == 1 else None
