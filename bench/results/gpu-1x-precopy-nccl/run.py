"""Pre-copy on NCCL, on and off, between two namespaced nodes sharing the one lent GPU (issue 35's
second run as far as one GPU goes: correctness, not speed; the nodes' ranks talk over sockets):
the reference engine's 1B job in bf16 (its batch a quarter of the preset's, so that two ranks fit
one H200), scale-out 1 -> 2 as TP2 onto a cold joiner, TP2 -> DP2, scale-in 2 -> 1 with a
deadline; once with pre-copy, once without, the same schedule. Digests before and after every
handoff (each run switches at its own steps: a joiner's boot and a preparation take what they take).

    PYTHONPATH=$PWD python bench/results/gpu-1x-precopy-nccl/run.py OUT_DIR
    BACKEND=gloo MODEL=tiny ...   # CPU dry run
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
model = os.environ.get("MODEL", "1b")
schedule = out / "schedule.events"
schedule.write_text("at step 5: scale-out 2 as 2,1,1\nat step +8: reshape 1,1,2\nat step +8: scale-in 1 deadline 60s as 1,1,1\n")


def run(name: str, *extra: str) -> tuple[dict, int]:
    run_dir = out / name
    job = LocalJob(run_dir, ["--model", model, "--events", str(schedule), "--backend", backend, "--ckpt-every", "0",
                             "--gpus", "1", "--parallel", "1,1,1", "--digest", "switch", "--steps", "1000000",
                             "--end-after-events", "4", "--set", "job.train.global_batch=4",
                             "--set", "job.train.micro_batch=1", "--set", "job.compute_dtype=bfloat16", *extra],
                   backend=backend)
    try:
        for i in range(2):
            job.agent(f"node{i}", index=0)  # (both nodes on GPU 0)
        rc = job.proc.wait(400)
    finally:
        job.close()
    if not (run_dir / "report.json").exists():
        raise SystemExit(f"{name}: the job ended without a report (controller exit {rc}):\n{job.tail()}")
    return json.loads((run_dir / "report.json").read_text()), rc


def events_of(rep: dict) -> list[dict]:
    keep = ("outcome", "status", "old", "new", "last_old_step", "downtime_s", "transfer_s", "prepare_s", "bytes_moved",
            "digest_equal", "digest_error", "precopy")
    return [{"kind": e["event"]["kind"], "source": e["event"].get("source"), **{k: e.get(k) for k in keep}}
            for e in rep["events"]]


t0 = time.time()
on, on_rc = run("precopy", "--precopy")
off, off_rc = run("plain")
# (the runs switch at different steps, a joiner's boot and the preparation taking what they take: each handoff
# is checked by its digests, not the runs against each other)
result = {"backend": backend, "model": model, "schedule": schedule.read_text().splitlines(),
          "precopy_rc": on_rc, "plain_rc": off_rc,
          "precopy": events_of(on), "plain": events_of(off), "wall_s": time.time() - t0}
(out / "precopy_on_off.json").write_text(json.dumps(result, indent=1, default=str))
print(json.dumps({k: v for k, v in result.items() if k not in ("precopy", "plain")}, indent=1))
for name in ("precopy", "plain"):
    for e in result[name]:
        print(name, e["kind"], e["old"], "->", e["new"], e["status"], "pause", e["downtime_s"], "digest_equal",
              e["digest_equal"], e["digest_error"], "precopy", json.dumps(e["precopy"])[:200] if e["precopy"] else None)
