"""Step times of a 2-process CPU job (tiny model, pp=2 over gloo, no event, no checkpoint) with
the workers bound to their slots' cores (the default where the node has a core per slot,
liver/agent/cores.py) and left to the OS scheduler (``--no-bind-cores``), interleaved REPEATS
times. Writes $OUT/core_binding.json: per run and pooled, the median and quartiles of the step
time (the first 50 steps of each run left out).

    OUT=... PYTHONPATH=$PWD .venv/bin/python bench/cpu_core_binding.py
"""

import json
import os
import statistics
import tempfile
from pathlib import Path

from liver.host import cores
from liver.config.jobfile import build
from liver.controller.job import run_job

OUT = Path(os.environ.get("OUT", "/tmp/out"))
REPEATS = int(os.environ.get("REPEATS", "3"))
STEPS = int(os.environ.get("STEPS", "800"))
SKIP = 50


def once(bind: bool, run_dir: Path) -> list[float]:
    cfg = build({"steps": STEPS, "gpus": 2, "parallel": "1,2,1", "checkpoint": {"every": 0},
                 "agent": {"slots": 2, "quiet": True, "bind_cores": bind},
                 "controller": {"endpoint": False, "end_after_events": None}})
    rep = run_job(cfg, [], run_dir)
    return [s["step_s"] for s in rep["steps"]][SKIP:]


def summary(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=20)
    return {"steps": len(xs), "median_ms": statistics.median(xs) * 1e3, "p25_ms": q[4] * 1e3,
            "p75_ms": q[14] * 1e3, "p95_ms": q[18] * 1e3}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="liver-core-binding-"))
    runs: dict[str, list[list[float]]] = {"bound": [], "unbound": []}
    for r in range(REPEATS):
        for name, bind in (("unbound", False), ("bound", True)):
            runs[name].append(once(bind, base / f"{name}-{r}"))
    out = {"cores": cores.available(), "repeats": REPEATS, "steps": STEPS, "first_steps_left_out": SKIP,
           **{name: {"pooled": summary([x for run in rs for x in run]), "runs": [summary(run) for run in rs]}
              for name, rs in runs.items()}}
    out["median_unbound_over_bound"] = out["unbound"]["pooled"]["median_ms"] / out["bound"]["pooled"]["median_ms"]
    (OUT / "core_binding.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
