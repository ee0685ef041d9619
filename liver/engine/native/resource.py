"""The Resource View of a DTensor job: tensor specs and per-rank box tables from placements.

A DTensor says how it is laid out over its mesh: one placement per mesh dimension (``Shard(d)``,
``Replicate()``, the ``_StridedShard`` that FSDP over TP makes). Placements are the same on every
rank (SPMD), so one rank's model, built and parallelised on the meta device, gives them for the
whole layout; each rank's box then follows from the mesh's shape and the rank's coordinate alone
(``torch.distributed.tensor._utils._compute_local_shape_and_global_offset``, the function DTensor
itself uses for checkpoints: uneven ``torch.chunk`` splits and empty shards included). Parameters
and their optimizer state (AdamW's moments carry their parameter's placements) alike; a plain
tensor is replicated. What cannot be described is refused, naming the tensor: a ``Partial``
placement at a boundary (a pending reduction is not state). Which optimizer state there is, the
optimizer says (``optim.py``).
Pure metadata: no collective, no storage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

try:  # FSDP over TP's shards (a private placement; its module moved between versions)
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # pragma: no cover
    from torch.distributed._tensor.placement_types import _StridedShard


def sharded(p) -> bool:
    """Whether a placement shards its mesh dimension: ``Shard``, or FSDP-over-TP's ``_StridedShard``
    (which on torch 2.13 is no ``Shard`` and says ``is_shard()`` False)."""
    return isinstance(p, (Shard, _StridedShard))

from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable
from liver.resource_view.view import Box

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int64: "int64",
           torch.uint8: "uint8"}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Placed:
    """One logical tensor as it is laid out: its spec, its mesh dimensions' sizes and placements."""

    spec: TensorSpec
    mesh_dims: tuple[str, ...]  # the (sub)mesh it lives on, by dimension name; () for a plain tensor
    mesh_shape: tuple[int, ...]
    placements: tuple[Any, ...]
    stage: int | None = None    # the pipeline stage whose model holds it (None: every rank's model)

    def box(self, coordinate: dict[str, int]) -> Box | None:
        """The box that the rank at ``coordinate`` (its index along each named dimension of the
        generation's mesh) holds; None for an empty shard, or a tensor of another stage."""
        if self.stage is not None and coordinate["pp"] != self.stage:
            return None
        shape = self.spec.shape
        if not self.placements:
            return tuple((0, n) for n in shape)
        local, offset = _compute_local_shape_and_global_offset(shape, self.mesh_shape,
                                                               [coordinate[d] for d in self.mesh_dims],
                                                               list(self.placements))
        if any(n == 0 for n in local):
            return None
        return tuple((o, o + n) for o, n in zip(offset, local))


def _dtype(name: str, t: "torch.Tensor | torch.dtype") -> str:
    dtype = t if isinstance(t, torch.dtype) else t.dtype
    if dtype not in _DTYPES:
        raise ValueError(f"tensor {name!r} has dtype {dtype}: allowed {sorted(map(str, _DTYPES))}")
    return _DTYPES[dtype]


def _placed(name: str, t: torch.Tensor, layer: int, kind: str, param: str) -> Placed:
    mesh_dims: tuple[str, ...] = ()
    mesh_shape: tuple[int, ...] = ()
    placements: tuple = ()
    shard_dim = None
    if isinstance(t, DTensor):
        placements = tuple(t.placements)
        for p in placements:
            if isinstance(p, Partial) or not isinstance(p, (Shard, _StridedShard, Replicate)):
                raise ValueError(f"tensor {name!r} has placement {type(p).__name__} ({p}) at an iteration boundary: "
                                 f"allowed Shard and "
                                 f"Replicate (a Partial is a pending reduction, not state)")
        mesh_shape = tuple(t.device_mesh.shape)
        mesh_dims = tuple(t.device_mesh.mesh_dim_names or ())
        if len(mesh_dims) != len(mesh_shape):
            raise ValueError(f"tensor {name!r} lives on a mesh without dimension names: build it on the mesh "
                             f"LiveR gives (its dimensions 'pp', 'dp', 'tp')")
        shards = [p.dim for p in placements if sharded(p)]
        shard_dim = shards[0] if shards else None
    spec = TensorSpec(name, tuple(t.shape), _dtype(name, t), layer, shard_dim, kind, param)
    return Placed(spec, mesh_dims, mesh_shape, placements)


def layer_of(names: list[str]) -> dict[str, int]:
    """Streaming order: ``layers.N.`` gives layer N; what comes before the first layer (the
    embedding) -1, what comes after the last one (final norm, head) one past it."""
    found = {n: int(m.group(1)) for n in names if (m := _LAYER.search(n))}
    top = max(found.values(), default=-1) + 1
    out, seen_layer = {}, False
    for n in names:
        if n in found:
            out[n], seen_layer = found[n], True
        else:
            out[n] = top if seen_layer else -1
    return out


def blocks(names: list[str]) -> int:
    """The blocks (``layers.N.``) a model's tensor names show: one past the highest N (one where
    none: the whole model is one block)."""
    found = [int(m.group(1)) for n in names if (m := _LAYER.search(n))]
    return max(found) + 1 if found else 1


def persistent_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's persistent buffers by qualified name (in ``state_dict``: a running statistic, a
    counter), which a step may read and change; non-persistent ones are recomputed (``init_buffers``)."""
    out, seen = [], set()
    for prefix, mod in model.named_modules():
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set and id(b) not in seen:
                seen.add(id(b))
                out.append((f"{prefix}.{name}" if prefix else name, b))
    return out


def placed_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, kinds=None) -> list[Placed]:
    """Every parameter (by its qualified name), each followed by its optimizer state of the kinds
    ``kinds`` describes (an ``optim.OptimizerState``: the parameter's geometry), then the
    persistent buffers; refuses what it cannot describe."""
    params = list(model.named_parameters())
    buffers = persistent_buffers(model)
    if optimizer is not None:
        _check_optimizer(model, optimizer)
    layers = layer_of([n for n, _ in params] + [n for n, _ in buffers])
    out = []
    for name, p in params:
        pl = _placed(name, p, layers[name], "param", "")
        out.append(pl)
        spec = pl.spec
        for key, dtype in kinds.tensors if kinds is not None else ():
            s = TensorSpec(f"{name}.{key}", spec.shape, spec.dtype if dtype is None else _dtype(f"{name}.{key}", dtype),
                           spec.layer, spec.shard_dim, key, name)
            out.append(Placed(s, pl.mesh_dims, pl.mesh_shape, pl.placements))
    out += [_placed(name, b, layers[name], "buffer", "") for name, b in buffers]
    return out


def _check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer holds a tensor that is not a parameter of the model: "
                                 "LiveR cannot name it")


def table(placed: list[Placed], coordinates: list[dict[str, int]], name: str = "dtensor") -> BoxTable:
    """The box table of every tensor over the ranks at ``coordinates`` (rank r at coordinates[r])."""
    specs = [p.spec for p in placed]
    boxes = {p.spec.name: [[b] if (b := p.box(c)) is not None else [] for c in coordinates] for p in placed}
    return BoxTable.build(len(coordinates), boxes, specs, name)


def local_box(name: str, t: torch.Tensor) -> Box | None:
    """The box this rank's local tensor of ``t`` is, by DTensor's own account (for a check)."""
    if not isinstance(t, DTensor):
        return tuple((0, n) for n in t.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if any(n == 0 for n in local):
        return None
    return tuple((o, o + n) for o, n in zip(offset, local))
