"""A flat range of a tensor as boxes.

Megatron-Core's distributed optimizer gives each data-parallel rank a contiguous range of the
flattened gradient buffer, so a rank's optimizer state of one parameter is the elements
``[start, stop)`` of that parameter's local tensor in row-major order, not a box. A range of an
n-dimensional tensor is the union of at most 2n - 1 boxes: a partial row at each end, per
dimension, and whole slabs between. Pure arithmetic.
"""

from __future__ import annotations

from math import prod

from liver.resource_view.view import Box


def range_boxes(shape: tuple[int, ...], start: int, stop: int) -> list[Box]:
    """The boxes (in the tensor's own coordinates, row-major order) whose union is the flat range
    ``[start, stop)`` of a tensor of ``shape``: disjoint, at most ``2 * len(shape) - 1`` of them, in
    the order of their first elements. ValueError for a range outside the tensor."""
    n = prod(shape)
    if not 0 <= start <= stop <= n:
        raise ValueError(f"flat range [{start}, {stop}) is outside a tensor of shape {list(shape)} ({n} elements)")
    return _boxes(tuple(shape), start, stop)


def _boxes(shape: tuple[int, ...], start: int, stop: int) -> list[Box]:
    if start >= stop:
        return []
    if not shape:
        return [()]
    inner = prod(shape[1:])
    (r0, o0), (r1, o1) = divmod(start, inner), divmod(stop, inner)
    if r0 == r1:  # inside one row of the first dimension
        return [((r0, r0 + 1), *b) for b in _boxes(shape[1:], o0, o1)]
    out: list[Box] = []
    if o0:  # the first row's tail
        out += [((r0, r0 + 1), *b) for b in _boxes(shape[1:], o0, inner)]
        r0 += 1
    if r1 > r0:  # whole rows
        out.append(((r0, r1), *((0, k) for k in shape[1:])))
    if o1:  # the last row's head
        out += [((r1, r1 + 1), *b) for b in _boxes(shape[1:], 0, o1)]
    return out


def shifted(box: Box, origin: tuple[int, ...]) -> Box:
    """``box`` of a local tensor whose first element sits at ``origin`` of the global tensor, in
    the global tensor's coordinates."""
    return tuple((lo + o, hi + o) for (lo, hi), o in zip(box, origin))
