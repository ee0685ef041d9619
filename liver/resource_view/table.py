"""Box tables: the Resource View given as data instead of derived from a Layout.

A table says, for every logical tensor and every rank, which boxes of the tensor the rank holds
(uneven and empty shards allowed, as ``torch.chunk`` splits give for DTensor and FSDP2), and
which stage of a pipeline (if any) the rank belongs to. ``LayoutView`` is the same interface over
the analytic view of a ``Layout``, so the planner and the executor take either. Pure metadata.

The executor keeps one storage tensor per tensor and rank, so a rank holds at most one box of a
tensor here; a table that gives a rank two boxes of one tensor is refused with the tensor named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box, view
from liver.topology.layout import Layout


class RankView(Protocol):
    """Who holds what: the interface the planner and the executor need of a view."""

    @property
    def size(self) -> int: ...

    def box(self, spec: TensorSpec, rank: int) -> Box | None:
        """The box of ``spec`` that ``rank`` holds (None: nothing, or an empty shard)."""
        ...


@dataclass(frozen=True)
class LayoutView:
    """The analytic view of a Layout (``view.view``) as a RankView."""

    layout: Layout

    @property
    def size(self) -> int:
        return self.layout.size

    def box(self, spec: TensorSpec, rank: int) -> Box | None:
        return view(spec, self.layout, rank)


@dataclass(frozen=True)
class Survivors:
    """The ranks ``ranks`` of a view, renumbered 0.. in that order: what is left of a generation
    after some of its processes vanished."""

    view: "Layout | RankView"
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def box(self, spec: TensorSpec, rank: int) -> Box | None:
        return box_of(self.view, spec, self.ranks[rank])


def box_of(v: "Layout | RankView", spec: TensorSpec, rank: int) -> Box | None:
    """``rank``'s box of ``spec`` under a Layout (its analytic view) or any RankView."""
    return view(spec, v, rank) if isinstance(v, Layout) else v.box(spec, rank)


def _empty(box: Box) -> bool:
    return any(hi <= lo for lo, hi in box)


@dataclass(frozen=True)
class BoxTable:
    """``boxes[name][rank]``: the boxes rank ``rank`` holds of tensor ``name`` (a tuple, possibly
    empty). Built and checked by ``BoxTable.build``."""

    size: int
    boxes: Mapping[str, tuple[tuple[Box, ...], ...]] = field(repr=False)
    name: str = "table"

    @staticmethod
    def build(size: int, boxes: Mapping[str, Iterable[Iterable[Box]]], specs: list[TensorSpec],
              name: str = "table") -> "BoxTable":
        """Checked: a row per spec and a list per rank; every box inside its tensor's shape, with
        its dimensions; at most one non-empty box per rank; every element held by some rank.
        ValueError naming the tensor and the rank otherwise."""
        if size < 1:
            raise ValueError(f"{name}: size={size}: allowed a positive rank count")
        by_name = {s.name: s for s in specs}
        unknown = sorted(set(boxes) - set(by_name))
        if unknown:
            raise ValueError(f"{name}: tensor {unknown[0]!r} has no spec")
        out: dict[str, tuple[tuple[Box, ...], ...]] = {}
        for s in specs:
            if s.name not in boxes:
                raise ValueError(f"{name}: no boxes for tensor {s.name!r}")
            rows = tuple(tuple(tuple((int(lo), int(hi)) for lo, hi in b) for b in r) for r in boxes[s.name])
            if len(rows) != size:
                raise ValueError(f"{name}: tensor {s.name!r} has boxes for {len(rows)} ranks; {size} required")
            for rank, row in enumerate(rows):
                for b in row:
                    if len(b) != len(s.shape) or any(not 0 <= lo <= hi <= n for (lo, hi), n in zip(b, s.shape)):
                        raise ValueError(f"{name}: rank {rank}'s box {list(b)} of {s.name!r} is outside its shape "
                                         f"{list(s.shape)}")
            rows = tuple(tuple(b for b in row if not _empty(b)) for row in rows)
            for rank, row in enumerate(rows):
                if len(row) > 1:
                    raise ValueError(f"{name}: rank {rank} holds {len(row)} boxes of {s.name!r}; allowed one")
            if s.numel and not _covers(rows, s):
                raise ValueError(f"{name}: the ranks' boxes of {s.name!r} do not cover it (shape {list(s.shape)})")
            out[s.name] = rows
        return BoxTable(size, out, name)

    @staticmethod
    def of_view(view_: RankView, specs: list[TensorSpec]) -> "BoxTable":
        """The table of any RankView (a Layout's, to compare the two paths)."""
        boxes = {s.name: [[b] if (b := view_.box(s, r)) is not None else [] for r in range(view_.size)]
                 for s in specs}
        return BoxTable.build(view_.size, boxes, specs)

    def box(self, spec: TensorSpec, rank: int) -> Box | None:
        row = self.boxes[spec.name][rank]
        return row[0] if row else None


def _covers(rows: tuple[tuple[Box, ...], ...], spec: TensorSpec) -> bool:
    """Every element of the tensor lies in some rank's box (boxes cut the tensor into a grid of
    cells along their edges; each cell is inside a box or outside all)."""
    boxes = [b for row in rows for b in row if not _empty(b)]
    if not boxes:
        return False
    cuts = [sorted({0, n, *(lo for b in boxes for lo, _ in [b[d]]), *(hi for b in boxes for _, hi in [b[d]])})
            for d, n in enumerate(spec.shape)]
    cells = [[]]
    for d, c in enumerate(cuts):
        cells = [cell + [(lo, hi)] for cell in cells for lo, hi in zip(c, c[1:]) if hi > lo]
        if len(cells) > 1 << 20:
            raise ValueError(f"the boxes of {spec.name!r} cut it into more than 2**20 cells: too many to check")
    return all(any(all(blo <= lo and hi <= bhi for (lo, hi), (blo, bhi) in zip(cell, b)) for b in boxes)
               for cell in cells)
