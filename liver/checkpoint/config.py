"""The periodic checkpoint's options (the fail-stop fallback)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """``every``: an asynchronous DCP checkpoint after every this many steps; 0: none (a fail-stop
    then restarts from the first step)."""

    every: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"checkpoint.every={self.every!r}: allowed 0 (off) or a positive step count")
