"""What the first preparation in a worker costs in Python, and what start-up can pre-pay (CPU only).

Each measurement runs in a fresh interpreter that imports what a worker imports, then times
(thread CPU) either one full cyclic garbage collection or the first plan + schedule of a 1B
reshape tp2 -> dp2, after one of these start-ups:
- plain: nothing done at start-up,
- freeze: `gc.collect(); gc.freeze()` at start-up (what workers do),
- freeze_rehearse: `rehearse()` then the same (what workers do since 59c205e).

    .venv/bin/python bench/cpu_prepare_first_use.py     # writes $OUT/prepare_first_use.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/out"))

CHILD = r"""
import gc, json, sys, time
import torch
from liver.runtime import member  # noqa: F401  (a worker's imports)
from liver.engine.trainer import state_specs
from liver.planner import plan_transfer
from liver.runtime.companion import rehearse
from liver.runtime.mock import MockGroup
from liver.topology import Layout, ParallelConfig
from liver.topology.presets import preset
variant, what = sys.argv[1], sys.argv[2]
if variant == "freeze_rehearse":
    rehearse()
if variant != "plain":
    gc.collect()
    gc.freeze()
out = {"variant": variant, "objects": len(gc.get_objects()), "frozen": gc.get_freeze_count()}
if what == "gc":
    t = time.thread_time(); gc.collect(); out["full_gc_s"] = time.thread_time() - t
    print(json.dumps(out)); sys.exit()
from liver.transfer import StreamingExecutor
job = preset("1b"); specs = state_specs(job)
old, new = (Layout(job.model, p, job.train) for p in (ParallelConfig(tp=2), ParallelConfig(dp=2)))
cpu = torch.device("cpu")
t = time.thread_time()
plan = plan_transfer(old, new, specs, [0, 1], [0, 1])
StreamingExecutor(plan, specs, 0, MockGroup("m", [0, 1], 0, "nccl", cpu), 512 << 20, cpu)
out["first_plan_schedule_s"] = time.thread_time() - t
print(json.dumps(out))
"""


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for rep in range(3):
        for variant in ("plain", "freeze", "freeze_rehearse"):
            for what in ("gc", "plan"):  # each in a fresh process: a timed collection would clear the heap
                r = subprocess.run([sys.executable, "-c", CHILD, variant, what], capture_output=True, text=True,
                                   check=True)
                rows.append({**json.loads(r.stdout), "repeat": rep})
                print(rows[-1], flush=True)
    (OUT / "prepare_first_use.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
