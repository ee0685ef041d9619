"""Fake worlds: a World whose process groups are torch's fake process group.

Every collective of a fake group returns at once and moves no data (torch's ``FakeProcessGroup``,
a private testing backend wrapped here and nowhere else). Two uses:

- metadata: a model built and parallelised on the meta device as rank r of a layout far larger
  than the machine, to read its DTensor placements (``liver.engine.native.resource``) before any
  process of that layout exists;
- a cold joiner's warm-up of a DTensor engine: the same code paths as the real step (FSDP's
  all-gathers, DTensor's redistributions), with nobody else involved. The numbers are meaningless
  and thrown away, as on the mock world (``liver.world.mock``).

Unlike ``MockWorld``'s groups, these are real ``ProcessGroup`` objects, so a ``DeviceMesh`` can be
built over them (``World.mesh``).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FakeProcessGroup, ProcessGroup

from liver.topology.layout import Layout
from liver.world.group import Group
from liver.world.world import World

_ids = itertools.count()


def fake_pg(name: str, rank: int, size: int) -> ProcessGroup:
    """A ``ProcessGroup`` of ``size`` members of which this process is ``rank``; no peer exists."""
    backend = FakeProcessGroup._create_internal(rank, size)
    pg = ProcessGroup(dist.HashStore(), rank, size)
    pg._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    for dev in ("cpu", "cuda"):
        pg._register_backend(torch.device(dev), ProcessGroup.BackendType.CUSTOM, backend)
    if hasattr(pg, "_set_group_name"):
        pg._set_group_name(name)
    return pg


class FakeGroup(Group):
    """A group over a fake process group: collectives return without touching their outputs."""

    def __init__(self, name: str, members: list[int], rank: int, backend: str, device: torch.device) -> None:
        uid = f"{name.replace('/', '_')}_{next(_ids)}"
        super().__init__(name, members, rank, fake_pg(uid, rank, len(members)), backend, device)

    def destroy(self) -> None:
        self.comm = None
        self.pg = None


class FakeWorld(World):
    """Rank ``rank`` of ``layout`` over fake groups (every axis, one-member ones too)."""

    @classmethod
    def build_fake(cls, generation: int, layout: Layout, rank: int, backend: str,
                   device: torch.device) -> "FakeWorld":
        prefix = f"fake/gen{generation}"
        groups = {"all": FakeGroup(f"{prefix}/all", list(range(layout.size)), rank, backend, device)}
        for axis, members_of in (("tp", layout.tp_group), ("dp", layout.dp_group), ("pp", layout.pp_group)):
            members = members_of(rank)
            groups[axis] = FakeGroup(f"{prefix}/{axis}", members, members.index(rank), backend, device)
        return cls(generation, layout, rank, backend, device, groups, 0.0)

    def solo_process_group(self, name: str) -> ProcessGroup:
        """A fake one (no thread of its own: a template may fork after it)."""
        return fake_pg(f"fake_solo_{name}_{next(_ids)}", 0, 1)
