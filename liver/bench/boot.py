"""``liver bench boot``: what a cold joiner costs its node before it can hold a rank, started as a
fresh interpreter (``python -m``: boot, imports, first-use costs) and forked from the node agent's
zygote, side by side in one run, interleaved. Each worker does what a joiner does before its
Shadow World: imports, then the mock-world warm-up (``warmup_steps`` training steps of ``model``
in ``parallel``, rank 0); it reports its own CPU time (every thread, from its start) and the wall
time from its launch. Nothing else runs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from liver.agent.zygote import Zygote
from liver.engine.interface import DEFAULT_ENGINE
from liver.runtime.preload import CPU_PRELOAD


def joiner_warmup(spec_path: str, boot: dict[str, float] | None = None) -> None:
    """The worker: a joiner's work up to its Shadow World (``liver.runtime.member`` ``join``)."""
    import torch

    from liver.engine.reference import ADAPTER
    from liver.runtime.mock import warm_up
    from liver.topology import ParallelConfig
    from liver.topology.presets import preset

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    job = preset(spec["model"])
    layout = ADAPTER.layout(job, ParallelConfig.parse(spec["parallel"]))
    warm_up(ADAPTER, job, layout, 0, "gloo", torch.device("cpu"), spec["warmup_steps"], generation=1)
    Path(spec["out"]).write_text(json.dumps({"cpu_s": time.process_time(), "done": time.time()}))


def _fresh(spec: Path, log: Path) -> None:
    code = f"from liver.bench.boot import joiner_warmup; joiner_warmup({str(spec)!r})"
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS="1"), stderr=f,
                       check=True)


def _forked(z: Zygote, spec: Path, log: Path) -> None:
    pid = z.start(str(spec), dict(os.environ, OMP_NUM_THREADS="1"), str(log), quiet=True, idle=False,
                 entry="liver.bench.boot:joiner_warmup")
    if z.exit_status(pid, None) != 0:
        raise RuntimeError(f"forked joiner failed: {log.read_text()[-2000:]}")


def run(repeats: int = 5, model: str = "tiny", parallel: str = "1,1,2", warmup_steps: int = 2,
        run_dir: Path | None = None) -> list[dict[str, Any]]:
    if repeats < 1:
        raise ValueError(f"--repeats={repeats}: allowed a positive count")
    base = run_dir or Path(tempfile.mkdtemp(prefix="liver-bench-boot-"))
    base.mkdir(parents=True, exist_ok=True)
    z = Zygote(CPU_PRELOAD, (DEFAULT_ENGINE,))
    z.wait_ready()  # its own imports are not a joiner's cost: the agent starts it with the job
    samples: dict[str, list[dict[str, float]]] = {"fresh interpreter": [], "forked from the zygote": []}
    try:
        for r in range(repeats):
            for name, start in (("fresh interpreter", _fresh), ("forked from the zygote", _forked)):
                spec = base / f"{name.split()[0]}-{r}.json"
                out = spec.with_suffix(".out.json")
                spec.write_text(json.dumps({"model": model, "parallel": parallel, "warmup_steps": warmup_steps,
                                            "out": str(out)}))
                t0 = time.time()
                start(*((z,) if start is _forked else ()), spec, spec.with_suffix(".log"))
                res = json.loads(out.read_text())
                samples[name].append({"cpu_s": res["cpu_s"], "wall_s": res["done"] - t0})
    finally:
        z.close()
    med = {n: {k: statistics.median(s[k] for s in v) for k in ("cpu_s", "wall_s")} for n, v in samples.items()}
    fresh = med["fresh interpreter"]
    return [{"start": n, "model": model, "parallel": parallel, "warmup_steps": warmup_steps, "repeats": repeats,
             "cpu_s": m["cpu_s"], "wall_s": m["wall_s"],
             "cpu_ratio_fresh_over_this": fresh["cpu_s"] / m["cpu_s"],
             "wall_ratio_fresh_over_this": fresh["wall_s"] / m["wall_s"],
             "samples": samples[n]} for n, m in med.items()]
