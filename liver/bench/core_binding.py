"""``liver bench core-binding``: step times of a 2-process CPU job (tiny model, pp=2 over gloo, no
event, no checkpoint) with the workers bound to their slots' cores (the default where the node
has a core per slot, liver/host/cores.py) and left to the OS scheduler, interleaved ``repeats``
times: per run and pooled, the median and quartiles of the step time (the first steps of each run
left out)."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from liver.config.jobfile import build
from liver.controller.job import run_job
from liver.host import cores

SKIP = 50


def _once(bind: bool, steps: int, run_dir: Path) -> list[float]:
    cfg = build({"steps": steps, "gpus": 2, "parallel": "1,2,1", "checkpoint": {"every": 0},
                 "agent": {"slots": 2, "quiet": True, "bind_cores": bind},
                 "controller": {"endpoint": False, "end_after_events": None}})
    rep = run_job(cfg, [], run_dir)
    return [s["step_s"] for s in rep["steps"]][SKIP:]


def _summary(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=20)
    return {"steps": len(xs), "median_ms": statistics.median(xs) * 1e3, "p25_ms": q[4] * 1e3,
            "p75_ms": q[14] * 1e3, "p95_ms": q[18] * 1e3}


def run(repeats: int = 3, steps: int = 800, run_dir: Path | None = None) -> dict[str, Any]:
    if repeats < 1 or steps <= SKIP + 20:
        raise ValueError(f"--repeats={repeats}, --steps={steps}: allowed a positive count and more than {SKIP + 20} steps")
    base = run_dir or Path(tempfile.mkdtemp(prefix="liver-bench-core-binding-"))
    runs: dict[str, list[list[float]]] = {"bound": [], "unbound": []}
    for r in range(repeats):
        for name, bind in (("unbound", False), ("bound", True)):
            runs[name].append(_once(bind, steps, base / f"{name}-{r}"))
    out = {"cores": cores.available(), "repeats": repeats, "steps": steps, "first_steps_left_out": SKIP,
           **{name: {"pooled": _summary([x for run in rs for x in run]), "runs": [_summary(run) for run in rs]}
              for name, rs in runs.items()}}
    out["median_unbound_over_bound"] = out["unbound"]["pooled"]["median_ms"] / out["bound"]["pooled"]["median_ms"]
    return out
