"""The engine's full logical state: a layout-independent digest, and a gather to one rank (tests).

The digest covers every element of every logical tensor and the scalars. Each slice along a
tensor's TP-sharded dimension (or the whole tensor, when replicated) is reduced where it lives (on
the GPU, on a GPU run) to a 128-bit row hash: two sums, modulo 2**64, of the elements' bit patterns
times fixed odd 64-bit weights, one weight per position in the slice. Changing any element's bits
changes both sums (an odd weight times a nonzero change is nonzero modulo 2**64), and integer sums
do not depend on the order of the additions, so the hash is the same whatever the layout or the
kernel. The digest is sha256 over, per tensor in spec order, its row hashes in row order, then the
scalars as canonical JSON. No rank ever holds more than its own shards.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import torch

from liver.engine.interface import TrainingEngine as Engine
from liver.resource_view.spec import TensorSpec


def _owns(engine: Engine, spec: TensorSpec) -> bool:
    """Exactly one rank hashes each element: DP replica 0, and TP rank 0 for replicated tensors."""
    c = engine.layout.coord(engine.world.rank)
    return spec.name in engine.boxes and c.dp == 0 and (spec.shard_dim is not None or c.tp == 0)


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK_ELEMENTS = 32 << 20  # rows hashed together: bounds the temporary memory (~0.5 GiB)
_weights: dict[tuple[int, str], torch.Tensor] = {}


def _weights_for(n: int, device: torch.device) -> torch.Tensor:
    """[2, n] fixed odd int64 weights, the same on every process."""
    key = (n, str(device))
    if key not in _weights:
        g = torch.Generator().manual_seed(0x5EED + n)
        w = torch.randint(-(2**62), 2**62, (2, n), dtype=torch.int64, generator=g) * 2 + 1
        _weights[key] = w.to(device)
    return _weights[key]


def row_hashes(t: torch.Tensor, shard_dim: int | None) -> np.ndarray:
    """[rows, 2] int64: the 128-bit hash of each slice of ``t`` along ``shard_dim`` (one row for
    the whole tensor when None), computed on ``t``'s device."""
    x = t.detach()
    rows = x.reshape(1, -1) if shard_dim is None else x.movedim(shard_dim, 0).reshape(x.shape[shard_dim], -1)
    bits = rows.contiguous().view(_INT[x.element_size()])
    w = _weights_for(bits.shape[1], bits.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, bits.shape[1]))
    out = [torch.stack([(b.to(torch.int64) * w[k]).sum(dim=1) for k in range(2)], dim=1)
           for b in bits.split(step)]
    return torch.cat(out).cpu().numpy()


def _local_hashes(engine: Engine) -> list[tuple[int, int, np.ndarray]]:
    """(spec index, first global row, row hashes) for each tensor this rank owns."""
    out = []
    for i, spec in enumerate(engine.specs):
        if _owns(engine, spec):
            lo = 0 if spec.shard_dim is None else engine.boxes[spec.name][spec.shard_dim][0]
            out.append((i, lo, row_hashes(engine.state[spec.name], spec.shard_dim)))
    return out


def state_digest(engine: Engine) -> str:
    """Collective over the engine's World: the same hex digest on every rank."""
    parts = engine.world.all.all_gather_object(_local_hashes(engine))
    by_tensor: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, lo, hashes in (x for p in parts for x in p):
        by_tensor.setdefault(i, []).append((lo, hashes))
    h = hashlib.sha256()
    for i in sorted(by_tensor):
        pieces = sorted(by_tensor[i], key=lambda x: x[0])
        rows = np.concatenate([hashes for _, hashes in pieces])
        starts = np.cumsum([0] + [len(x) for _, x in pieces[:-1]])
        if [lo for lo, _ in pieces] != list(starts):
            raise RuntimeError(f"digest of {engine.specs[i].name}: row slices from the ranks do not tile it "
                               f"(first rows {[lo for lo, _ in pieces]})")
        h.update(f"{engine.specs[i].name}:{len(rows)}\n".encode())  # the same bytes for any layout
        h.update(np.ascontiguousarray(rows).tobytes())
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
