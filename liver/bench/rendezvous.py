"""``liver bench rendezvous``: what a new generation's rendezvous costs the job's store as the ranks
grow, the part of a restart's (and a joiner's) group set-up that the store serves. ``N`` ranks,
spread over ``--procs`` worker processes (a thread a rank), each does what a rank does before its
communicators exist: it connects to the store, publishes its address, counts itself in, waits for
the last rank, and reads rank 0's key (NCCL's unique id). Each ``N`` of ``--ranks`` is run
``--repeats`` times, interleaved; the wall time from the start to the last rank done, its median,
and the least-squares time per rank over the counts. The store is torch's TCPStore on loopback, in
this process (as the controller's is in its own); nothing else runs."""

from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time
from datetime import timedelta
from typing import Any


def _rank(host: str, port: int, key: str, rank: int, n: int, done: list[float]) -> None:
    import torch.distributed as dist

    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120), wait_for_workers=False)
    store.set(f"{key}/addr/{rank}", f"rank{rank}")
    if store.add(f"{key}/count", 1) == n:
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"])
    store.get(f"{key}/addr/0")
    done.append(time.time())


def _worker(host: str, port: int, conn) -> None:
    """Runs its share of each round's ranks (a thread each); replies with their end times."""
    import torch.distributed  # noqa: F401  (imported before the rounds: not timed)

    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        key, ranks, n, start = msg
        while time.time() < start:
            time.sleep(0.0005)
        done: list[float] = []
        threads = [threading.Thread(target=_rank, args=(host, port, key, r, n, done)) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.send(done)


def run(ranks: list[int], procs: int = 8, repeats: int = 3) -> dict[str, Any]:
    import torch.distributed as dist

    if not ranks or min(ranks) < 1 or procs < 1 or repeats < 1:
        raise ValueError(f"--ranks={ranks} --procs={procs} --repeats={repeats}: allowed positive counts")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=120), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    pipes, workers = [], []
    for _ in range(procs):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=("127.0.0.1", store.port, b), daemon=True)
        p.start()
        pipes.append(a)
        workers.append(p)
    walls: dict[int, list[float]] = {n: [] for n in ranks}
    try:
        for pipe in pipes:  # (every worker's imports done before the first round)
            if pipe.recv() != "ready":
                raise RuntimeError("a rendezvous worker did not start")
        for r in range(repeats):
            order = ranks[r % len(ranks):] + ranks[: r % len(ranks)]  # (interleaved, a new first each round)
            for n in order:
                start = time.time() + 0.2
                key = f"round{r}-{n}"
                for i, pipe in enumerate(pipes):
                    pipe.send((key, list(range(i, n, procs)), n, start))
                ends = [t for pipe in pipes for t in pipe.recv()]
                if len(ends) != n:
                    raise RuntimeError(f"{n} ranks: {len(ends)} ended")
                walls[n].append(max(ends) - start)
    finally:
        for pipe in pipes:
            pipe.send(None)
        for p in workers:
            p.join(10)
    med = {n: statistics.median(w) for n, w in walls.items()}
    xs = sorted(med)
    mx, my = statistics.mean(xs), statistics.mean(med[x] for x in xs)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (med[x] - my) for x in xs) / var if var else None
    return {"what": "N ranks' rendezvous through one TCPStore on loopback (connect, publish, count in, wait for "
                    "the last, read rank 0's key), a thread a rank over the worker processes; wall time from "
                    "the start to the last rank done",
            "procs": procs, "repeats": repeats,
            "rows": [{"ranks": n, "wall_s": med[n], "spread_s": [min(walls[n]), max(walls[n])]} for n in xs],
            "s_per_rank": slope, "fixed_s": my - slope * mx if slope is not None else None,
            "runs": {str(n): w for n, w in walls.items()}}
