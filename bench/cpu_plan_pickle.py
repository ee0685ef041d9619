"""What a worker saves by reading the controller's plan instead of planning again: CPU time of
plan_transfer (placement given, as a worker would) against unpickling the same plan, warm, best
of 5. Writes $OUT/plan_pickle.json.

    OUT=... PYTHONPATH=$PWD .venv/bin/python bench/cpu_plan_pickle.py
"""

import json
import os
import pickle
import time
from pathlib import Path

from liver.engine.reference.trainer import state_specs
from liver.planner.plan import plan_transfer
from liver.topology import Layout, ParallelConfig
from liver.topology.presets import preset

CASES = [("tiny", "1,1,2", "2,1,1", 2), ("1b", "2,1,1", "1,1,2", 2), ("tiny", "2,2,2", "4,1,2", 8)]


def best(f, n: int = 5) -> float:
    out = []
    for _ in range(n):
        t0 = time.thread_time()
        f()
        out.append(time.thread_time() - t0)
    return min(out)


def main() -> None:
    rows = []
    for model, a, b, n in CASES:
        job = preset(model)
        old, new = (Layout(job.model, ParallelConfig.parse(x), job.train) for x in (a, b))
        specs, procs = state_specs(job), list(range(n))
        plan = plan_transfer(old, new, specs, procs, procs)
        blob = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        rows.append({"model": model, "old": a, "new": b, "pickle_bytes": len(blob),
                     "plan_cpu_s": best(lambda: plan_transfer(old, new, specs, procs, procs, placement=plan.placement)),
                     "unpickle_cpu_s": best(lambda: pickle.loads(blob))})
        print(rows[-1], flush=True)
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_pickle.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
