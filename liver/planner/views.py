"""The planner for any Resource View (``resource_view.table``): a box table from DTensor
placements, or a Layout's analytic view given as one. The same contract as ``plan.plan_transfer``:
every destination element written exactly once, from a source that holds the same logical
element; a destination process that already holds an element takes it locally; replicas of a box
share the sending. Slower than the analytic planner (it compares boxes rank by rank instead of
over (stage, tp) classes), which ``plan_transfer`` uses whenever both sides are Layouts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np

from liver.planner.plan import Plan, _Columns, _geometry_groups, identity_placement
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import RankView
from liver.resource_view.view import Box, box_numel, intersect, relative


def _check(old: RankView, new: RankView, old_procs: list[int], new_procs: list[int],
           placement: list[int] | None) -> None:
    if len(old_procs) != old.size or len(set(old_procs)) != len(old_procs):
        raise ValueError(f"old_procs={old_procs}: {old.size} distinct processes required (one per old rank)")
    if len(new_procs) != new.size or len(set(new_procs)) != len(new_procs):
        raise ValueError(f"new_procs={new_procs}: {new.size} distinct processes required (one per new rank)")
    if placement is not None and (len(placement) != new.size or sorted(placement) != sorted(new_procs)):
        raise ValueError(f"placement={placement}: allowed an order of new_procs={sorted(new_procs)}")


def _groups(specs: list[TensorSpec], old: RankView, new: RankView) -> list[list[TensorSpec]]:
    """Tensors that every rank holds in the same boxes on both sides move as one (a parameter and
    its moments); a tensor whose boxes differ from its group's moves on its own."""
    out = []
    for g in _geometry_groups(specs):
        members = [s for s in specs if s.name in g.names]
        rows = {}
        for s in members:
            key = tuple(old.box(s, r) for r in range(old.size)) + tuple(new.box(s, r) for r in range(new.size))
            rows.setdefault(key, []).append(s)
        out += list(rows.values())
    return out


def plan_views(old: RankView, new: RankView, specs: list[TensorSpec], old_procs: list[int], new_procs: list[int],
               *, placement: list[int] | None = None, optimize_placement: bool = True,
               pause: Callable[[], None] | None = None) -> Plan:
    _check(old, new, old_procs, new_procs, placement)
    groups = _groups(specs, old, new)
    old_rank_of = {p: r for r, p in enumerate(old_procs)}
    # bytes each persisting process holds of each new rank's boxes: what a placement keeps
    kept: dict[tuple[int, int], int] = defaultdict(int)
    for g in groups:
        itemsize = sum(s.itemsize for s in g)
        for n in range(new.size):
            d = new.box(g[0], n)
            if d is None:
                continue
            for p, r in old_rank_of.items():
                s = old.box(g[0], r)
                if s is not None and (i := intersect(s, d)) is not None:
                    kept[(p, n)] += box_numel(i) * itemsize
    ident = identity_placement(old_procs, new_procs)
    keeps = lambda pl: sum(kept.get((p, n), 0) for n, p in enumerate(pl))  # noqa: E731
    if placement is None:
        placement = ident
        if optimize_placement:
            greedy = _greedy(kept, old_procs, new_procs, new.size, ident)
            if keeps(greedy) > keeps(ident):
                placement = greedy
    rotation: dict[tuple, int] = defaultdict(int)
    sent: dict[int, int] = defaultdict(int)
    received: dict[int, int] = defaultdict(int)
    columns: dict[int, list[_Columns]] = defaultdict(list)
    total = 0
    for g in groups:
        if pause is not None:
            pause()
        proto, names = g[0], tuple(s.name for s in g)
        itemsize = sum(s.itemsize for s in g)
        holders: dict[Box, list[int]] = {}
        for r in range(old.size):
            s = old.box(proto, r)
            if s is not None:
                holders.setdefault(s, []).append(r)
        cross, src, dst, sproc, dproc, nbytes = [], [], [], [], [], []
        for n in range(new.size):
            d = new.box(proto, n)
            if d is None:
                continue
            total += box_numel(d) * itemsize
            covered = 0
            for s, ranks in holders.items():
                i = intersect(s, d)
                if i is None:
                    continue
                covered += box_numel(i)
                local = next((r for r in ranks if old_procs[r] == placement[n]), None)
                if local is None:  # replicas take turns
                    local = ranks[rotation[(names, s)] % len(ranks)]
                    rotation[(names, s)] += 1
                b = box_numel(i) * itemsize
                cross.append((-2, -2, relative(i, s), relative(i, d), box_numel(i), i == s == d))
                src.append(local), dst.append(n), sproc.append(old_procs[local]), dproc.append(placement[n])
                nbytes.append(b)
                if old_procs[local] != placement[n]:
                    sent[old_procs[local]] += b
                    received[placement[n]] += b
            if covered != box_numel(d):
                raise ValueError(f"new rank {n}'s box {list(d)} of {proto.name!r}: the old ranks' distinct boxes "
                                 f"cover {covered} of its {box_numel(d)} elements; they must tile it exactly once")
        if cross:
            k = len(cross)
            columns[proto.layer].append(_Columns(names, proto.layer, cross, np.arange(k), np.asarray(src),
                                                 np.asarray(dst), np.asarray(sproc), np.asarray(dproc),
                                                 np.asarray(nbytes, dtype=np.int64)))
    by_layer = {layer: columns[layer] for layer in sorted(columns)}
    return Plan(old, new, list(placement), list(old_procs), by_layer, sum(sent.values()), total - keeps(ident),
                dict(received), dict(sent))


def _greedy(kept: dict[tuple[int, int], int], old_procs: list[int], new_procs: list[int], size: int,
            ident: list[int]) -> list[int]:
    """New rank -> process, largest kept bytes first; the rest in identity order."""
    persisting = set(old_procs) & set(new_procs)
    placement: list[int | None] = [None] * size
    used: set[int] = set()
    for (p, n), _ in sorted(kept.items(), key=lambda x: (-x[1], x[0])):
        if p in persisting and p not in used and placement[n] is None:
            placement[n] = p
            used.add(p)
    free = [p for p in ident if p not in used]
    return [x if x is not None else free.pop(0) for x in placement]
