"""``liver bench build``: the engine construction a switch does before its transfer, native against
reference, at a preset's shape and several layouts.

A switch builds the new generation's engine, then the transfer fills it (``EngineAdapter.enter``).
For a user's model (the native engine) the build is the model on the meta device, the recipe's
``parallelize``, storage for this rank's shards and the optimizer's state; for the reference engine,
its parameters and compute copies over shards handed to it. Both are timed here for rank 0 of each
layout, in one process over a mock world (DTensor metadata at any size, no peer needed), on this
machine's device; the reference's shards are allocated before its timer starts and timed apart
(``reference_alloc_s``): in a switch the transfer makes them. Nothing is moved.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from liver.config.jobfile import build as build_config, override
from liver.engine.interface import EngineAdapter, load_adapter
from liver.engine.reference import ADAPTER as REFERENCE
from liver.resource_view.table import box_of
from liver.topology import ParallelConfig


def _enter_s(adapter: EngineAdapter, job, layout, device: torch.device, shards: bool) -> tuple[float, float]:
    """Seconds of ``enter`` for rank 0 of ``layout`` (with its shards made first where ``shards``),
    and of making those shards."""
    world = adapter.mock_world(0, layout, 0, "gloo" if device.type == "cpu" else "nccl", device)
    with world.registered():
        made = {}
        t0 = time.perf_counter()
        if shards:
            view = adapter.view(job, layout)
            for s in adapter.state_specs(job):
                box = box_of(view, s, 0)
                if box is not None:
                    made[s.name] = torch.empty([hi - lo for lo, hi in box], dtype=getattr(torch, s.dtype),
                                               device=device)
        alloc = time.perf_counter() - t0
        t1 = time.perf_counter()
        engine = adapter.enter(job, world, device, lambda storage: made if shards else storage)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - t1
        del engine, made
    gc.collect()
    return took, alloc


def run(engine: str, model: str, layouts: list[str], repeats: int, sets: list[str] = ()) -> list[dict[str, Any]]:
    cfg = build_config({"preset": model, "engine": engine}, *[override(t) for t in sets])
    native = load_adapter(cfg.engine)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    parallels = [ParallelConfig.parse(p) for p in layouts]
    for p in parallels:  # (a layout either engine refuses: refused now, naming it)
        native.layout(cfg.job, p), REFERENCE.layout(cfg.job, p)
    if repeats < 2:
        raise ValueError(f"--repeats={repeats}: allowed 2 or more (the first is left out)")
    rows = []
    for p in parallels:
        n_lay, r_lay = native.layout(cfg.job, p), REFERENCE.layout(cfg.job, p)
        nat = [_enter_s(native, cfg.job, n_lay, device, shards=False)[0] for _ in range(repeats)][1:]
        ref = [_enter_s(REFERENCE, cfg.job, r_lay, device, shards=True) for _ in range(repeats)][1:]
        n, r = statistics.median(nat), statistics.median(x for x, _ in ref)
        rows.append({"model": model, "parallel": p.short(), "device": str(device), "native_s": n, "reference_s": r,
                     "reference_alloc_s": statistics.median(a for _, a in ref), "ratio": n / r if r else None,
                     "native_all_s": nat, "reference_all_s": [x for x, _ in ref]})
    return rows
