"""A data-parallel replica killed with SIGKILL mid-run (``--event kill``): LiveR (healed from the
survivor's memory) against torchft 0.2.0 (the survivor goes on in a smaller quorum); or a second
replica that joins mid-run (``--event join``): LiveR's scale-out 1 -> 2 (a cold joiner, the state
moved live) against torchft's join (the newcomer heals from its peer). Side by side on this
machine, interleaved repeats, the same 12.6M-parameter model shape, replicas of one CPU process
each, the event at the same step.

    .venv/bin/python bench/torchft/side_by_side.py --torchft-python /tmp/tftvenv/bin/python \\
        --repeats 3 --out bench/results/cpu-heal-vs-torchft            (writes side_by_side.json)
    ... --event join --out bench/results/cpu-heal-vs-torchft           (writes join.json)

torchft runs from its own environment (``pip install torch==2.13.0 torchft==0.2.0``): it is not a
dependency of LiveR. Its lighthouse runs with the flags of torchft's own examples
(``--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000``), other settings at their defaults
except the collective timeout (10 s, as LiveR's gloo groups break at once on a lost peer).

Per run, from the first replica's own step log: the stall, the steps that did not commit or were
re-run (lost work: their count x the median step), and the sum. A kill's stall runs from the end
of the last step committed before it to the end of the first committed after it, less a normal
step. A join's runs from the event (the newcomer's start) to the first step with both replicas,
less a normal step for each step in that window (of its own replica count): what the steps beside
the newcomer's start, the state sent to it and the first step together cost beyond training.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

LIGHTHOUSE = """
import sys, time
from torchft._torchft import LighthouseServer
s = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=10000, quorum_tick_ms=100)
print(s.address(), flush=True)
time.sleep(10**6)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(f: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def window_stall(log: list[dict[str, Any]], t_event: float, t_end: float, kind) -> float:
    """What the steps from ``t_event`` to ``t_end`` took beyond normal steps (a join): the time
    from the step before the window to its last step, less a normal step of each step's own kind
    (``kind(step)``: its replica count), normal being the median of that kind outside the window."""
    inside = [x for x in log if t_event < x["time"] <= t_end]
    start = max((x["time"] for x in log if x["time"] <= t_event), default=t_event)
    normal = {}
    for k in {kind(x) for x in inside}:
        normal[k] = statistics.median(x["step_s"] for x in log if kind(x) == k and x not in inside)
    return inside[-1]["time"] - start - sum(normal[kind(x)] for x in inside)


def _replica(python: str, r: int, addr: str, steps: int, run_dir: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([python, str(HERE / "replica.py"), "--replica", str(r), "--lighthouse", addr,
                             "--store-port", str(_free_port()), "--steps", str(steps),
                             "--out", str(run_dir / f"replica{r}.jsonl")],
                            stdout=open(run_dir / f"replica{r}.log", "w"), stderr=subprocess.STDOUT, env=env)


def torchft_once(python: str, run_dir: Path, at: int, steps: int, event: str = "kill") -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    lh = subprocess.Popen([python, "-c", LIGHTHOUSE], stdout=subprocess.PIPE, stderr=open(run_dir / "lighthouse.log", "w"),
                          text=True, env=env)
    procs = []
    try:
        addr = lh.stdout.readline().strip()
        if not addr:
            raise RuntimeError(f"torchft's lighthouse did not start; see {run_dir / 'lighthouse.log'}")
        for r in range(2 if event == "kill" else 1):
            procs.append(_replica(python, r, addr, steps, run_dir, env))
        end = time.time() + 600
        while not any(x["step"] >= at for x in _lines(run_dir / "replica0.jsonl")):
            if time.time() > end or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"torchft: the replicas did not reach step {at}; see {run_dir}")
            time.sleep(0.01)
        t_event = time.time()
        if event == "kill":
            os.kill(procs[1].pid, signal.SIGKILL)
        else:
            procs.append(_replica(python, 1, addr, steps, run_dir, env))
        if procs[0].wait(900) != 0:
            raise RuntimeError(f"torchft: the survivor failed; see {run_dir / 'replica0.log'}")
    finally:
        for p in procs + [lh]:
            if p.poll() is None:
                p.kill()
                p.wait()
    log = _lines(run_dir / "replica0.jsonl")
    both = [x for x in log if x["participants"] == 2 and x["committed"]]
    want = 1 if event == "kill" else 2  # the participants once the event is through
    before = [x for x in log if x["committed"] and x["time"] <= t_event]
    after = [x for x in log if x["committed"] and x["time"] > t_event and x["participants"] == want]
    if not after:
        raise RuntimeError(f"torchft: no step with {want} participants after the {event}; see {run_dir}")
    # a normal step: over the whole run (a kill), or with both replicas (a join: one replica's steps
    # have no all-reduce to wait for)
    step_s = statistics.median(x["step_s"] for x in (log[1:] if event == "kill" else after[1:] or after)
                               if x["committed"])
    # steps not committed, and (a join) steps committed by the survivor alone while the newcomer came
    lost = sum(1 for x in log if not x["committed"] and x["time"] > before[-1]["time"])
    alone = sum(1 for x in log if x["committed"] and t_event < x["time"] < after[0]["time"])
    if event == "kill":
        stall = after[0]["time"] - before[-1]["time"] - step_s
    else:
        stall = window_stall([x for x in log if x["committed"]], t_event, after[0]["time"], lambda x: x["participants"])
    return {"system": "torchft 0.2.0", "event": event,
            ("failed_at_step" if event == "kill" else "event_at_step"): before[-1]["step"],
            "steps_with_both": len(both), "steps_before_joined": alone, "participants_after": after[0]["participants"],
            "stall_s": stall, "lost_steps": lost, "median_step_s": step_s, "lost_work_s": lost * step_s,
            "total_lost_s": stall + lost * step_s, "event_to_new_count_s": after[0]["time"] - t_event,
            "run_dir": str(run_dir)}


def liver_once(run_dir: Path, kill_at: int, steps: int, ckpt_every: int) -> dict[str, Any]:
    from liver.bench.heal import _once

    r = _once("heal", run_dir, kill_at, steps, ckpt_every)
    return {"system": "LiveR (heal from the survivor)", **{k: r[k] for k in (
        "status", "failed_at_step", "restored_step", "stall_s", "lost_steps", "median_step_s", "lost_work_s",
        "total_lost_s", "run_dir")}}


def liver_join_once(run_dir: Path, at: int, steps: int) -> dict[str, Any]:
    """LiveR's scale-out 1 -> 2 data-parallel replicas at step ``at`` (a cold joiner on the second
    slot), on ``liver bench heal``'s job; the stall measured from the step log as torchft's."""
    from liver.bench.heal import _steps, job_config
    from liver.policy.events import parse_schedule_text
    from liver.controller.job import run_job

    run_dir.mkdir(parents=True, exist_ok=True)
    text = f"at step {at}: scale-out 2 as 1,1,2\n"
    rep = run_job(job_config(steps, 10, gpus=1), parse_schedule_text(text, "join"), run_dir, {"bench": "join"})
    (ev,) = rep["events"]
    if ev["status"] != "done":
        raise RuntimeError(f"LiveR: the scale-out was {ev['status']!r}; see {run_dir}")
    log = _steps(run_dir)
    first = next(i for i, x in enumerate(log) if x["generation"] >= 1)
    step_s = statistics.median(x["step_s"] for x in log[first + 1:])
    # from the event (the joiner's cold start beside training) to the first step with both
    stall = window_stall(log, ev["arrived"], log[first]["time"], lambda x: x["generation"] >= 1)
    steps_run = [x["step"] for x in log]
    return {"system": "LiveR (scale-out, cold joiner)", "event": "join", "event_at_step": log[first - 1]["step"],
            "status": ev["status"], "stall_s": stall, "downtime_s": ev.get("downtime_s"),
            "lost_steps": len(steps_run) - len(set(steps_run)), "median_step_s": step_s,
            "lost_work_s": 0.0, "total_lost_s": stall, "event_to_new_count_s": ev["t_done"] - ev["arrived"],
            "digest_equal": ev.get("digest_equal"), "run_dir": str(run_dir)}


def main() -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--torchft-python", required=True, help="an interpreter with torchft 0.2.0 installed")
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("--event", choices=("kill", "join"), default="kill")
    a.add_argument("--kill-at", type=int, default=26, help="the step of the event (a kill or a join)")
    a.add_argument("--steps", type=int, default=60)
    a.add_argument("--out", required=True)
    args = a.parse_args()
    if args.repeats < 1 or not 5 < args.kill_at < args.steps - 5:
        print(f"side_by_side: --repeats={args.repeats} --kill-at={args.kill_at} --steps={args.steps}: allowed "
              f"repeats >= 1 and 5 < kill-at < steps - 5", file=sys.stderr)
        return 2
    probe = subprocess.run([args.torchft_python, "-c", "import torchft, importlib.metadata as m; "
                            "print(m.version('torchft'))"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"side_by_side: --torchft-python={args.torchft_python!r} cannot import torchft: "
              f"{probe.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="liver-vs-torchft-"))
    runs = []
    for r in range(args.repeats):  # interleaved: both see the same machine
        if args.event == "kill":
            runs.append(liver_once(base / f"liver-{r}", args.kill_at, args.steps, ckpt_every=10))
        else:
            runs.append(liver_join_once(base / f"liver-{r}", args.kill_at, args.steps))
        runs.append(torchft_once(args.torchft_python, base / f"torchft-{r}", args.kill_at, args.steps, args.event))
        print(json.dumps(runs[-2:]), flush=True)
    result: dict[str, Any] = {"torchft_version": probe.stdout.strip(), "params": 12587264, "replicas": 2,
                              "event": args.event, ("kill_at_step" if args.event == "kill" else "join_at_step"):
                              args.kill_at, "steps": args.steps, "repeats": args.repeats, "runs": runs,
                              "command": " ".join(["python", "bench/torchft/side_by_side.py", *sys.argv[1:]])}
    for system in ("LiveR", "torchft"):
        mine = [x for x in runs if x["system"].startswith(system)]
        result[system] = {k: statistics.median(x[k] for x in mine)
                          for k in ("stall_s", "lost_steps", "median_step_s", "lost_work_s", "total_lost_s")}
        result[system]["stall_s_range"] = [min(x["stall_s"] for x in mine), max(x["stall_s"] for x in mine)]
        result[system]["total_lost_s_range"] = [min(x["total_lost_s"] for x in mine),
                                                max(x["total_lost_s"] for x in mine)]
    (out / ("side_by_side.json" if args.event == "kill" else "join.json")).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
