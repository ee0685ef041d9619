"""Save and load the engine's full state with PyTorch Distributed Checkpoint (DCP).

Sharded tensors are saved as DTensors (the engine says over which mesh and placements), so DCP
records each shard's global offset and reshards at load time into any other valid layout and
world size. Replicated tensors are plain tensors (DCP keeps one copy). This is the fail-stop
fallback and the stop-and-restart baseline.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from liver.engine.interface import TrainingEngine as Engine

SCALARS = "scalars"


def _state_dict(engine: Engine, tensors: dict[str, torch.Tensor] | None = None, cpu: bool = False) -> dict[str, Any]:
    """DCP's view of the engine's state (``TrainingEngine.checkpoint_tensors``: shards as DTensors,
    so DCP records each one's global offsets) and its scalars; ``tensors`` replaces the engine's
    own (a snapshot on the host, over the World's CPU groups: ``cpu``)."""
    _group(engine)  # DeviceMesh needs the generation registered
    sd: dict[str, Any] = dict(engine.checkpoint_tensors(tensors, cpu))
    sd[SCALARS] = engine.scalars()
    return sd


def _group(engine: Engine):
    w = engine.world
    if w.all.size == 1:
        return None
    if not w._registered:
        w.activate()
    return w.all.pg


def save(engine: Engine, path: str | Path) -> float:
    """Collective: write the full state under ``path``; returns seconds taken."""
    t0 = time.perf_counter()
    dcp.save(_state_dict(engine), checkpoint_id=str(path), process_group=_group(engine),
             no_dist=engine.world.all.size == 1)
    return time.perf_counter() - t0


def load(engine: Engine, path: str | Path) -> float:
    """Collective: fill the engine's shards (any layout) from ``path``; returns seconds taken."""
    t0 = time.perf_counter()
    sd = _state_dict(engine)
    dcp.load(sd, checkpoint_id=str(path), process_group=_group(engine),
             no_dist=engine.world.all.size == 1)
    for name, t in engine.state.items():  # DTensor loads land in the local tensor already
        v = sd[name]
        local = v.to_local() if isinstance(v, DTensor) else v
        if local.data_ptr() != t.data_ptr():
            t.copy_(local)
    engine.load_scalars(sd[SCALARS])
    engine.refresh()
    return time.perf_counter() - t0
