"""``liver bench build``: the engine construction left inside a switch, native against reference,
at a preset's shape and several layouts.

A switch builds the new generation's engine, then the transfer fills it (``EngineAdapter.enter``).
Prepare makes what it can of it before (``EngineAdapter.prebuild``): for a user's model (the native
engine) the whole engine where its storage fits in the staging budget's spare (the model laid out
by the recipe's ``parallelize`` on the new mesh, its storage, the optimizer and its state); the
switch then only takes it. The reference engine's parameters and compute
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

import dataclasses
import gc
import math
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


@dataclasses.dataclass
class _Way:
    """One way's figures for one layout (``_enter_s``)."""

    switch_s: float             # ``enter``: the build left in the switch
    prebuild_s: float           # ``prebuild``, beside training (0: none)
    first_extra_s: float        # the first step beyond the second (NaN: the steps ran out of memory)
    built_bytes: int = 0        # on an accelerator: what the built engine holds,
    peak_bytes: int = 0         # the peak beyond what was allocated before,
    left_bytes: int = 0         # and what is left after (0 unless something outlives the engine)
    ahead: str = ""             # what the prebuild worked out ahead (``ahead.py``), and its error


def _enter_s(adapter: EngineAdapter, job, layout, device: torch.device, spare: int | None) -> _Way:
    """``enter`` for rank 0 of ``layout``, the ``prebuild`` before it (with ``spare`` bytes for
    storage; None: none, all built in the switch), which runs as Prepare runs it: in another
    thread, the World registered in that thread only; and the first step beyond the second."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.init()  # (resetting the allocator's statistics needs it initialised)
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if cuda else 0
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
    ahead = " / ".join(str(v) for k, v in (pre.ahead if pre is not None else {}).items() if k != "ahead_s")
    with world.registered():
        t1 = time.perf_counter()
        engine = adapter.enter(job, world, device, lambda storage: storage, prebuilt=pre)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - t1
        built = torch.cuda.memory_allocated(device) - base if cuda else 0
        try:
            first, second = (_step_s(engine, device) for _ in range(2))
        except torch.OutOfMemoryError:  # (the steps' activations on one rank: the build's figures still stand)
            first = second = float("nan")
        del engine, pre, made
    forget_meshes()
    gc.collect()  # (its memory back to the allocator, not to the device: as a switch leaves the old engine's)
    if not cuda:
        return _Way(took, pre_s, first - second, ahead=ahead)
    return _Way(took, pre_s, first - second, built, torch.cuda.max_memory_allocated(device) - base,
                torch.cuda.memory_allocated(device) - base, ahead)


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
        runs: dict[str, list[_Way]] = {k: [] for k in WAYS}
        for _ in range(repeats):  # (interleaved: a drift of the machine falls on every way alike)
            for way, (adapter, lay, spare) in {"native_at_switch": (native, n_lay, None),
                                               "native_structure": (native, n_lay, 0),
                                               "native": (native, n_lay, ALL),
                                               "reference": (REFERENCE, r_lay, ALL)}.items():
                runs[way].append(_enter_s(adapter, cfg.job, lay, device, spare))
        row: dict[str, Any] = {"model": model, "parallel": p.short(), "device": str(device)}
        for way, xs in runs.items():
            row[f"{way}_s"] = statistics.median(x.switch_s for x in xs[1:])
            row[f"{way}_prebuild_s"] = statistics.median(x.prebuild_s for x in xs[1:])
            extras = [x.first_extra_s for x in xs[1:]]  # (None: its steps ran out of memory)
            row[f"{way}_first_extra_s"] = None if any(math.isnan(e) for e in extras) else statistics.median(extras)
            row[f"{way}_all_s"] = [x.switch_s for x in xs[1:]]
            row[f"{way}_first_extra_all_s"] = [None if math.isnan(x.first_extra_s) else x.first_extra_s for x in xs[1:]]
            if device.type == "cuda":  # (the largest over the repeats; left: after the last)
                row[f"{way}_built_bytes"] = xs[-1].built_bytes
                row[f"{way}_peak_bytes"] = max(x.peak_bytes for x in xs)
                row[f"{way}_left_bytes"] = xs[-1].left_bytes
        row["native_ahead"] = runs["native"][-1].ahead
        row["ratio"] = row["native_s"] / row["reference_s"] if row["reference_s"] else None
        # the switch's build and the first step's extra together: what of the downtime the engine holds
        # (an extra below 0 is the noise of a step that has none: counted as none)
        nx, rx = row["native_first_extra_s"], row["reference_first_extra_s"]
        row["with_first_step_ratio"] = None if nx is None or rx is None else \
            (row["native_s"] + max(0.0, nx)) / (row["reference_s"] + max(0.0, rx))
        rows.append(row)
    return rows


WAYS = ("native_at_switch", "native_structure", "native", "reference")
"""The build left in the switch: the native engine with nothing made before it, with its model laid
out before it (storage and optimizer made in it), made whole before it; the reference engine with its
shards made before it (its build needs their values: the rest stays in the switch)."""
ALL = 1 << 62  # (a spare that any storage fits in)
