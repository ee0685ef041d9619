"""The engine's full logical state: a layout-independent digest, and a gather to one rank (tests).

The digest covers every element of every logical tensor and the scalars, and refuses an engine
that holds a tensor influencing the next step outside its state (``unaccounted``: optimizer
state of an unknown kind, persistent buffers) or, at a boundary, a gradient. Each rank hashes the
boxes it holds (``engine.boxes``, any Resource View: a Layout's, or DTensor's uneven shards) where
they live (on the GPU, on a GPU run): two sums, modulo 2**64, of the elements' bit patterns times
weights drawn from each element's position in the whole tensor (odd 64-bit values, a fixed mix of
the flat index). Changing any element's bits changes both sums (an odd weight times a nonzero
change is nonzero modulo 2**64); integer sums do not depend on how the tensor is cut nor on the
order of the additions, so the sums of the distinct boxes add up to the same pair whatever the
layout or the kernel. Replicas of a box count once; boxes that overlap without being equal, or
that leave elements out, are an error. The digest is sha256 over, per tensor in name order (a
layout may list them in another order: a pipeline's stages, each with its buffers), its name,
shape and pair, then the scalars as canonical JSON. No rank ever holds more than its own
shards.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import torch

from liver.engine.interface import TrainingEngine as Engine
from liver.resource_view.view import Box, box_numel

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK_ELEMENTS = 16 << 20  # elements hashed together: bounds the temporary memory (~0.4 GiB)
_KEPT_BYTES = 64 << 20  # the weights of boxes hashed again and again (a digest every step), kept up to this
_kept: dict[tuple, torch.Tensor] = {}
_kept_bytes = 0
_M = 1 << 64
_MIX = tuple(c - _M if c >= 1 << 63 else c for c in (0x9F3D5B79A2C4E687, 0x5851F42D4C957F2D, 0x2545F4914F6CDD1D,
                                                     0x94D049BB133111EB))  # as signed int64


class DigestError(RuntimeError):
    """The state cannot be digested as it stands (replicas that differ, a tensor outside the
    state, a gradient held at a boundary): a finding of the check, not a broken group. The
    runtime records it and the job goes on (a broken group during the digest's gather is a
    plain RuntimeError, which stops the generation as any collective's would)."""


def _weights(flat: torch.Tensor) -> torch.Tensor:
    """[2, n] odd int64 weights from flat indices (wrapping arithmetic: a fixed mix, any device)."""
    out = []
    for a, b in ((_MIX[0], _MIX[1]), (_MIX[2], _MIX[3])):
        x = flat * a + b
        x = x ^ (x >> 31)
        x = x * b
        x = x ^ (x >> 29)
        out.append(x | 1)
    return torch.stack(out)


def box_hash(t: torch.Tensor, box: Box, shape: tuple[int, ...]) -> tuple[int, int]:
    """The pair of sums (modulo 2**64) of shard ``t``, the box ``box`` of a tensor of ``shape``."""
    global _kept_bytes
    x = t.detach()
    if x.dim() == 0:
        x = x.reshape(1)
    bits = x.contiguous().view(_INT[x.element_size()]).reshape(x.shape[0], -1) if x.numel() else None
    if bits is None:
        return 0, 0
    strides = torch.empty(shape or (1,), device="meta").stride()
    dev = bits.device
    rows_per = max(1, _CHUNK_ELEMENTS // max(1, bits.shape[1]))
    # the flat index of each element of one row of the box, and of the start of each row
    inner = torch.zeros((), dtype=torch.int64, device=dev)
    for (lo, hi), st in list(zip(box, strides))[1:]:
        inner = (inner.unsqueeze(-1) + torch.arange(lo, hi, dtype=torch.int64, device=dev) * st)
    inner = inner.reshape(1, -1)
    lo0 = box[0][0] if box else 0
    s0 = strides[0] if box else 0
    h = [0, 0]
    for start in range(0, bits.shape[0], rows_per):
        b = bits[start:start + rows_per].to(torch.int64)
        key = (str(dev), shape, tuple(map(tuple, box)), start)
        w = _kept.get(key)
        if w is None:
            first = (torch.arange(start, start + b.shape[0], dtype=torch.int64, device=dev) + lo0) * s0
            w = _weights(first.unsqueeze(1) + inner)
            if _kept_bytes + w.nbytes <= _KEPT_BYTES:
                _kept[key], _kept_bytes = w, _kept_bytes + w.nbytes
        for k in range(2):
            h[k] = (h[k] + int((b * w[k]).sum().item())) % _M
    return h[0], h[1]


def _local(engine: Engine) -> list[tuple[int, Box, tuple[int, int]]]:
    outside = engine.unaccounted()
    if outside:
        raise DigestError(f"digest: {len(outside)} tensor(s) influence the next step but are not part of the "
                          f"engine's state (neither moved nor digested): {', '.join(outside[:4])}")
    return [(i, engine.boxes[s.name], box_hash(engine.state[s.name], engine.boxes[s.name], s.shape))
            for i, s in enumerate(engine.specs) if s.name in engine.boxes]


def _distinct(parts: list[list[tuple]], same=lambda a, b: a == b, specs=None) -> dict[int, dict[Box, Any]]:
    """Per tensor, each distinct box once (the lowest rank's). Replicas must agree (``same``): a
    replica whose bits differ from its peer's is an error, never averaged away (after any
    failure and handoff, every replica ends with equal state: torchft's promise)."""
    out: dict[int, dict[Box, Any]] = {}
    for rank, part in enumerate(parts):
        for i, box, value in part:
            key = tuple(map(tuple, box))
            seen = out.setdefault(i, {}).setdefault(key, value)
            if seen is not value and not same(seen, value):
                name = f"{specs[i].name!r}" if specs is not None else f"#{i}"
                raise DigestError(f"digest: tensor {name}, box {list(map(list, key))}: the replica of rank {rank} "
                                  f"differs from the one before it")
    return out


def state_digest(engine: Engine) -> str:
    """Collective over the engine's World: the same hex digest on every rank. At an iteration
    boundary only: no gradient may be held there (a step's outcome would depend on it)."""
    held = engine.held_grads()
    if held:
        raise DigestError(f"digest: {len(held)} parameter(s) hold a gradient at an iteration boundary "
                          f"({', '.join(held[:4])}); the next step would add to it")
    return combine(engine.specs, engine.world.all.all_gather_json(_local(engine)), engine.scalars())


def local_hashes(engine: Engine) -> list[list]:
    """This rank's part of the digest as plain data (no collective): [spec index, box, [s1, s2]]
    per tensor it holds; ``combine`` of the parts of ranks that together hold every element (a
    generation's survivors, say) is the state's digest."""
    return [[i, [list(b) for b in box], list(h)] for i, box, h in _local(engine)]


def combine(specs, parts: list[list], scalars: dict[str, Any]) -> str:
    """The digest from the ranks' parts (``local_hashes``, or gathered ``_local``) and the scalars."""
    parts = [[(i, tuple(tuple(b) for b in box), tuple(v)) for i, box, v in part] for part in parts]
    by_tensor = _distinct(parts, specs=specs)
    h = hashlib.sha256()
    for i, spec in sorted(enumerate(specs), key=lambda x: x[1].name):  # (by name: the specs' order is a layout's)
        boxes = by_tensor.get(i, {})
        if not boxes and spec.kind not in ("param", "buffer"):  # an optimizer's state before its first step
            h.update(f"{spec.name}:absent\n".encode())
            continue
        covered = sum(box_numel(b) for b in boxes)
        if covered != max(1, spec.numel) or not boxes:
            raise DigestError(f"digest of {spec.name}: the ranks' distinct boxes hold {covered} elements of its "
                              f"{spec.numel}; they must tile it")
        s1 = sum(v[0] for v in boxes.values()) % _M
        s2 = sum(v[1] for v in boxes.values()) % _M
        h.update(f"{spec.name}:{list(spec.shape)}:{s1:016x}{s2:016x}\n".encode())  # the same bytes for any layout
    h.update(json.dumps(scalars, sort_keys=True).encode())
    return h.hexdigest()


def _tensor_json(t: torch.Tensor) -> list:
    """A tensor as plain data, bit for bit: its dtype, shape and bytes (base64)."""
    t = t.detach().cpu().contiguous()
    return [str(t.dtype).removeprefix("torch."), list(t.shape),
            base64.b64encode(t.reshape(-1).view(torch.uint8).numpy().tobytes()).decode()]


def _json_tensor(dtype: str, shape: list[int], data: str) -> torch.Tensor:
    raw = bytearray(base64.b64decode(data))
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape)


def gather_full_state(engine: Engine) -> dict[str, Any] | None:
    """Every logical tensor, whole, on rank 0 (None elsewhere); plus the scalars. Small models only."""
    mine = [[i, engine.boxes[s.name], *_tensor_json(engine.state[s.name])]
            for i, s in enumerate(engine.specs) if s.name in engine.boxes]
    parts = [[(i, tuple(map(tuple, box)), _json_tensor(*t)) for i, box, *t in part]
             for part in engine.world.all.all_gather_json(mine)]
    by_tensor = _distinct(parts, same=torch.equal, specs=engine.specs)
    if engine.world.rank != 0:
        return None
    full: dict[str, Any] = {}
    for i, spec in enumerate(engine.specs):
        t = None
        for box, part in by_tensor.get(i, {}).items():
            if t is None:
                t = torch.empty(spec.shape, dtype=part.dtype)
            t[tuple(slice(lo, hi) for lo, hi in box)] = part
        full[spec.name] = t
    full["__scalars__"] = engine.scalars()
    return full
