"""A data-parallel replica killed with SIGKILL mid-run: LiveR (healed from the survivor's memory)
against torchft 0.2.0 (the survivor goes on in a smaller quorum), side by side on this machine,
interleaved repeats, the same 12.6M-parameter model shape, two replicas of one CPU process each,
the kill at the same step.

    .venv/bin/python bench/torchft/side_by_side.py --torchft-python /tmp/tftvenv/bin/python \\
        --repeats 3 --out bench/results/cpu-heal-vs-torchft

torchft runs from its own environment (``pip install torch==2.13.0 torchft==0.2.0``): it is not a
dependency of LiveR. Its lighthouse runs with the flags of torchft's own examples
(``--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000``), other settings at their defaults
except the collective timeout (10 s, as LiveR's gloo groups break at once on a lost peer).

Per run, from the survivor's own step log: the stall (from the end of the last step committed
before the kill to the end of the first committed after it, less a normal step), the steps that
did not commit or were re-run (lost work: their count x the median step), and the sum.
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


def torchft_once(python: str, run_dir: Path, kill_at: int, steps: int) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    lh = subprocess.Popen([python, "-c", LIGHTHOUSE], stdout=subprocess.PIPE, stderr=open(run_dir / "lighthouse.log", "w"),
                          text=True, env=env)
    procs = []
    try:
        addr = lh.stdout.readline().strip()
        if not addr:
            raise RuntimeError(f"torchft's lighthouse did not start; see {run_dir / 'lighthouse.log'}")
        for r in range(2):
            procs.append(subprocess.Popen(
                [python, str(HERE / "replica.py"), "--replica", str(r), "--lighthouse", addr, "--store-port",
                 str(_free_port()), "--steps", str(steps), "--out", str(run_dir / f"replica{r}.jsonl")],
                stdout=open(run_dir / f"replica{r}.log", "w"), stderr=subprocess.STDOUT, env=env))
        end = time.time() + 600
        while not any(x["step"] >= kill_at for x in _lines(run_dir / "replica0.jsonl")):
            if time.time() > end or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"torchft: the replicas did not reach step {kill_at}; see {run_dir}")
            time.sleep(0.01)
        t_kill = time.time()
        os.kill(procs[1].pid, signal.SIGKILL)
        if procs[0].wait(900) != 0:
            raise RuntimeError(f"torchft: the survivor failed; see {run_dir / 'replica0.log'}")
    finally:
        for p in procs + [lh]:
            if p.poll() is None:
                p.kill()
                p.wait()
    log = _lines(run_dir / "replica0.jsonl")
    both = [x for x in log if x["participants"] == 2 and x["committed"]]
    step_s = statistics.median(x["step_s"] for x in log[1:] if x["committed"])
    before = [x for x in log if x["committed"] and x["time"] <= t_kill]
    after = [x for x in log if x["committed"] and x["time"] > t_kill]
    lost = sum(1 for x in log if not x["committed"] and x["time"] > before[-1]["time"])
    stall = after[0]["time"] - before[-1]["time"] - step_s
    return {"system": "torchft 0.2.0", "failed_at_step": before[-1]["step"], "steps_with_both": len(both),
            "participants_after": after[0]["participants"], "stall_s": stall, "lost_steps": lost,
            "median_step_s": step_s, "lost_work_s": lost * step_s, "total_lost_s": stall + lost * step_s,
            "run_dir": str(run_dir)}


def liver_once(run_dir: Path, kill_at: int, steps: int, ckpt_every: int) -> dict[str, Any]:
    from liver.bench.heal import _once

    r = _once("heal", run_dir, kill_at, steps, ckpt_every)
    return {"system": "LiveR (heal from the survivor)", **{k: r[k] for k in (
        "status", "failed_at_step", "restored_step", "stall_s", "lost_steps", "median_step_s", "lost_work_s",
        "total_lost_s", "run_dir")}}


def main() -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--torchft-python", required=True, help="an interpreter with torchft 0.2.0 installed")
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("--kill-at", type=int, default=26)
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
        runs.append(liver_once(base / f"liver-{r}", args.kill_at, args.steps, ckpt_every=10))
        runs.append(torchft_once(args.torchft_python, base / f"torchft-{r}", args.kill_at, args.steps))
        print(json.dumps(runs[-2:]), flush=True)
    result: dict[str, Any] = {"torchft_version": probe.stdout.strip(), "params": 12587264, "replicas": 2,
                              "kill_at_step": args.kill_at, "steps": args.steps, "repeats": args.repeats, "runs": runs,
                              "command": " ".join(["python", "bench/torchft/side_by_side.py", *sys.argv[1:]])}
    for system in ("LiveR", "torchft"):
        mine = [x for x in runs if x["system"].startswith(system)]
        result[system] = {k: statistics.median(x[k] for x in mine)
                          for k in ("stall_s", "lost_steps", "median_step_s", "lost_work_s", "total_lost_s")}
        result[system]["stall_s_range"] = [min(x["stall_s"] for x in mine), max(x["stall_s"] for x in mine)]
        result[system]["total_lost_s_range"] = [min(x["total_lost_s"] for x in mine),
                                                max(x["total_lost_s"] for x in mine)]
    (out / "side_by_side.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
