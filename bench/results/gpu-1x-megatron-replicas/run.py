"""Megatron-Core on NCCL between two namespaced nodes sharing the one lent GPU, live and by
Megatron's own checkpoint-restart at the same steps (issue 35's third run, as far as one GPU goes):
the 1B GPT with Megatron's DDP and distributed optimizer, bf16 (configs/megatron-gpu-1b-distopt.toml),
its schedule configs/megatron-gpu-x2.events (scale-out 2 as TP2 onto a cold joiner, TP2 -> two
pipeline stages, back, scale-in 1 with a deadline). Digests before and after every handoff. The
live run first; the restart run then stops where the live run switched (its events cut at the live
run's last old steps). Both compared step by step (step, layout, loss).

    PYTHONPATH=$PWD python bench/results/gpu-1x-megatron-replicas/run.py OUT_DIR
    BACKEND=gloo CONFIG=configs/megatron.toml EXTRA="--gpus 1 --parallel 1,1,1" ...   # CPU dry run
"""

import json
import os
import sys
import time
from pathlib import Path

from liver.bench.nodes import LocalJob

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
backend = os.environ.get("BACKEND", "nccl")
config = os.path.abspath(os.environ.get("CONFIG", "configs/megatron-gpu-1b-distopt.toml"))
events = Path(os.path.abspath(os.environ.get("EVENTS", "configs/megatron-gpu-x2.events")))


def run(name: str, schedule: Path, *extra: str) -> tuple[dict, int]:
    run_dir = out / name
    job = LocalJob(run_dir, ["--config", config, "--events", str(schedule), "--backend", backend, "--ckpt-every", "0",
                             *os.environ.get("EXTRA", "").split(), *extra], backend=backend)
    try:
        for i in range(2):
            job.agent(f"node{i}", index=0)  # (both nodes on GPU 0)
        rc = job.proc.wait(500)
    finally:
        job.close()
    if not (run_dir / "report.json").exists():
        raise SystemExit(f"{name}: the job ended without a report (controller exit {rc}):\n{job.tail()}")
    return json.loads((run_dir / "report.json").read_text()), rc


def events_of(rep: dict) -> list[dict]:
    keep = ("outcome", "status", "old", "new", "last_old_step", "downtime_s", "transfer_s", "prepare_s", "bytes_moved",
            "digest_equal", "digest_error", "digest_before", "digest_after")
    return [{"kind": e["event"]["kind"], **{k: e.get(k) for k in keep}} for e in rep["events"]]


t0 = time.time()
live, live_rc = run("live", events, "--steps", "1000000", "--end-after-events", "4")
actions = [ln.split(":", 1)[1].split("#")[0].strip() for ln in events.read_text().splitlines()
           if ln.strip() and not ln.lstrip().startswith("#")]
cuts = [e["last_old_step"] for e in live["events"][:len(actions)]]
cut_file = out / "restart.events"
cut_file.write_text("".join(f"at step {c}: {a}\n" for c, a in zip(cuts, actions)))
# the schedule's events; after them the controller may grow back onto a node's freed slot (its own event:
# "node node1 joined"), which the restart run is not given: the runs are compared up to it
extra_events = live["events"][len(actions):]
total = extra_events[0]["last_old_step"] if extra_events else live["steps"][-1]["step"]
restart, restart_rc = run("restart", cut_file, "--steps", str(total), "--mode", "restart-forked")
trace = lambda rep: [(s["step"], s["parallel"], s["loss"]) for s in rep["steps"] if s["step"] <= total]  # noqa: E731
same = trace(live) == trace(restart)
result = {"backend": backend, "config": os.path.relpath(config), "events_file": os.path.relpath(events),
          "live_rc": live_rc, "restart_rc": restart_rc, "steps": total, "cuts": cuts,
          "live": events_of(live), "restart": events_of(restart),
          "losses_live_equal_restart": same,
          "first_difference": next(({"live": a, "restart": b} for a, b in zip(trace(live), trace(restart)) if a != b),
                                   None),
          "events_beyond_the_schedule": [e["event"].get("source") for e in extra_events],
          "digests_after_equal": [a["digest_after"] == b["digest_after"] for a, b in zip(events_of(live), events_of(restart))],
          "wall_s": time.time() - t0}
(out / "megatron_live_vs_restart.json").write_text(json.dumps(result, indent=1))
print(json.dumps({k: v for k, v in result.items() if k not in ("live", "restart")}, indent=1))
for e in result["live"] + result["restart"]:
    print(e["kind"], e["old"], "->", e["new"], e["status"], "digest_equal", e["digest_equal"], e["digest_error"])
