"""The node agent's options."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SLOTS = 4096


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentConfig:
    """- ``slots``: worker processes this node can hold (one per GPU on NCCL); unset: the GPU count
      on NCCL, 4 on CPU.
    - ``bind_cores``: CPU workers bound to cores of their slot's own where the node has a core per
      slot (GPU workers are never bound).
    - ``quiet``: worker output to its log file only, not the terminal.
    - ``start_timeout_s``: a worker process not forked by then, once its template has done its
      imports, fails its start: a joiner's handoff is cancelled with that reason, the job trains on."""

    slots: int | None = None
    bind_cores: bool = True
    quiet: bool = False
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.slots is not None and (isinstance(self.slots, bool) or not isinstance(self.slots, int)
                                       or not 1 <= self.slots <= MAX_SLOTS):
            raise ValueError(f"agent.slots={self.slots!r}: allowed 1 to {MAX_SLOTS} worker slots")
        if isinstance(self.start_timeout_s, bool) or not 0.5 <= self.start_timeout_s <= 3600:
            raise ValueError(f"agent.start_timeout_s={self.start_timeout_s!r}: allowed 0.5 to 3600 s")
