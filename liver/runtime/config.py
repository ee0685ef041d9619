"""A worker's preparation options: how and how fast the companion builds the next generation."""

from __future__ import annotations

from dataclasses import dataclass

CONNECT_MODES = ("auto", "background", "boundary")


@dataclass(frozen=True, kw_only=True, slots=True)
class PrepareConfig:
    """- ``connect``: when the new groups' first collectives run: "background" (in the companion thread,
      beside training), "boundary" (every member at one iteration boundary: no communicator is set
      up while collectives of the running generation are in flight, at the price of one longer
      boundary), or "auto": "boundary" on NCCL (operations on two NCCL communicators at once may
      deadlock), "background" on gloo.
    - ``companion_share``: the companion takes at most this share of each training step
      (runtime/pace.py); 0: no limit. A deadline lifts it.
    - ``mock_steps``: training steps a cold joiner runs on its mock world before it joins.
    - ``group_timeout_s``: a rendezvous or collective of a new generation's groups gives up after this.
    - ``precopy``: once every rank is ready, copy the state that moves between old ranks to its
      destinations beside training, a slice of layers between two boundaries, and keep it current by
      replaying each step's update there (liver/runtime/mirror.py): the switch then moves only what a
      cold joiner receives and what did not fit. Costs, while it lasts, one more copy of the mirrored
      shards in memory and their gradients sent every step; only for an engine that replays its
      update (``EngineAdapter.replay``); off by default.
    - ``precopy_slice_mib``: the most one process sends or receives in one slice (MiB; 0: one slice,
      all of it): a slice is copied beside one step, whose update waits for what is left of its copy,
      and every step from then on to the switch sends the gradients of what is mirrored.
    - ``precopy_memory_mib``: the most memory a process gives its mirrors (MiB; 0: no cap); the
      shards beyond it, in streaming order, stream at the switch.
    """

    connect: str = "auto"
    companion_share: float = 0.0015
    mock_steps: int = 2
    group_timeout_s: float = 120.0
    precopy: bool = False
    precopy_slice_mib: int = 0
    precopy_memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.connect not in CONNECT_MODES:
            raise ValueError(f"prepare.connect={self.connect!r}: allowed {', '.join(map(repr, CONNECT_MODES))}")
        if not 0.0 <= self.companion_share <= 1.0:
            raise ValueError(f"prepare.companion_share={self.companion_share!r}: allowed a fraction of a step "
                             "from 0 (no limit) to 1")
        if isinstance(self.mock_steps, bool) or not isinstance(self.mock_steps, int) or not 0 <= self.mock_steps <= 1000:
            raise ValueError(f"prepare.mock_steps={self.mock_steps!r}: allowed an integer from 0 to 1000")
        if not 1.0 <= self.group_timeout_s <= 86400.0:
            raise ValueError(f"prepare.group_timeout_s={self.group_timeout_s!r}: allowed 1 to 86400 seconds")
        if not isinstance(self.precopy, bool):
            raise ValueError(f"prepare.precopy={self.precopy!r}: allowed true or false")
        for name, lo in (("precopy_slice_mib", 0), ("precopy_memory_mib", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= 1 << 20:
                raise ValueError(f"prepare.{name}={v!r}: allowed an integer from {lo} to {1 << 20} (MiB)")

    def connect_for(self, backend: str) -> str:
        """``connect`` with "auto" resolved for ``backend``."""
        if self.connect != "auto":
            return self.connect
        return "boundary" if backend == "nccl" else "background"
