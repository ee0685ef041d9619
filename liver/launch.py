"""Worker processes for tests and local runs: a pool of long-lived spawned processes that run
distributed functions, each call in its own namespace of the pool's TCPStore.

Processes are reused across calls (importing torch costs seconds); every call has a timeout and
a worker that dies or hangs fails the call with its rank named.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import traceback
from typing import Any, Callable

from liver.world.world import make_store



def _worker_main(index: int, inbox: mp.Queue, outbox: mp.Queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    while True:
        msg = inbox.get()
        if msg is None:
            return
        call_id, fn, kwargs = msg
        try:
            outbox.put((call_id, index, True, fn(**kwargs)))
        except BaseException:  # report, keep serving
            outbox.put((call_id, index, False, traceback.format_exc()))


class WorkerError(RuntimeError):
    pass


class WorkerPool:
    """``size`` spawned processes and a TCPStore owned by this (parent) process."""

    def __init__(self, size: int) -> None:
        # forked from one server that imported torch once (a spawned process imports it itself:
        # seconds of CPU each); the server is single-threaded, as a fork needs
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "liver.world.world"])
        self.store, self.store_addr = make_store(timeout_s=300)
        self.outbox: mp.Queue = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.procs = [ctx.Process(target=_worker_main, args=(i, self.inboxes[i], self.outbox),
                                  daemon=True) for i in range(size)]
        for p in self.procs:
            p.start()
        self._ids = itertools.count()

    @property
    def size(self) -> int:
        return len(self.procs)

    def run(self, fn: Callable[..., Any], per_rank: list[dict[str, Any]],
            timeout: float = 240.0) -> list[Any]:
        """Run ``fn(store_addr=..., namespace=..., **per_rank[i])`` on workers 0..n-1; results by rank."""
        call_id = next(self._ids)
        n = len(per_rank)
        if n > self.size:
            raise ValueError(f"ranks={n} exceeds pool size={self.size}")
        for i, kw in enumerate(per_rank):
            self.inboxes[i].put((call_id, fn, {"store_addr": self.store_addr,
                                               "namespace": f"call{call_id}", **kw}))
        results: dict[int, Any] = {}
        errors: list[str] = []
        while len(results) + len(errors) < n:
            try:
                cid, idx, ok, value = self.outbox.get(timeout=timeout)
            except queue.Empty:
                dead = [i for i in range(n) if not self.procs[i].is_alive()]
                self.close(force=True)
                raise WorkerError(f"{fn.__name__}: no answer within {timeout}s "
                                  f"(dead workers: {dead}, answered: {sorted(results)})")
            if cid != call_id:
                continue
            if ok:
                results[idx] = value
            else:
                errors.append(f"rank {idx}:\n{value}")
        if errors:
            raise WorkerError("\n".join(errors))
        return [results[i] for i in range(n)]

    def close(self, force: bool = False) -> None:
        for q, p in zip(self.inboxes, self.procs):
            if p.is_alive() and not force:
                q.put(None)
        for p in self.procs:
            p.join(timeout=0 if force else 10)
            if p.is_alive():
                p.kill()
        self.procs = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
