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
    """

    connect: str = "auto"
    companion_share: float = 0.0015
    mock_steps: int = 2
    group_timeout_s: float = 120.0

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

    def connect_for(self, backend: str) -> str:
        """``connect`` with "auto" resolved for ``backend``."""
        if self.connect != "auto":
            return self.connect
        return "boundary" if backend == "nccl" else "background"
