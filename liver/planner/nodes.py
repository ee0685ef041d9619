"""Placement across nodes: a tensor-parallel group's all-reduces run every layer, so its ranks
belong on one node (NVLink, not the network). ``tp_within_nodes`` changes a placement (new rank ->
process) as little as it can so that each TP group's processes share a node; pure, tested
exhaustively in-process.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from liver.topology.layout import Layout


def tp_groups_split(layout: Layout, placement: list[int], node_of: Mapping[int, str]) -> int:
    """How many TP groups of ``placement`` span more than one node."""
    return sum(len({node_of[placement[r]] for r in g}) > 1 for g in layout.all_groups("tp"))


def tp_within_nodes(layout: Layout, placement: list[int], node_of: Mapping[int, str]) -> list[int]:
    """``placement`` with each TP group on one node wherever the nodes' process counts allow: each
    group goes to the node that already hosts most of its ranks (with room for a whole group),
    keeps the processes it has there, and takes the node's other processes for its other ranks.
    Groups no node has room for keep what is left, as close to before as it can. The same
    processes, each hosting one rank; the input itself where no group is split."""
    tp = layout.tp
    if tp == 1 or tp_groups_split(layout, placement, node_of) == 0:
        return list(placement)
    groups = layout.all_groups("tp")
    room = {n: c // tp for n, c in Counter(node_of[p] for p in placement).items()}
    votes = [Counter(node_of[placement[r]] for r in g) for g in groups]
    order = sorted(range(len(groups)), key=lambda i: (-max(votes[i].values()), i))
    home: dict[int, str] = {}
    for i in order:
        fits = [n for n in room if room[n] > 0]
        if not fits:
            break
        n = max(fits, key=lambda n: (votes[i].get(n, 0), room[n], n))
        home[i] = n
        room[n] -= 1
    out: list[int | None] = [None] * len(placement)
    used: set[int] = set()
    for i, n in home.items():  # a group keeps its processes that are on its node
        for r in groups[i]:
            if node_of[placement[r]] == n:
                out[r] = placement[r]
                used.add(placement[r])
    spare = {n: [p for p in placement if node_of[p] == n and p not in used] for n in room}
    for i, n in home.items():  # and takes the node's others for the rest
        for r in groups[i]:
            if out[r] is None:
                out[r] = spare[n].pop(0)
                used.add(out[r])
    left = [p for p in placement if p not in used]
    for r, p in enumerate(placement):  # groups without a home: their own process if still free
        if out[r] is None and p in left:
            out[r] = p
            left.remove(p)
    for r in range(len(out)):
        if out[r] is None:
            out[r] = left.pop(0)
    return out  # type: ignore[return-value]
