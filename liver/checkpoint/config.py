"""The periodic checkpoint's options (the fail-stop fallback)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """``every``: an asynchronous DCP checkpoint after every this many steps; 0: none (a fail-stop
    then restarts from the first step). ``keep``: the newest this many published checkpoints stay
    on disk (an older one is removed only once a newer one is published whole); ``escalate_after``:
    this many failed in a row is an error for the operator, not a warning; ``start_from``: the job
    starts from this checkpoint (a run's ``ckpt`` directory: its newest whole one; or one
    checkpoint's directory), on whatever layout it starts with (``liver run --from-checkpoint``)."""

    every: int = 10
    keep: int = 3
    escalate_after: int = 3
    start_from: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"checkpoint.every={self.every!r}: allowed 0 (off) or a positive step count")
        for name in ("keep", "escalate_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10**6:
                raise ValueError(f"checkpoint.{name}={v!r}: allowed a whole number from 1 to 1000000")
        if self.start_from is not None and (not isinstance(self.start_from, str) or not self.start_from):
            raise ValueError(f"checkpoint.start_from={self.start_from!r}: allowed a checkpoint's path")
