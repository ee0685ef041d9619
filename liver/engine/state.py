"""The engine's full logical state: a layout-independent digest, and a gather to one rank (tests).

The digest is sha256 over a canonical sequence: for each logical tensor in spec order, the sha256
of each slice along its TP-sharded dimension (or of the whole tensor when replicated), then the
scalars as canonical JSON. Any layout yields the same sequence for the same logical state, and
no rank ever holds more than its own shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from liver.engine.trainer import Engine
from liver.resource_view.spec import TensorSpec


def _owns(engine: Engine, spec: TensorSpec) -> bool:
    """Exactly one rank hashes each element: DP replica 0, and TP rank 0 for replicated tensors."""
    c = engine.layout.coord(engine.world.rank)
    return spec.name in engine.boxes and c.dp == 0 and (spec.shard_dim is not None or c.tp == 0)


PARALLEL_HASH_BYTES = 256 << 20


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _local_hashes(engine: Engine) -> list[tuple[int, int, str]]:
    keys, blobs = [], []
    for i, spec in enumerate(engine.specs):
        if not _owns(engine, spec):
            continue
        t = engine.state[spec.name].detach().cpu()
        if spec.shard_dim is None:
            keys.append((i, 0))
            blobs.append(t.contiguous().numpy().data)
            continue
        lo = engine.boxes[spec.name][spec.shard_dim][0]
        rows = t.movedim(spec.shard_dim, 0).contiguous().numpy()
        for j in range(rows.shape[0]):
            keys.append((i, lo + j))
            blobs.append(rows[j].data)
    total = sum(b.nbytes for b in blobs)
    if total < PARALLEL_HASH_BYTES:
        digests = [_sha(b) for b in blobs]
    else:  # hashlib releases the GIL on large buffers: hash on every core (big models)
        with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
            digests = list(pool.map(_sha, blobs, chunksize=256))
    return [(i, j, d) for (i, j), d in zip(keys, digests)]


def state_digest(engine: Engine) -> str:
    """Collective over the engine's World: the same hex digest on every rank."""
    parts = engine.world.all.all_gather_object(_local_hashes(engine))
    h = hashlib.sha256()
    for i, j, d in sorted(x for p in parts for x in p):
        h.update(f"{engine.specs[i].name}/{j}/{d}\n".encode())
    h.update(json.dumps(engine.scalars(), sort_keys=True).encode())
    return h.hexdigest()


def gather_full_state(engine: Engine) -> dict[str, Any] | None:
    """Every logical tensor, whole, on rank 0 (None elsewhere); plus the scalars. Small models only."""
    mine = [(spec.name, engine.boxes[spec.name], engine.state[spec.name].detach().cpu())
            for spec in engine.specs if _owns(engine, spec)]
    parts = engine.world.all.all_gather_object(mine)
    if engine.world.rank != 0:
        return None
    full: dict[str, Any] = {s.name: torch.empty(s.shape, dtype=torch.float32) for s in engine.specs}
    for part in parts:
        for name, box, t in part:
            full[name][tuple(slice(lo, hi) for lo, hi in box)] = t
    full["__scalars__"] = engine.scalars()
    return full
