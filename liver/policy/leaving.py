"""Which ranks leave in a scale-in that names none (no node's notice): a pure decision.

Any k of the job's ranks may go; which k decides the path the scale-in can take. Where the ranks
that stay hold a copy of every element of the state (the leaving ones are data-parallel
replicas), the scale-in can always be a ``drop`` (the leaving processes stop at once, nothing
moves, nothing is rolled back) when no live handoff fits its deadline; otherwise it must move the
leaving ranks' state, and a missed deadline rolls back to the checkpoint. So: a set of replicas
where one exists, else the set whose handoff moves the fewest bytes. Ties go to the most recently
added slots (the GPUs that came last leave first).

"Most recently added slots" alone, as before, takes a whole pipeline stage from tp1pp2dp2 (ranks
2 and 3 are stage 1), which turns a lossless drop into a rollback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from liver.policy import heal
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import RankView, box_of
from liver.topology import Layout


@dataclass(frozen=True)
class Leaving:
    procs: list[int]   # the processes that leave
    replicas: bool     # the ones that stay hold every element (a drop is possible)
    why: str           # how they were chosen, for the event's record


def replica_groups(view: "Layout | RankView", n_ranks: int, specs: Sequence[TensorSpec]) -> list[list[int]]:
    """Ranks that hold exactly the same boxes of every tensor (data-parallel replicas), grouped."""
    groups: dict[tuple, list[int]] = {}
    for r in range(n_ranks):
        groups.setdefault(tuple(box_of(view, s, r) for s in specs), []).append(r)
    return list(groups.values())


def choose_leaving(view: "Layout | RankView", procs: Sequence[int], k: int, specs: Sequence[TensorSpec],
                   slot_of: Callable[[int], int], bytes_moved: Callable[[list[int]], int]) -> Leaving:
    """``k`` of ``procs`` (rank r is ``procs[r]`` under ``view``) to leave: replicas where the
    others can keep one of every box, else the candidate whose handoff moves fewest bytes
    (``bytes_moved(staying procs)``). ValueError for a ``k`` outside 1..len(procs)-1."""
    n = len(procs)
    if not 0 < k < n:
        raise ValueError(f"leaving={k}: allowed 1 to {n - 1} of the job's {n} ranks")
    recent = sorted(range(n), key=lambda r: slot_of(procs[r]), reverse=True)
    order = {r: i for i, r in enumerate(recent)}  # 0: the most recently added slot
    groups = replica_groups(view, n, specs)
    # every rank of a replica group but its earliest slot may go without losing a box
    spare = sorted((r for g in groups for r in sorted(g, key=order.get)[:-1]), key=order.get)
    if len(spare) >= k:
        ranks = spare[:k]
        if heal.uncovered(heal.surviving_view(view, tuple(procs), [procs[r] for r in ranks]), list(specs)) is None:
            return Leaving([procs[r] for r in ranks], True, "replicas: the ranks that stay hold every shard")
    # no set of replicas: the fewest bytes among a few principled candidates
    candidates = [recent[:k]]  # the most recently added slots
    spread = spare + [r for r in recent if r not in spare]  # as many replicas as there are, then the rest
    candidates.append(spread[:k])
    candidates.append(list(range(n - k, n)))  # the highest ranks (the last of each dimension)
    candidates.append(list(range(k)))
    best = None
    for ranks in candidates:
        ranks = sorted(set(ranks), key=order.get)
        stay = [procs[r] for r in range(n) if r not in ranks]
        cost = bytes_moved(stay)
        key = (cost, sorted(order[r] for r in ranks))
        if best is None or key < best[0]:
            best = (key, ranks)
    ranks = best[1]
    return Leaving([procs[r] for r in ranks], False,
                   f"no set of replicas: the {k} whose handoff moves fewest bytes ({best[0][0]})")
