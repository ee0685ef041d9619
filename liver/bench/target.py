"""``liver bench target``: whether the controller's target choice is right, by measurement. For
each process count and model shape, every valid configuration trains on CPU processes (gloo) for
a few steps, one run each; its median step time (the first steps left out) is set against the one
the controller chooses for that count (``liver.policy.target.choose``): the chosen one's
time over the fastest measured."""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from liver.config import RunConfig
from liver.controller import report
from liver.policy import target
from liver.policy.workload import Workload
from liver.controller.admission import hardware_of
from liver.controller.job import run_job
from liver.topology.presets import TARGET_SHAPES, target_shape

# two shapes: the demo's (4 layers, 4 heads) and one of 7 layers and 8 heads (tp up to 8)
SHAPES = TARGET_SHAPES
job_of = target_shape


def measure(shape: str, par, steps: int, run_dir: Path) -> float:
    cfg = RunConfig(preset=SHAPES[shape][0], job=job_of(shape), gpus=par.world_size, parallel=par, steps=steps)
    cfg = replace(cfg, agent=replace(cfg.agent, slots=par.world_size, quiet=True),
                  checkpoint=replace(cfg.checkpoint, every=0),
                  controller=replace(cfg.controller, end_after_events=None, endpoint=False))
    d = run_dir / f"{shape}-{par.short()}"
    run_job(cfg, [], d)
    ts = [s["step_s"] for s in report.read_steps(d)][3:]
    return statistics.median(ts)


def run(counts: list[int], steps: int = 25, run_dir: Path | None = None) -> dict[str, Any]:
    root = run_dir or Path(tempfile.mkdtemp(prefix="liver-bench-target-"))
    cfg0 = RunConfig()
    adapter, hw = cfg0.adapter, hardware_of(cfg0)
    rows = []
    for shape in SHAPES:
        job = job_of(shape)
        for n in counts:
            cands = target.candidates(adapter, job, n)
            if not cands:
                continue
            chosen = target.choose(adapter, job, n, hw)
            measured = {c.parallel.short(): measure(shape, c.parallel, steps, root) for c in cands}
            fastest = min(measured, key=measured.get)
            rows.append({"shape": shape, "processes": n, "chosen": chosen.short(), "fastest": fastest,
                         "measured_step_s": measured,
                         "modelled_step_s": {c.parallel.short(): target.step_time(Workload(adapter, job), c, hw) for c in cands},
                         "chosen_over_fastest": measured[chosen.short()] / measured[fastest]})
    ratios = [r["chosen_over_fastest"] for r in rows]
    return {"steps_per_run": steps, "rows": rows, "within_10pct": sum(x <= 1.10 for x in ratios),
            "cases": len(rows), "worst_ratio": max(ratios, default=None)}
