"""Intersection-based transfer planner (paper A.2): from an old layout, a new layout, the logical
tensor specs and the processes on each side, the TransferTasks that rebuild every destination
shard exactly once. Pure metadata: no torch, no process groups.

Tensors whose views coincide (a parameter and its AdamW moments) move together in one task.
A task is local when source and destination are the same process: ``keep`` when the boxes are
the same storage (nothing moves), ``copy`` otherwise. Everything else is ``send``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

import numpy as np

from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import LayoutView, RankView
from liver.resource_view.view import Box, box_numel, view
from liver.topology.layout import Layout


class TransferTask(NamedTuple):
    tensors: tuple[str, ...]  # logical tensors sharing this geometry (parameter + moments)
    layer: int
    src: int  # old rank
    dst: int  # new rank
    src_proc: int
    dst_proc: int
    src_box: Box  # in the source shard's local coordinates
    dst_box: Box  # in the destination shard's local coordinates
    nbytes: int  # all tensors of the task together
    same: bool  # source and destination shards are the same box of the tensor

    @property
    def kind(self) -> str:
        if self.src_proc != self.dst_proc:
            return "send"
        return "keep" if self.same else "copy"


class _Columns(NamedTuple):
    """The tasks of one geometry group, column-wise (one entry per task)."""

    names: tuple[str, ...]
    layer: int
    cross: list
    row: np.ndarray  # index into cross
    src: np.ndarray
    dst: np.ndarray
    src_proc: np.ndarray
    dst_proc: np.ndarray
    nbytes: np.ndarray

    def tasks(self, mask: np.ndarray | None = None) -> list[TransferTask]:
        idx = range(len(self.row)) if mask is None else np.nonzero(mask)[0]
        out = []
        for k in idx:
            _, _, sb, db, _, same = self.cross[self.row[k]]
            out.append(TransferTask(self.names, self.layer, int(self.src[k]), int(self.dst[k]),
                                    int(self.src_proc[k]), int(self.dst_proc[k]), sb, db,
                                    int(self.nbytes[k]), same))
        return out


@dataclass
class Plan:
    old: Layout | RankView
    new: Layout | RankView
    placement: list[int]  # new rank -> process
    old_procs: list[int]  # old rank -> process
    by_layer: dict[int, list[_Columns]]  # columnar; TransferTasks are built on demand
    bytes_moved: int  # over the network, with this placement
    bytes_moved_identity: int  # with the identity placement (persisting processes keep order)
    rank_bytes_in: dict[int, int] = field(default_factory=dict)  # per process
    rank_bytes_out: dict[int, int] = field(default_factory=dict)

    @property
    def tasks(self) -> list[TransferTask]:
        """Every task, grouped by layer in streaming order (built on demand)."""
        return [t for layer in self.by_layer for c in self.by_layer[layer] for t in c.tasks()]

    def layer_tasks(self, proc: int) -> list[tuple[int, list[TransferTask]]]:
        """The tasks a process takes part in (as source or destination), layer by layer."""
        return list(self.iter_layer_tasks(proc))

    def iter_layer_tasks(self, proc: int) -> Iterator[tuple[int, list[TransferTask]]]:
        """``layer_tasks``, one layer at a time (each built when it is reached)."""
        for layer, cols in self.by_layer.items():
            ts = [t for c in cols for t in c.tasks((c.src_proc == proc) | (c.dst_proc == proc))]
            if ts:
                yield layer, ts

    @property
    def num_tasks(self) -> int:
        return sum(len(c.row) for v in self.by_layer.values() for c in v)

    def summary(self) -> dict:
        return {"num_tasks": self.num_tasks, "bytes_moved": self.bytes_moved,
                "bytes_moved_identity_placement": self.bytes_moved_identity,
                "max_rank_bytes_in": max(self.rank_bytes_in.values(), default=0),
                "max_rank_bytes_out": max(self.rank_bytes_out.values(), default=0)}


class _Group(NamedTuple):
    names: tuple[str, ...]
    proto: TensorSpec
    itemsize_total: int


def _geometry_groups(specs: list[TensorSpec]) -> list[_Group]:
    """Specs with identical views (same shape, layer and sharding) move as one."""
    groups: dict[tuple, list[TensorSpec]] = {}
    for s in specs:
        key = (s.param or s.name, s.shape, s.layer, s.shard_dim)
        groups.setdefault(key, []).append(s)
    return [_Group(tuple(s.name for s in g), g[0], sum(s.itemsize for s in g)) for g in groups.values()]


def _pieces(layout: Layout, spec: TensorSpec) -> list[Box]:
    """The distinct boxes of ``spec`` over TP ranks (index = tp coordinate) of its stage."""
    stage = layout.stage_of_layer(spec.layer)
    return [view(spec, layout, layout.rank(stage, 0, t)) for t in range(layout.tp)]


def _class_overlap(old: Layout, new: Layout, groups: list[_Group]) -> dict[tuple[int, int], dict[tuple[int, int], int]]:
    """Bytes that an old (stage, tp) class and a new (stage, tp) class hold in common."""
    out: dict[tuple[int, int], dict[tuple[int, int], int]] = defaultdict(lambda: defaultdict(int))
    per_geometry: dict[tuple, list[tuple[int, int, int]]] = {}
    for g in groups:
        s_old, s_new = old.stage_of_layer(g.proto.layer), new.stage_of_layer(g.proto.layer)
        key = (g.proto.shape, g.proto.shard_dim)
        pairs = per_geometry.get(key)
        if pairs is None:
            po, pn = _pieces(old, g.proto), _pieces(new, g.proto)
            pairs = [(i, j, n) for i, a in enumerate(po) for j, b in enumerate(pn)
                     if (n := _overlap_numel(a, b))]
            per_geometry[key] = pairs
        for i, j, n in pairs:
            out[(s_old, i)][(s_new, j)] += n * g.itemsize_total
    return out


def _overlap_numel(a: Box, b: Box) -> int:
    n = 1
    for (alo, ahi), (blo, bhi) in zip(a, b):
        d = min(ahi, bhi) - max(alo, blo)
        if d <= 0:
            return 0
        n *= d
    return n


def _kept_bytes(old: Layout, new: Layout, overlap, old_rank_of_proc: dict[int, int],
                placement: list[int]) -> int:
    kept = 0
    for n, proc in enumerate(placement):
        o = old_rank_of_proc.get(proc)
        if o is None:
            continue
        co, cn = old.coord(o), new.coord(n)
        kept += overlap.get((co.pp, co.tp), {}).get((cn.pp, cn.tp), 0)
    return kept


def identity_placement(old_procs: list[int], new_procs: list[int]) -> list[int]:
    """Persisting processes in the order of their old ranks, then the joiners in given order."""
    new_set, old_set = set(new_procs), set(old_procs)
    persisting = [p for p in old_procs if p in new_set]
    joiners = [p for p in new_procs if p not in old_set]
    return persisting + joiners


def best_placement(old: Layout, new: Layout, overlap, old_procs: list[int],
                   new_procs: list[int]) -> list[int]:
    """New rank -> process maximising the bytes a process already holds (greedy transportation
    over (stage, tp) classes: every DP replica of a class holds the same bytes)."""
    new_set = set(new_procs)
    supply: dict[tuple[int, int], list[int]] = defaultdict(list)  # old class -> persisting procs
    for r, p in enumerate(old_procs):
        if p in new_set:
            c = old.coord(r)
            supply[(c.pp, c.tp)].append(p)
    demand: dict[tuple[int, int], list[int]] = defaultdict(list)  # new class -> new ranks
    for n in range(new.size):
        c = new.coord(n)
        demand[(c.pp, c.tp)].append(n)
    pairs = sorted(((b, oc, nc) for oc, row in overlap.items() for nc, b in row.items()),
                   key=lambda x: (-x[0], x[1], x[2]))
    placement: list[int | None] = [None] * new.size
    for _, oc, nc in pairs:
        procs, ranks = supply.get(oc), demand.get(nc)
        while procs and ranks:
            placement[ranks.pop(0)] = procs.pop(0)
    used = set(x for x in placement if x is not None)
    free = [p for p in identity_placement(old_procs, new_procs) if p not in used]
    for n in range(new.size):
        if placement[n] is None:
            placement[n] = free.pop(0)
    return placement  # type: ignore[return-value]


def _check(old: Layout, new: Layout, old_procs: list[int], new_procs: list[int],
           placement: list[int] | None) -> None:
    if old.layers != new.layers:
        raise ValueError("new layout: model differs from the old layout's model; a reconfiguration "
                         "keeps the model")
    if len(old_procs) != old.size:
        raise ValueError(f"old_procs has {len(old_procs)} entries; the old layout has {old.size} ranks")
    if len(set(old_procs)) != len(old_procs):
        raise ValueError(f"old_procs={old_procs}: a process hosts at most one rank")
    if len(new_procs) != new.size or len(set(new_procs)) != len(new_procs):
        raise ValueError(f"new_procs has {len(new_procs)} distinct processes of {len(new_procs)}; "
                         f"the new layout {new.parallel.short()} needs {new.size}")
    if placement is not None:
        if len(placement) != new.size:
            raise ValueError(f"placement has {len(placement)} entries; the new layout has {new.size} ranks")
        outside = sorted(set(placement) - set(new_procs))
        if outside:
            raise ValueError(f"placement names processes {outside} that are not in the new world "
                             f"(new_procs); allowed: {sorted(new_procs)}")
        if len(set(placement)) != len(placement):
            raise ValueError("placement: a process hosts at most one new rank")


def plan_transfer(old: Layout | RankView, new: Layout | RankView, specs: list[TensorSpec], old_procs: list[int],
                  new_procs: list[int], *, placement: list[int] | None = None,
                  optimize_placement: bool = True, pause: Callable[[], None] | None = None) -> Plan:
    """Plan the move of every tensor in ``specs`` from ``old`` to ``new``: two Layouts (the
    analytic planner, over (stage, tp) classes), or any Resource View on either side, a box table
    (``planner.views``).

    ``old_procs[r]`` is the process of old rank r; ``new_procs`` the processes of the new world.
    Without an explicit ``placement`` the planner chooses the one that moves fewest bytes
    (``optimize_placement``) or the identity one. Raises ValueError before anything moves.
    ``pause``, if given, is called between geometry groups (a companion's pace).
    """
    if not (isinstance(old, Layout) and isinstance(new, Layout)):
        from liver.planner.views import plan_views
        return plan_views(_as_view(old), _as_view(new), specs, old_procs, new_procs, placement=placement,
                          optimize_placement=optimize_placement, pause=pause)
    _check(old, new, old_procs, new_procs, placement)
    groups = _geometry_groups(specs)
    overlap = _class_overlap(old, new, groups)
    old_rank_of_proc = {p: r for r, p in enumerate(old_procs)}
    ident = identity_placement(old_procs, new_procs)
    kept_ident = _kept_bytes(old, new, overlap, old_rank_of_proc, ident)
    if placement is None:
        placement = ident
        if optimize_placement:
            greedy = best_placement(old, new, overlap, old_procs, new_procs)
            if _kept_bytes(old, new, overlap, old_rank_of_proc, greedy) > kept_ident:
                placement = greedy
    total = new.dp * sum(g.proto.numel * g.itemsize_total * (new.tp if g.proto.shard_dim is None else 1)
                         for g in groups)
    moved_ident = total - kept_ident

    # Columnar construction: per geometry group, every (cross piece, destination replica) row
    # at once with numpy; rows shared by groups of one family (same geometry and stage pair)
    # are computed once. Sources for rows the destination does not hold rotate over the DP
    # replicas, continuing across groups, so each replica sends an equal share.
    place = np.asarray(placement, dtype=np.int64)
    nproc = int(max(max(old_procs), max(new_procs))) + 1
    old_of_proc = np.full(nproc, -1, dtype=np.int64)
    old_of_proc[np.asarray(old_procs, dtype=np.int64)] = np.arange(old.size)
    old_pp = np.array([old.coord(r).pp for r in range(old.size)] + [-1])
    old_tp = np.array([old.coord(r).tp for r in range(old.size)] + [-1])
    old_procs_arr = np.asarray(old_procs, dtype=np.int64)
    rotation: dict[tuple[int, int], int] = defaultdict(int)
    sent = np.zeros(nproc, dtype=np.int64)
    received = np.zeros(nproc, dtype=np.int64)
    cross_cache: dict[tuple, list] = {}
    family_cache: dict[tuple, tuple] = {}
    columns: dict[int, list[_Columns]] = defaultdict(list)
    for g in groups:
        if pause is not None:
            pause()
        spec = g.proto
        s_old, s_new = old.stage_of_layer(spec.layer), new.stage_of_layer(spec.layer)
        ckey = (spec.shape, spec.shard_dim)
        cross = cross_cache.get(ckey)
        if cross is None:
            cross = _cross(old, new, spec)
            cross_cache[ckey] = cross
        fkey = (ckey, s_old, s_new)
        fam = family_cache.get(fkey)
        if fam is None:
            k = len(cross)
            ii = np.array([c[0] for c in cross], dtype=np.int64)
            jj = np.array([c[1] for c in cross], dtype=np.int64)
            numel = np.array([c[4] for c in cross], dtype=np.int64)
            d_new = np.repeat(np.arange(new.dp), k)
            row = np.tile(np.arange(k), new.dp)
            dst = (s_new * new.dp + d_new) * new.tp + jj[row]
            dproc = place[dst]
            o = old_of_proc[dproc] if dproc.size else dproc
            local = (o >= 0) & (old_pp[o] == s_old) & ((ii[row] < 0) | (old_tp[o] == ii[row]))
            fam = (row, ii[row], dst, dproc, o, local, numel[row])
            family_cache[fkey] = fam
        row, irow, dst, dproc, o, local, numel = fam
        src = np.where(local, o, 0)
        remote = np.nonzero(~local)[0]
        if remote.size:
            for i in np.unique(irow[remote]):
                sel = remote[irow[remote] == i]
                base = rotation[(s_old, int(i))]
                rotation[(s_old, int(i))] = base + sel.size
                turn = base + np.arange(sel.size)
                if i < 0:  # replicated: every rank of the old stage is a source
                    src[sel] = s_old * old.dp * old.tp + turn % (old.dp * old.tp)
                else:
                    src[sel] = (s_old * old.dp + turn % old.dp) * old.tp + i
        sproc = old_procs_arr[src]
        nbytes = numel * g.itemsize_total
        moving = sproc != dproc
        np.add.at(sent, sproc[moving], nbytes[moving])
        np.add.at(received, dproc[moving], nbytes[moving])
        columns[spec.layer].append(_Columns(g.names, spec.layer, cross, row, src, dst, sproc, dproc, nbytes))
    by_layer = {layer: columns[layer] for layer in sorted(columns)}
    moved = int(sent.sum())
    nz_in, nz_out = np.nonzero(received)[0], np.nonzero(sent)[0]
    return Plan(old, new, list(placement), list(old_procs), by_layer, moved, moved_ident,
                {int(p): int(received[p]) for p in nz_in}, {int(p): int(sent[p]) for p in nz_out})


def _as_view(v: Layout | RankView) -> RankView:
    return LayoutView(v) if isinstance(v, Layout) else v


def _cross(old: Layout, new: Layout, spec: TensorSpec) -> list[tuple[int, int, Box, Box, int, bool]]:
    """(old tp, new tp, src box, dst box, numel, same) for every overlapping pair of TP pieces,
    boxes in each shard's local coordinates. A replicated tensor has one row per new TP rank
    with old tp = -1: every old rank of the stage holds it."""
    if spec.shard_dim is None:
        full = tuple((0, n) for n in spec.shape)
        return [(-1, j, full, full, spec.numel, True) for j in range(new.tp)]
    out = []
    po, pn = _pieces(old, spec), _pieces(new, spec)
    for j, b in enumerate(pn):
        for i, a in enumerate(po):
            inter = tuple((max(alo, blo), min(ahi, bhi)) for (alo, ahi), (blo, bhi) in zip(a, b))
            if any(lo >= hi for lo, hi in inter):
                continue
            sb = tuple((lo - o, hi - o) for (lo, hi), (o, _) in zip(inter, a))
            db = tuple((lo - o, hi - o) for (lo, hi), (o, _) in zip(inter, b))
            out.append((i, j, sb, db, box_numel(inter), inter == a == b))
    return out
