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

Commands reaching their node under that load: the job has a second real node, and each stage
scales out onto it and back in while it lasts (``scale-out 2``, ``scale-in 1``, ...); it reports how long
each command to a real node waited from queued to taken (``command_delivery_s``: with the
agents' standing waits, a round trip; without, ``--long-poll off``, up to a sync interval). The
simulated agents keep their standing waits too, as ``liver agent`` does.

    liver bench control-plane --nodes 0,100,300,1000 --seconds 10 --out OUT
    liver bench control-plane ... --syncs-per-s 1000000   # every node every 0.1 s, as before
    liver bench control-plane ... --long-poll off         # syncs every interval, commands wait for them, as before
"""

from __future__ import annotations

import json
import os
import random
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


def simulate(url: str, token: str, first: int, count: int, seconds: float, silent: bool = False,
             stop_on_eof: bool = False) -> dict[str, Any]:
    """``count`` simulated agents, named sim-FIRST..., each registering with one slot, then, as
    ``liver agent`` does: where the controller takes standing waits, one held request after another
    on a connection of its own (its heartbeat) and a sync on its other connection every
    ``QUIET_SYNC_S`` or so; otherwise a sync every interval the controller gives. For ``seconds``:
    the syncs' round trips, the intervals given, the waits answered. ``silent``: the first goes
    silent ``SILENT_AFTER_S`` after they all registered (a node lost), when it was last heard from
    returned. ``stop_on_eof``: they end when standard input closes (the stage's end), or after
    ``seconds`` and 300 more."""
    from liver.agent.service import Link
    from liver.protocol.agent import QUIET_SYNC_S

    rtts: list[tuple[float, float]] = []  # (sent, round trip) of each sync
    intervals: list[float] = []
    errors: list[str] = []
    waits: list[float] = []  # when each wait was sent
    lock = threading.Lock()
    start = threading.Barrier(count) if count else None
    end_at = time.time() + seconds + 300.0  # (at the latest; the stage ends them: ``over``)
    over = threading.Event()
    if stop_on_eof:
        threading.Thread(target=lambda: (sys.stdin.read(), over.set()), daemon=True).start()
    heard: list[float] = []  # the silent one's last request sent
    waiters: list[threading.Thread] = []

    def waiting(name: str, interval: float, stop_at: float) -> None:
        link, sent, given, last = Link(url, token, timeout_s=2 * interval + 10.0), [], [], 0.0
        try:
            while time.time() < stop_at and not over.is_set():
                last = time.time()
                reply = link.post("/agent/wait", {"node": name, "after": 0,
                                                  "wait_s": min(2 * interval, max(0.0, stop_at - last))})
                interval = float(reply.get("next_sync_s", interval))
                sent.append(last)
                given.append(interval)
        except Exception as e:  # (reported: a simulated node that could not keep up)
            with lock:
                errors.append(f"wait: {type(e).__name__}: {e}"[:200])
        finally:
            link.close()
            with lock:
                waits.extend(sent)
                intervals.extend(given)
                if stop_at < end_at:
                    heard.append(last)

    def agent(i: int) -> None:
        link, name, done = Link(url, token, timeout_s=10.0), f"sim-{first + i}", 0
        try:
            link.post("/agent/register", {"node": name, "slots": 1, "host": "sim", "pid": 0})
            start.wait(30)
            stop_at = time.time() + SILENT_AFTER_S if silent and i == 0 else end_at
            mine, given = [], []

            def sync() -> dict[str, Any]:
                """One sync, its round trip and the interval given recorded."""
                nonlocal last
                last, t0 = time.time(), time.perf_counter()
                reply = link.post("/agent/sync", {"node": name, "done": done})
                mine.append((last, time.perf_counter() - t0))
                given.append(float(reply.get("next_sync_s", 0.1)))
                return reply

            last = 0.0
            reply = sync()
            long_poll = bool(reply.get("waits"))
            if long_poll:
                w = threading.Thread(target=waiting, args=(name, float(reply["next_sync_s"]), stop_at), daemon=True)
                w.start()
                with lock:
                    waiters.append(w)
                over.wait(random.uniform(0.0, QUIET_SYNC_S))  # (agents that did not all start together)
            while time.time() < stop_at and not over.is_set():
                reply = sync()
                done = max([done] + [c["id"] for c in reply.get("commands", ())])
                over.wait(min(QUIET_SYNC_S if long_poll else given[-1], max(0.0, stop_at - time.time())))
            with lock:
                rtts.extend(mine)
                intervals.extend(given)
                if stop_at < end_at:
                    heard.append(last)
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
    for t in list(waiters):
        t.join(60)
    return {"rtts": rtts, "intervals": intervals, "errors": errors, "waits": waits,
            "silent_since": max(heard) if heard else None}


def _world(status: dict[str, Any]) -> int:
    p = status.get("parallel") or {}
    return p.get("tp", 1) * p.get("pp", 1) * p.get("dp", 1)


def _deliveries(status: dict[str, Any]) -> dict[str, list[float]]:
    """The real nodes' command deliveries so far (each node's, oldest first)."""
    return {n["node"]: list(n.get("command_delivery_s", ())) for n in status.get("nodes", ())
            if not n["node"].startswith("sim-")}


def _stage(job: LocalJob, nodes: int, first: int, seconds: float, procs: int) -> dict[str, Any]:
    """``nodes`` simulated agents for ``seconds``; the controller's answers to /status meanwhile."""
    from liver.controller.endpoint import request

    per = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)] if nodes else []
    code = "import json, sys; from liver.bench.control_plane import simulate; " \
           "print(json.dumps(simulate(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), " \
           "sys.argv[6] == '1', stop_on_eof=True)))"
    sims, base = [], first
    for k, n in enumerate(per):
        sims.append(subprocess.Popen([sys.executable, "-c", code, job.url, job.token, str(base), str(n), str(seconds),
                                      "1" if k == 0 else "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        base += n
    mine = {f"sim-{i}" for i in range(first, first + nodes)}  # (their registrations first: the stage starts then)
    job.wait(lambda s: sum(n["node"] in mine for n in s["nodes"]) == nodes, f"{nodes} simulated nodes", 300)
    status, t_end, lost_at, lost_after = [], time.time() + seconds, None, None
    s = job.status()
    step0, t0, before = s["step"], time.time(), _deliveries(s)
    request(job.url, job.token, "POST", "/scale", {"action": "scale-out 2"})
    want = 2  # (the stage goes back and forth between one process and two while it lasts)
    while time.time() < t_end:
        a = time.perf_counter()
        s = request(job.url, job.token, "GET", "/status")[1]
        status.append(time.perf_counter() - a)
        silent = next((n for n in s.get("nodes", ()) if n["node"] == f"sim-{first}"), None)
        if nodes and lost_at is None and silent is not None and not silent["up"]:
            lost_at = time.time()  # (the first look that shows it lost: within 0.2 s and a status's time)
        if _world(s) == want and s["phase"] == "stable" and not s["queued"]:
            want = 3 - want
            request(job.url, job.token, "POST", "/scale", {"action": f"scale-{'out' if want == 2 else 'in'} {want}"})
        time.sleep(0.2)
    for p in sims:
        p.stdin.close()  # (the simulated nodes end)
    steps_per_s = (job.status()["step"] - step0) / (time.time() - t0)
    if want == 2:  # (back to one process before the next stage)
        job.wait(lambda s: _world(s) == 2 and s["phase"] == "stable" and not s["queued"], "the scale-out", 300)
        request(job.url, job.token, "POST", "/scale", {"action": "scale-in 1"})
    s = job.wait(lambda s: _world(s) == 1 and s["phase"] == "stable" and not s["queued"], "the scale-in", 300)
    delivery = [d for name, ds in _deliveries(s).items() for d in ds[len(before.get(name, ())):]]
    got = [json.loads(p.stdout.read()) for p in sims]  # (their stdin closed: they end)
    for p in sims:
        p.wait(60)
    since = got[0]["silent_since"] if got else None
    in_stage = lambda t: t0 <= t < t_end  # noqa: E731  (what the simulated nodes did while the stage ran)
    rtts = [rtt for g in got for sent, rtt in g["rtts"] if in_stage(sent)]
    waits = sum(in_stage(t) for g in got for t in g["waits"])
    intervals = [x for g in got for x in g["intervals"]]
    interval = statistics.median(intervals) if intervals else None
    if interval is not None:  # what the controller promises: lost after its timeout or five intervals
        timeout = json.loads((job.run_dir / "config.json").read_text())["controller"]["agent_timeout_s"]
        lost_after = max(timeout, LOST_AFTER_SYNCS * interval)
    return {"nodes": nodes, "syncs_per_s": len(rtts) / seconds if nodes else 0.0,
            "waits_per_s": waits / seconds if nodes else 0.0,
            "sync_rtt_median_s": statistics.median(rtts) if rtts else None, "sync_rtt_p99_s": _percentile(rtts, 0.99),
            "interval_s": interval,
            "status_median_s": statistics.median(status), "status_p99_s": _percentile(status, 0.99),
            "status_max_s": max(status), "steps_per_s": steps_per_s,
            # a node gone silent: declared lost this long after its last sync (None: not within the stage)
            "lost_detected_s": lost_at - since if lost_at is not None and since is not None else None,
            "lost_after_s": lost_after,
            # each command to a real node in the stage (the scale-out's start, the scale-in's), queued to taken
            "command_delivery_s": sorted(delivery),
            "errors": sorted({e for g in got for e in g["errors"]})[:5]}


def run(args) -> dict[str, Any]:
    counts = [int(x) for x in str(args.nodes).split(",")]
    if any(not 0 <= n <= 5000 for n in counts) or args.seconds < 4 or args.procs < 1 \
            or not 1 <= args.agent_timeout_s <= 3600:
        raise ValueError(f"--nodes={args.nodes!r} (each 0 to 5000), --seconds={args.seconds} (at least 4), "
                         f"--procs={args.procs} (at least 1), --agent-timeout-s={args.agent_timeout_s:g} (1 to 3600)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    job = LocalJob(run_dir, ["--gpus", "1", "--steps", "100000000", "--end-after-events", "-1", "--ckpt-every", "0",
                             "--on-join", "never", "--companion-share", "0",
                             "--set", f"controller.syncs_per_s={args.syncs_per_s:g}",
                             "--set", f"controller.long_poll={'true' if args.long_poll == 'on' else 'false'}",
                             "--set", f"controller.agent_timeout_s={args.agent_timeout_s:g}"],
                   network=False)
    rows, first = [], 0
    try:
        job.agent("real")
        job.wait(lambda s: s["step"] >= 3, "the job's first steps", 120)
        job.agent("real2")  # (the stages' scale-out goes onto it: --on-join never)
        job.wait(lambda s: len(s["nodes"]) == 2, "the second real node", 60)
        time.sleep(5.0)  # (its agent's start: it syncs, and keeps its standing wait, once its zygote is up)
        for n in counts:
            rows.append(_stage(job, n, first, args.seconds, args.procs))
            first += n
            print(json.dumps(rows[-1]), flush=True)
    finally:
        job.close()
    calm = next((r["steps_per_s"] for r in rows if r["nodes"] == 0), None)
    for r in rows:
        r["steps_vs_no_nodes"] = r["steps_per_s"] / calm if calm else None
    result = {"cpus": os.cpu_count(), "seconds": args.seconds, "syncs_per_s": args.syncs_per_s,
              "long_poll": args.long_poll == "on",
              "rows": rows}
    (out / "control_plane.json").write_text(json.dumps(result, indent=1))
    return result


__all__ = ["run", "simulate"]
