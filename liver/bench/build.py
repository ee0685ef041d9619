"""``liver bench build``: the engine construction left inside a switch, native against reference,
at a preset's shape and several layouts.

A switch builds the new generation's engine, then the transfer fills it (``EngineAdapter.enter``).
Prepare makes what it can of it before (``EngineAdapter.prebuild``): for a user's model (the native
engine) the model on the meta device laid out by the recipe's ``parallelize`` on the new mesh, and
the storage of the shards that move where it fits in the staging budget's spare; the switch then
makes the optimizer over it and adopts the storage. The reference engine's parameters and compute
copies are made from the delivered shards: only its shards' storage is made before. Timed here for
rank 0 of each layout, in one process over a mock world (DTensor metadata at any size, no peer
needed), on this machine's device, each way interleaved (``WAYS``); the prebuild's seconds are
reported apart (``*_prebuild_s``: beside training, not in the pause). Nothing is moved.

Then the new engine's first step, against its second (``*_first_extra_s``): what a switch's
downtime also holds. For a user's model the first step on a new mesh pays DTensor's sharding
propagation, unless Prepare worked it out ahead (``liver/engine/native/ahead.py``: the ways with a
prebuild). The steps run on the mock world (its collectives return at once) over state that was
never written: their time, not their values, is what is read.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from typing import Any

import torch

from liver.config.jobfile import build as build_config, override
from liver.engine.interface import EngineAdapter, load_adapter
from liver.engine.reference import ADAPTER as REFERENCE
from liver.topology import ParallelConfig
from liver.world.world import forget_meshes


def _enter_s(adapter: EngineAdapter, job, layout, device: torch.device, spare: int | None) -> tuple[float, float, float]:
    """Seconds of ``enter`` for rank 0 of ``layout``, of the ``prebuild`` before it (with
    ``spare`` bytes for storage; None: none, all built in the switch), which runs as Prepare runs
    it: in another thread, the World registered in that thread only; and of the first step beyond
    the second."""
    world = adapter.mock_world(0, layout, 0, "gloo" if device.type == "cpu" else "nccl", device)
    made: list = []

    def prepare() -> None:
        t0 = time.perf_counter()
        with world.registered_here():
            made.append(adapter.prebuild(job, world, device, {}, spare))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        made.append(time.perf_counter() - t0)

    if spare is not None:
        thread = threading.Thread(target=prepare)
        thread.start()
        thread.join()
        if len(made) != 2:
            raise RuntimeError(f"{adapter.name} {layout.parallel.short()}: the prebuild failed (see above)")
    pre, pre_s = made if made else (None, 0.0)
    with world.registered():
        t1 = time.perf_counter()
        engine = adapter.enter(job, world, device, lambda storage: storage, prebuilt=pre)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - t1
        first, second = (_step_s(engine, device) for _ in range(2))
        del engine, pre, made
    forget_meshes()
    gc.collect()  # (its memory back to the allocator, not to the device: as a switch leaves the old engine's)
    return took, pre_s, first - second


def _step_s(engine, device: torch.device) -> float:
    t0 = time.perf_counter()
    engine.train_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


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
        runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in WAYS}
        for _ in range(repeats):  # (interleaved: a drift of the machine falls on every way alike)
            for way, (adapter, lay, spare) in {"native_at_switch": (native, n_lay, None),
                                               "native_structure": (native, n_lay, 0),
                                               "native": (native, n_lay, ALL),
                                               "reference": (REFERENCE, r_lay, ALL)}.items():
                runs[way].append(_enter_s(adapter, cfg.job, lay, device, spare))
        row: dict[str, Any] = {"model": model, "parallel": p.short(), "device": str(device)}
        for way, xs in runs.items():
            row[f"{way}_s"] = statistics.median(x[0] for x in xs[1:])
            row[f"{way}_prebuild_s"] = statistics.median(x[1] for x in xs[1:])
            row[f"{way}_first_extra_s"] = statistics.median(x[2] for x in xs[1:])
            row[f"{way}_all_s"] = [x[0] for x in xs[1:]]
        row["ratio"] = row["native_s"] / row["reference_s"] if row["reference_s"] else None
        # the switch's build and the first step's extra together: what of the downtime the engine holds
        # (an extra below 0 is the noise of a step that has none: counted as none)
        row["with_first_step_ratio"] = (row["native_s"] + max(0.0, row["native_first_extra_s"])) / \
            (row["reference_s"] + max(0.0, row["reference_first_extra_s"]))
        rows.append(row)
    return rows


WAYS = ("native_at_switch", "native_structure", "native", "reference")
"""The build left in the switch: the native engine with nothing made before it, with its model laid
out before it (storage made in it), with both made before it; the reference engine with its
shards made before it (its build needs their values: the rest stays in the switch)."""
ALL = 1 << 62  # (a spare that any storage fits in)
