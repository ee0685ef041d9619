"""``liver bench dcp``: what one rank's restart is made of, measured on this machine: the step
time of a model on one device, and DCP's save and load of its whole training state (fp32 master
parameters and AdamW moments: 12 bytes a parameter) to each directory given (local disk,
``/dev/shm``), each ``repeats`` times, the first left out (it warms the page cache and the
allocator). The simulator's restart model fits save and load bandwidths to the handoff runs'
restarts; these are the same figures measured directly, on a GPU (``--backend nccl``) for the
simulator's calibration, or on this machine's CPU.

    liver bench dcp --model 1b --model 3b --dir /tmp --dir /dev/shm --out OUT [--backend nccl]
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from liver.checkpoint import dcp as ckpt
from liver.engine.reference import ADAPTER
from liver.topology import Layout, ParallelConfig
from liver.topology.presets import PRESETS
from liver.world.world import World, make_store


def _one(model: str, dirs: list[str], repeats: int, steps: int, backend: str) -> dict[str, Any]:
    job = PRESETS[model]
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    store, _ = make_store()
    world = World.build(store, 0, Layout(job.model, ParallelConfig(), job.train), 0, backend, device)
    world.activate()
    try:
        engine = ADAPTER.build(job, world, device)
        times = []
        for _ in range(steps):
            times.append(engine.train_step().step_s)
        state = sum(t.numel() * t.element_size() for t in engine.state.values())
        out: dict[str, Any] = {"model": model, "params": job.model.num_params(), "state_bytes": state,
                               "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                               "step_s": statistics.median(times[2:] or times), "steps": len(times),
                               "tokens_per_step": job.train.global_batch * job.model.seq_len, "dirs": {}}
        for d in dirs:
            base = Path(tempfile.mkdtemp(prefix="liver-bench-dcp-", dir=d))
            save_s, load_s = [], []
            try:
                for r in range(repeats):
                    path = base / f"r{r}"
                    save_s.append(ckpt.save(engine, path))
                    load_s.append(ckpt.load(engine, path))
                    shutil.rmtree(path)
            finally:
                shutil.rmtree(base, ignore_errors=True)
            kept_save, kept_load = save_s[1:] or save_s, load_s[1:] or load_s
            out["dirs"][d] = {"save_s": save_s, "load_s": load_s,
                              "save_GBps": state / statistics.median(kept_save) / 1e9,
                              "load_GBps": state / statistics.median(kept_load) / 1e9}
        return out
    finally:
        world.destroy()


def run(models: list[str], dirs: list[str], out: Path, repeats: int = 3, steps: int = 8,
        backend: str = "gloo") -> dict[str, Any]:
    bad = [m for m in models if m not in PRESETS]
    if bad:
        raise ValueError(f"--model={bad[0]!r}: allowed {', '.join(PRESETS)}")
    for d in dirs:
        if not Path(d).is_dir():
            raise ValueError(f"--dir={d!r}: not a directory")
    if repeats < 2 or steps < 1:
        raise ValueError(f"--repeats={repeats}, --steps={steps}: allowed repeats >= 2 (the first is left out), steps >= 1")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("--backend nccl: this machine has no GPU (gloo: the same on the CPU)")
    t0 = time.time()
    rows = [_one(m, dirs, repeats, steps, backend) for m in models]
    result = {"torch": torch.__version__, "backend": backend, "repeats": repeats, "rows": rows,
              "wall_s": time.time() - t0}
    out.mkdir(parents=True, exist_ok=True)
    (out / "dcp.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
