"""Healing a fail-stop from the survivors' memory: what the controller decides, as pure functions.

A rank lost without notice leaves its generation's groups broken; the other ranks stop at the last
step they completed (an engine changes its state only after its step's last collective) and report
it (``Stalled``). Where every element of every tensor is still held by survivors that stopped at
one step (data-parallel replicas), the next generation is built from their state over the network,
as a handoff is: no rollback to the checkpoint, only the step in flight is lost. Survivors that
stopped a step earlier (a peer vanished inside a collective the others had completed) give nothing
and receive their shards, as joiners do. Otherwise the checkpoint is the fallback.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable, RankView, Survivors
from liver.topology import Layout, ParallelConfig


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


def healing_step(view: Survivors, specs: list[TensorSpec], steps: Mapping[int, int]) -> tuple[int, Survivors] | None:
    """The latest step at which the survivors that stopped there (``steps``: each surviving
    rank's step, by its rank in ``view.view``) hold every element of every tensor, and the view
    of those ranks; None where no step's survivors cover the state."""
    for step in sorted(set(steps.values()), reverse=True):
        at = Survivors(view.view, tuple(r for r in view.ranks if steps[r] == step))
        if uncovered(at, specs) is None:
            return step, at
    return None


def keep(view: Survivors, specs: list[TensorSpec], survivors: list[int], procs: tuple[int, ...],
         count: int) -> tuple[list[int], Survivors] | None:
    """``count`` of ``survivors`` (processes) to heal onto where no configuration uses them all,
    and ``view`` (the givers: its ranks; ``procs``: the old generation's process of each rank)
    restricted to those kept, still holding every element of every tensor: the survivors that give
    nothing go first, then givers whose shards others hold too, each from the last in process
    order; None where ``count`` of them cannot hold the state."""
    kept = list(survivors)
    givers = {procs[r] for r in view.ranks}

    def held(ps: list[int]) -> Survivors:
        return Survivors(view.view, tuple(r for r in view.ranks if procs[r] in ps))

    for p in sorted(survivors, key=lambda q: (q in givers, -q)):
        if len(kept) == count:
            break
        if p in givers and uncovered(held([q for q in kept if q != p]), specs) is not None:
            continue
        kept.remove(p)
    return (kept, held(kept)) if len(kept) == count else None


def onto_fewer(view: Survivors, specs: list[TensorSpec], survivors: list[int], procs: tuple[int, ...],
               chosen: ParallelConfig, best: Callable[[int], ParallelConfig | None]
               ) -> tuple[ParallelConfig, list[int], Survivors] | None:
    """Where no configuration uses every survivor (``chosen``: the one on fewer): the configuration
    to heal onto, the survivors kept and the givers' view (``keep``): ``chosen`` where that many
    hold the state, else the most GPUs under the survivors' count whose configuration (``best(n)``,
    None where none fits) they do; None where no count does."""
    kept = keep(view, specs, survivors, procs, chosen.world_size)
    if kept is not None:
        return chosen, *kept
    for n in range(len(survivors) - 1, chosen.world_size, -1):
        par = best(n)
        if par is not None and (kept := keep(view, specs, survivors, procs, n)) is not None:
            return par, *kept
    return None

