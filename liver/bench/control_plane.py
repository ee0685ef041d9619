"""``liver bench control-plane``: one ``liver controller`` training a job on one real node, and many
simulated node agents syncing with it, as ``liver agent`` does (register once, then sync at the
interval the controller gives, on a kept-open HTTP connection), in a few processes of threads.

For each count of simulated nodes, in one call: the syncs the controller took per second, each
sync's round trip (median, p99), the controller's answer to ``GET /status`` meanwhile (its loop
and endpoint under that load: median, p99, max), the interval it told the nodes, the job's steps
per second against the same job with no simulated node (the controller shares the machine), and
a decision on time under that load: one simulated node goes silent 2 s in, and the stage says
when the controller declared it lost against when it promises to (its agent timeout, or five
sync intervals: ``lost_after_s``; a stage needs about that long and more to see it).

    liver bench control-plane --nodes 0,100,300,1000 --seconds 10 --out OUT
    liver bench control-plane ... --syncs-per-s 1000000   # every node every 0.1 s, as before
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from liver.bench.nodes import LocalJob
from liver.controller.membership import LOST_AFTER_SYNCS


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


SILENT_AFTER_S = 2.0  # the first simulated node of a stage stops syncing this long after they all start


def simulate(url: str, token: str, first: int, count: int, seconds: float, silent: bool = False) -> dict[str, Any]:
    """``count`` simulated agents (threads), named sim-FIRST..., each registering with one slot and
    syncing for ``seconds``: their round trips and the intervals they were given. ``silent``: the
    first goes silent ``SILENT_AFTER_S`` in (a node lost), its last sync's end returned."""
    from liver.agent.service import Link

    rtts: list[float] = []
    intervals: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(count) if count else None
    end_at = time.time() + seconds
    last_sync: list[float] = []

    def agent(i: int) -> None:
        link, name, done = Link(url, token, timeout_s=10.0), f"sim-{first + i}", 0
        try:
            link.post("/agent/register", {"node": name, "slots": 1, "host": "sim", "pid": 0})
            start.wait(30)
            mine, given = [], []
            stop_at = time.time() + SILENT_AFTER_S if silent and i == 0 else end_at
            while time.time() < min(end_at, stop_at):
                t0 = time.perf_counter()
                reply = link.post("/agent/sync", {"node": name, "done": done})
                mine.append(time.perf_counter() - t0)
                done = max([done] + [c["id"] for c in reply.get("commands", ())])
                wait = float(reply.get("next_sync_s", 0.1))
                given.append(wait)
                if stop_at < end_at and time.time() + wait >= stop_at:  # (its last sync: silent from here on)
                    last_sync.append(time.time())
                    break
                time.sleep(wait)
            with lock:
                rtts.extend(mine)
                intervals.extend(given)
        except Exception as e:  # (reported: a simulated node that could not keep up)
            with lock:
                errors.append(f"{type(e).__name__}: {e}"[:200])
        finally:
            link.close()

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return {"rtts": rtts, "intervals": intervals, "errors": errors, "silent_since": last_sync[0] if last_sync else None}


def _stage(job: LocalJob, nodes: int, first: int, seconds: float, procs: int) -> dict[str, Any]:
    """``nodes`` simulated agents for ``seconds``; the controller's answers to /status meanwhile."""
    from liver.controller.endpoint import request

    per = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)] if nodes else []
    code = "import json, sys; from liver.bench.control_plane import simulate; " \
           "print(json.dumps(simulate(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), " \
           "sys.argv[6] == '1')))"
    sims, base = [], first
    for k, n in enumerate(per):
        sims.append(subprocess.Popen([sys.executable, "-c", code, job.url, job.token, str(base), str(n), str(seconds),
                                      "1" if k == 0 else "0"], stdout=subprocess.PIPE, text=True))
        base += n
    time.sleep(2.0 if nodes else 0.0)  # (their registrations first)
    status, t_end, lost_at, lost_after = [], time.time() + seconds - 2.0, None, None
    step0, t0 = job.status()["step"], time.time()
    while time.time() < t_end:
        a = time.perf_counter()
        s = request(job.url, job.token, "GET", "/status")[1]
        status.append(time.perf_counter() - a)
        silent = next((n for n in s.get("nodes", ()) if n["node"] == f"sim-{first}"), None)
        if nodes and lost_at is None and silent is not None and not silent["up"]:
            lost_at = time.time()  # (the first look that shows it lost: within 0.2 s and a status's time)
        time.sleep(0.2)
    steps_per_s = (job.status()["step"] - step0) / (time.time() - t0)
    got = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in sims]
    since = got[0]["silent_since"] if got else None
    rtts = [x for g in got for x in g["rtts"]]
    intervals = [x for g in got for x in g["intervals"]]
    interval = statistics.median(intervals) if intervals else None
    if interval is not None:  # what the controller promises: lost after its timeout or five intervals
        timeout = json.loads((job.run_dir / "config.json").read_text())["controller"]["agent_timeout_s"]
        lost_after = max(timeout, LOST_AFTER_SYNCS * interval)
    return {"nodes": nodes, "syncs_per_s": len(rtts) / seconds if nodes else 0.0,
            "sync_rtt_median_s": statistics.median(rtts) if rtts else None, "sync_rtt_p99_s": _percentile(rtts, 0.99),
            "interval_s": interval,
            "status_median_s": statistics.median(status), "status_p99_s": _percentile(status, 0.99),
            "status_max_s": max(status), "steps_per_s": steps_per_s,
            # a node gone silent: declared lost this long after its last sync (None: not within the stage)
            "lost_detected_s": lost_at - since if lost_at is not None and since is not None else None,
            "lost_after_s": lost_after,
            "errors": sorted({e for g in got for e in g["errors"]})[:5]}


def run(args) -> dict[str, Any]:
    counts = [int(x) for x in str(args.nodes).split(",")]
    if any(not 0 <= n <= 5000 for n in counts) or args.seconds < 4 or args.procs < 1:
        raise ValueError(f"--nodes={args.nodes!r} (each 0 to 5000), --seconds={args.seconds} (at least 4), "
                         f"--procs={args.procs} (at least 1)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    job = LocalJob(run_dir, ["--gpus", "1", "--steps", "100000000", "--end-after-events", "-1", "--ckpt-every", "0",
                             "--on-join", "never", "--companion-share", "0",
                             "--set", f"controller.syncs_per_s={args.syncs_per_s:g}"], network=False)
    rows, first = [], 0
    try:
        job.agent("real")
        job.wait(lambda s: s["step"] >= 3, "the job's first steps", 120)
        for n in counts:
            rows.append(_stage(job, n, first, args.seconds, args.procs))
            first += n
            print(json.dumps(rows[-1]), flush=True)
    finally:
        job.close()
    calm = next((r["steps_per_s"] for r in rows if r["nodes"] == 0), None)
    for r in rows:
        r["steps_vs_no_nodes"] = r["steps_per_s"] / calm if calm else None
    result = {"cpus": os.cpu_count(), "seconds": args.seconds, "syncs_per_s": args.syncs_per_s, "rows": rows}
    (out / "control_plane.json").write_text(json.dumps(result, indent=1))
    return result


__all__ = ["run", "simulate"]
