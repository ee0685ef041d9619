"""Pre-copy: which part of a handoff's state is copied to its destinations before the switch and
kept current there by replaying each step's update (liver/runtime/mirror.py), in which slices,
and what is left to stream at the switch. Pure: every process works out the same answer from the
global plan, without talking.

A destination shard (one geometry group of tensors, a parameter with its moments, in one new
rank's box) is mirrored when
- its process follows the steps: an old rank (it trains in the Active World until the switch), or
  a cold joiner that receives each step's update from them (``to``: those processes);
- it is not kept (the same box on the same process: nothing would move anyway);
- the engine replays the update of its tensors (``replayable``), and
- it fits in its process's memory cap for mirrors, taken in streaming order.

The mirrored tasks are cut into slices of whole layers: a slice is copied between two iteration
boundaries, and no process sends or receives more than ``slice_bytes`` in one (a layer larger than
that is a slice of its own; no limit: one slice).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from liver.planner.plan import Plan, TransferTask

Key = tuple[tuple[str, ...], int]  # (a geometry group's tensors, the destination process)


@dataclass(frozen=True)
class Precopy:
    mirrored: frozenset[Key]
    slices: tuple[tuple[int, ...], ...]   # the layers of each slice, in streaming order
    mirror_bytes: dict[int, int]          # per destination process: the memory of its mirrors
    bytes_mirrored: int                   # over the network and locally, all processes
    bytes_left: int                       # what still moves at the switch (sends and local copies)
    capped: frozenset[Key] = frozenset()  # replayable and movable, but over the memory cap

    def selects(self, task: TransferTask) -> bool:
        """The task is pre-copied (never a kept one)."""
        return task.kind != "keep" and (task.tensors, task.dst_proc) in self.mirrored

    def in_slice(self, i: int) -> Callable[[TransferTask], bool]:
        layers = frozenset(self.slices[i])
        return lambda t: t.layer in layers and self.selects(t)

    def left(self, task: TransferTask) -> bool:
        """The task moves at the switch."""
        return not self.selects(task)

    def summary(self) -> dict:
        return {"slices": len(self.slices), "bytes_mirrored": self.bytes_mirrored, "bytes_left": self.bytes_left,
                "max_mirror_bytes": max(self.mirror_bytes.values(), default=0),
                "capped_shards": len(self.capped)}


def choose(plan: Plan, replayable: Callable[[str], bool], cap_bytes: int = 0, slice_bytes: int | None = None,
           to: Iterable[int] | None = None) -> Precopy:
    """``replayable(name)``: the engine replays that tensor's update; ``cap_bytes``: the most memory
    a process may give its mirrors (0: no cap); ``slice_bytes``: the most one process sends or
    receives in one slice (a larger layer is a slice alone; None: one slice); ``to``: the processes
    whose boxes may be mirrored (default: the old ones)."""
    if slice_bytes is not None and slice_bytes < 1:
        raise ValueError(f"slice_bytes={slice_bytes}: must be positive, or None for one slice")
    old = set(plan.old_procs) if to is None else set(to)
    box_bytes: dict[Key, int] = defaultdict(int)
    order: list[Key] = []
    for t in plan.tasks:  # in streaming order (layer, then the plan's order)
        if t.kind == "keep" or t.dst_proc not in old or not all(replayable(n) for n in t.tensors):
            continue
        k = (t.tensors, t.dst_proc)
        if k not in box_bytes:
            order.append(k)
        box_bytes[k] += t.nbytes  # tasks into one box tile it once: their bytes sum to the box's
    used: dict[int, int] = defaultdict(int)
    mirrored, capped = set(), set()
    for k in order:
        if cap_bytes and used[k[1]] + box_bytes[k] > cap_bytes:
            capped.add(k)
            continue
        used[k[1]] += box_bytes[k]
        mirrored.add(k)
    mirrored_f = frozenset(mirrored)
    pre = Precopy(mirrored_f, (), dict(used), 0, 0, frozenset(capped))
    per_layer: dict[int, dict[int, int]] = {}
    moved = left = 0
    for t in plan.tasks:
        if t.kind == "keep":
            continue
        if not pre.selects(t):
            left += t.nbytes
            continue
        moved += t.nbytes
        load = per_layer.setdefault(t.layer, defaultdict(int))
        load[t.src_proc] += t.nbytes
        if t.dst_proc != t.src_proc:
            load[t.dst_proc] += t.nbytes
    slices: list[tuple[int, ...]] = []
    cur: list[int] = []
    cur_load: dict[int, int] = defaultdict(int)
    for layer in per_layer:  # in streaming order
        load = per_layer[layer]
        over = slice_bytes is not None and (any(b > slice_bytes for b in load.values())
                                            or any(v > slice_bytes for v in cur_load.values()))
        if cur and (over or (slice_bytes is not None and any(cur_load[p] + b > slice_bytes
                                                             for p, b in load.items()))):
            slices.append(tuple(cur))  # (a layer larger than a slice is a slice alone)
            cur, cur_load = [], defaultdict(int)
        cur.append(layer)
        for p, b in load.items():
            cur_load[p] += b
    if cur:
        slices.append(tuple(cur))
    return Precopy(mirrored_f, tuple(slices), dict(used), moved, left, frozenset(capped))
