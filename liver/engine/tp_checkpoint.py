"""DCP's view of an engine's shards when its tensors are split over TP along one dimension each
(``TensorSpec.shard_dim``, even chunks in TP-rank order): those as DTensors over the TP group, so
that DCP records their global offsets; replicated ones plain."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from liver.resource_view.spec import TensorSpec


def tp_dtensors(specs: list[TensorSpec], tensors: dict[str, torch.Tensor], tp) -> dict[str, torch.Tensor]:
    """``tensors`` (by spec name; those this rank holds) for DCP, over ``tp`` (a ``Group``)."""
    mesh = DeviceMesh.from_group(tp.pg, tp.device.type) if tp.size > 1 else None
    out: dict[str, torch.Tensor] = {}
    for spec in specs:
        if spec.name not in tensors:
            continue
        t = tensors[spec.name]
        if mesh is not None and spec.shard_dim is not None:
            t = DTensor.from_local(t, mesh, [Shard(spec.shard_dim)], run_check=False, shape=torch.Size(spec.shape),
                                   stride=torch.empty(spec.shape, device="meta").stride())
        out[spec.name] = t
    return out
