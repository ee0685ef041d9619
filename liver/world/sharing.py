"""Communicators a new generation takes over instead of creating them.

A group is a communicator over some processes in some order. A new generation's group whose
processes (in group-rank order) are those of a group of the Active World, or of a group made
earlier for the same generation (TP over every rank is also the group "all"; the transfer group
over the same processes), shares that group's communicator: nothing to create, nothing to connect,
and no new NCCL communicator set up beside running collectives.

Groups of the training thread and groups of background work (the CPU groups that periodic
checkpoints write through) never share: one communicator is used by one thread at a time.

Every member takes the same decision without talking: the Active World's groups follow from its
layout and processes, which every member knows from the generation's spec, and a generation's
groups are made in the same order on every process.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from liver.world.group import Group

Key = tuple[str, str, str, tuple[int, ...]]
LANES = ("train", "side")  # the training thread's groups; background work's groups


def _key(lane: str, backend: str, device: torch.device, procs: tuple[int, ...]) -> Key:
    if lane not in LANES:
        raise ValueError(f"lane={lane!r}: allowed {', '.join(map(repr, LANES))}")
    return lane, backend, str(device), procs


class Sharing:
    def __init__(self, pause: Callable[[], None] | None = None) -> None:
        self.pause = pause  # called before each group (a companion's pace)
        self._groups: dict[Key, tuple[Group, bool]] = {}  # -> (group, belongs to the Active World)
        self.created = 0  # communicators made through this object
        self.shared = 0   # groups that took over an existing one
        self.handed: list[Group] = []  # every group made here: one that stops half-way lets go of them

    @classmethod
    def of_active(cls, world, procs: list[int], pause: Callable[[], None] | None = None) -> "Sharing":
        """The communicators of the Active World ``world``, whose rank r is process ``procs[r]``."""
        s = cls(pause)
        for lane, groups in (("train", world.groups), ("side", world.cpu_groups)):
            for g in groups.values():
                if g.comm is not None:
                    s._groups.setdefault(_key(lane, g.backend, g.device, tuple(procs[m] for m in g.members)),
                                         (g, True))
        return s

    def group(self, store: dist.Store, name: str, members: list[int], rank: int, backend: str,
              device: torch.device, timeout: timedelta, procs: list[int] | None = None,
              lane: str = "train") -> Group:
        """Group ``name`` over ``members`` (ranks; rank r is process ``procs[r]``, default r):
        shared where a group of the same lane over the same processes in the same order exists,
        else created."""
        if self.pause is not None:
            self.pause()
        key = _key(lane, backend, device, tuple(procs[m] for m in members) if procs else tuple(members))
        if len(members) > 1 and key in self._groups:
            g, active = self._groups[key]
            self.shared += 1
            self.handed.append(g.share(name, members, inherited=active))
            return self.handed[-1]
        g = Group.create(store, name, members, rank, backend, device, timeout)
        self.handed.append(g)
        if g.comm is not None:
            self._groups[key] = (g, False)
            self.created += 1
        return g
