"""Mock world: the World interface with every collective answered locally.

A cold worker builds its model in the new layout and runs warm-up steps against it (allocator,
kernels, autotuning, the CUDA context) while the old generation keeps training: nobody else is
involved, so nothing blocks and nothing waits for it. The numbers it computes are meaningless
and thrown away; the switch delivers the real state.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from liver.topology.layout import Layout
from liver.world.group import Done, LocalGroup
from liver.world.world import World


class MockGroup(LocalGroup):
    """A group of ``size`` nominal members of which only this process exists."""

    def isend(self, t: torch.Tensor, dst: int, tag: int = 0) -> Any:
        return Done()

    def irecv(self, t: torch.Tensor, src: int, tag: int = 0) -> Any:
        t.zero_()  # a peer's activations or gradients: zeros keep the warm-up arithmetic finite
        return Done()

    def exchange(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                 tag: int = 0) -> None:
        for w in self.post(sends, recvs, tag):
            w.wait()

    def post(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
             tag: int = 0) -> list[Any]:
        return [self.irecv(t, p, tag) for t, p in recvs]


class MockWorld(World):
    """Rank ``rank`` of ``layout`` with mock groups of the right sizes and members."""

    @classmethod
    def build_mock(cls, generation: int, layout: Layout, rank: int, backend: str,
                   device: torch.device) -> "MockWorld":
        groups = {"all": MockGroup(f"mock/gen{generation}/all", list(range(layout.size)), rank,
                                   backend, device)}
        for axis, members_of in (("tp", layout.tp_group), ("dp", layout.dp_group),
                                 ("pp", layout.pp_group)):
            members = members_of(rank)
            groups[axis] = MockGroup(f"mock/gen{generation}/{axis}", members, members.index(rank),
                                     backend, device)
        return cls(generation, layout, rank, backend, device, groups, 0.0)

    def activate(self) -> None:
        raise RuntimeError("a mock world cannot be registered with torch.distributed")

    @contextlib.contextmanager
    def registered(self):
        """Nothing to register: its groups have no communicator."""
        yield self
