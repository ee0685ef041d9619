"""A process named so that it cannot be mistaken for another: its pid and its start time.

A worker watches its agent by this name (``runtime.fence``): a pid alone may be taken by a new
process once the agent is gone, its start time (``/proc/PID/stat``, clock ticks since boot) may not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


def _start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``, read past the command name (which may hold spaces and
    parentheses); None where the process is not (or this system has no ``/proc``)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    after = stat[stat.rindex(b")") + 2:].split()
    # (a zombie has ended: its parent has not yet collected it)
    return None if after[0] == b"Z" else int(after[19])


@dataclass(frozen=True, slots=True)
class ProcessRef:
    pid: int
    started: int  # clock ticks since boot

    @staticmethod
    def me() -> "ProcessRef | None":
        """This process, or None where the system does not say when a process started."""
        import os

        started = _start_ticks(os.getpid())
        return None if started is None else ProcessRef(os.getpid(), started)

    def alive(self) -> bool:
        """It still runs (a stopped process is alive: it may be continued)."""
        return _start_ticks(self.pid) == self.started

    def __str__(self) -> str:
        return f"{self.pid}:{self.started}"

    @staticmethod
    def parse(text: str) -> "ProcessRef":
        pid, started = text.split(":")
        return ProcessRef(int(pid), int(started))


__all__ = ["ProcessRef"]
