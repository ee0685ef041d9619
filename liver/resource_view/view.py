"""The view function V(T, C, r): the hyper-rectangle of logical tensor T held by rank r under layout C.

A box is a tuple of (lo, hi) per dimension in the tensor's global coordinates. Pure metadata.
"""

from __future__ import annotations

from liver.resource_view.spec import TensorSpec
from liver.topology.layout import Layout

Box = tuple[tuple[int, int], ...]


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def view(spec: TensorSpec, layout: Layout, rank: int) -> Box | None:
    """The box of ``spec`` that ``rank`` holds under ``layout``, or None if it holds none.

    Every DP replica of a stage holds the same box (replicated optimizer state); the TP rank
    selects an even slice of ``shard_dim``. A distributed optimizer (ZeRO-1) would add a further
    split of the optimizer kinds over the DP coordinate here.
    """
    c = layout.coord(rank)
    if layout.stage_of_layer(spec.layer) != c.pp:
        return None
    box = list(full_box(spec.shape))
    if spec.shard_dim is not None:
        n = spec.shape[spec.shard_dim]
        assert n % layout.tp == 0, (spec.name, n, layout.tp)
        step = n // layout.tp
        box[spec.shard_dim] = (c.tp * step, (c.tp + 1) * step)
    return tuple(box)


def local_shape(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


def intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (alo, ahi), (blo, bhi) in zip(a, b):
        lo, hi = max(alo, blo), min(ahi, bhi)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def relative(box: Box, origin: Box) -> Box:
    """``box`` in the local coordinates of a shard whose global box is ``origin``."""
    return tuple((lo - o, hi - o) for (lo, hi), (o, _) in zip(box, origin))


def box_numel(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n
