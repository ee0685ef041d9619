"""``liver bench dcp``: what one rank's restart is made of, measured on this machine: the step
time of a model on one device, and DCP's save and load of its whole training state (fp32 master
parameters and AdamW moments: 12 bytes a parameter) to each directory given (local disk,
``/dev/shm``), each ``repeats`` times, the first left out (it fills the page cache and the
allocator); and the device's local copy bandwidth (a shard that stays in another box). The simulator's restart model fits save and load bandwidths to the handoff runs'
restarts; these are the same figures measured directly, on a GPU (``--backend nccl``) for the
simulator's calibration, or on this machine's CPU.

    liver bench dcp --model 1b --model 3b --dir /tmp --dir /dev/shm --out OUT [--backend nccl]
                    [--set job.model.hidden_size=1024 ...]
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
from liver.config.fields import to_dict
from liver.config.jobfile import build, override
from liver.engine.reference import ADAPTER
from liver.topology import ParallelConfig
from liver.topology.presets import PRESETS
from liver.world.world import World, make_store


def _one(model: str, dirs: list[str], repeats: int, steps: int, backend: str, out: dict[str, Any],
         flush, sets: list[dict[str, Any]] = ()) -> None:
    """Fills ``out`` (the model's row), calling ``flush()`` after each measurement: a run cut
    short by a time limit keeps what it measured."""
    job = build({"preset": model}, *sets).job
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    store, _ = make_store()
    world = World.build(store, 0, ADAPTER.layout(job, ParallelConfig()), 0, backend, device)
    world.activate()
    try:
        engine = ADAPTER.build(job, world, device)
        times = []
        for _ in range(steps):
            times.append(engine.train_step().step_s)
        state = sum(t.numel() * t.element_size() for t in engine.state.values())
        out.update({"model": model, "job": to_dict(job), "params": ADAPTER.facts(job).params, "state_bytes": state,
                    "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                    "step_s": statistics.median(times[2:] or times), "steps": len(times),
                    "tokens_per_step": job.train.global_batch * ADAPTER.facts(job).seq_len, "dirs": {}})
        flush()
        for d in dirs:
            free = shutil.disk_usage(d).free
            if free < 1.1 * state:  # (a checkpoint is a little larger than the state)
                out["dirs"][d] = {"skipped": f"{free / 1e9:.1f} GB free, a checkpoint needs {1.1 * state / 1e9:.1f} GB"}
                continue
            base = Path(tempfile.mkdtemp(prefix="liver-bench-dcp-", dir=d))
            row: dict[str, Any] = out["dirs"].setdefault(d, {"save_s": [], "load_s": []})
            try:
                for r in range(repeats):
                    path = base / f"r{r}"
                    row["save_s"].append(ckpt.save(engine, path))
                    row["load_s"].append(ckpt.load(engine, path))
                    shutil.rmtree(path)
                    kept_save, kept_load = row["save_s"][1:] or row["save_s"], row["load_s"][1:] or row["load_s"]
                    row["save_GBps"] = state / statistics.median(kept_save) / 1e9
                    row["load_GBps"] = state / statistics.median(kept_load) / 1e9
                    flush()
            finally:
                shutil.rmtree(base, ignore_errors=True)
    finally:
        world.destroy()


def local_copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """GB/s of one copy of ``nbytes`` within a device's memory (the bytes copied, counted once):
    what a handoff pays for a shard that stays on its process in another box."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:  # the first two left out (first use)
            times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def run(models: list[str], dirs: list[str], out: Path, repeats: int = 3, steps: int = 8,
        backend: str = "gloo", sets: list[str] = (), copy_mib: int = 1024) -> dict[str, Any]:
    """``sets``: ``section.field=value`` over each preset (``--set job.model.hidden_size=1024``: a
    shape beyond the presets), refused naming the field before anything runs; ``copy_mib``: the
    size of the local copy timed (well beyond the caches)."""
    bad = [m for m in models if m not in PRESETS]
    if bad:
        raise ValueError(f"--model={bad[0]!r}: allowed {', '.join(PRESETS)}")
    layers = [override(t) for t in sets]
    for m in models:
        build({"preset": m}, *layers)  # (a bad field or shape: ValueError naming it)
    for d in dirs:
        if not Path(d).is_dir():
            raise ValueError(f"--dir={d!r}: not a directory")
    if repeats < 2 or steps < 1:
        raise ValueError(f"--repeats={repeats}, --steps={steps}: allowed repeats >= 2 (the first is left out), steps >= 1")
    if isinstance(copy_mib, bool) or not isinstance(copy_mib, int) or not 16 <= copy_mib <= 65536:
        raise ValueError(f"--copy-mib={copy_mib!r}: allowed 16 to 65536")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("--backend nccl: this machine has no GPU (gloo: the same on the CPU)")
    t0 = time.time()
    result: dict[str, Any] = {"torch": torch.__version__, "backend": backend, "repeats": repeats, "rows": [],
                              "complete": False}
    out.mkdir(parents=True, exist_ok=True)
    result["local_copy_GBps"] = local_copy_bandwidth(torch.device("cuda", 0) if backend == "nccl"
                                                     else torch.device("cpu"), copy_mib << 20)
    result["local_copy_bytes"] = copy_mib << 20

    def flush() -> None:
        result["wall_s"] = time.time() - t0
        (out / "dcp.json").write_text(json.dumps(result, indent=1) + "\n")

    for m in models:
        result["rows"].append({})
        _one(m, dirs, repeats, steps, backend, result["rows"][-1], flush, layers)
    result["complete"] = True
    flush()
    return result
