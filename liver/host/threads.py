"""Threads: a worker's thread count, as the user's ``OMP_NUM_THREADS`` sets it (checked before the
job starts), and every thread of this process: what a setting made per thread (CPU affinity,
priority) must be applied to, threads the process already started (its communicators') included."""

from __future__ import annotations

import os
from typing import Callable


def each_thread(apply: Callable[[int], None]) -> None:
    """``apply(tid)`` for every thread of this process (0, this thread, where /proc is missing);
    a thread that ended meanwhile is skipped."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            apply(tid)
        except ProcessLookupError:
            pass


def worker_threads(backend: str, env: dict[str, str] | None = None) -> int:
    """A worker's intra-op threads: the user's ``OMP_NUM_THREADS`` where set (checked before the
    job starts: ``check_threads``), else 1, as torchrun sets it for several processes a node."""
    value = (os.environ if env is None else env).get("OMP_NUM_THREADS", "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else 1


def check_threads(env: dict[str, str] | None = None) -> None:
    """``OMP_NUM_THREADS`` unset or a positive count; ValueError naming it otherwise (before anything starts)."""
    value = (os.environ if env is None else env).get("OMP_NUM_THREADS")
    if value is not None and not (value.strip().isdigit() and 1 <= int(value) <= 4096):
        raise ValueError(f"OMP_NUM_THREADS={value!r} (environment): allowed unset or a thread count from 1 to 4096")
