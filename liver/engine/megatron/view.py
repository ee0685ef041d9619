"""The Resource View of a Megatron-Core GPT model, read from Megatron's own sharded-state metadata.

Megatron describes every rank's piece of its state for its distributed checkpoints
(``sharded_state_dict``): per tensor a key, the global shape, the rank's offset in it, the local
shape, and a replica id (all zeros on the one replica that saves it). LiveR reads that, on the
meta device over fake groups (``liver.world.fake``): rank r of any layout, in this process, no
peer needed. Two of Megatron's forms are cut to LiveR's one box per tensor and rank:

- a stack of layers (``decoder.layers.*``: one key, the layer on a leading axis, a box per layer)
  is a tensor per layer, ``decoder.layers.<i>.<rest>``, as the other engines name them (a pipeline
  change moves whole layers);
- the SwiGLU weight (``linear_fc1.weight``), whose gate and up halves Megatron shards each over
  TP (each rank holds two boxes of it), is two tensors, ``..._w`` and ``..._v`` (Megatron's own
  names for the halves); on the rank, each is one half of its local weight.

A layout's table is made from one model per pipeline stage and TP rank; its data-parallel replicas
hold the same boxes (Megatron's replica id then carries the DP rank last).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import torch

from liver.engine.megatron.config import GPTConfig
from liver.engine.megatron.model import collection, gpt, megatron
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable
from liver.resource_view.view import Box
from liver.topology import ModelFacts, ParallelConfig, TrainConfig
from liver.topology.layout import Layout
from liver.world.fake import FakeWorld, fake_pg

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_STACK = "decoder.layers."

@dataclass(frozen=True)
class Shard:
    """One rank's piece of one logical tensor: ``box`` of ``shape`` (global coordinates),
    Megatron's ``replica`` id (all zeros: the main replica), ``key`` (Megatron's), ``part``: where
    the piece is a chunk of the rank's local tensor, (axis, index, chunks); ``data``: the rank's
    tensor of the piece (its parameter, or a view of it), where the model has storage."""

    name: str
    shape: tuple[int, ...]
    box: Box
    replica: tuple[int, ...]
    dtype: str
    layer: int
    key: str
    part: tuple[int, int, int] | None = None
    data: Any = field(default=None, compare=False, repr=False)  # the rank's tensor of it (a view)

    @property
    def main(self) -> bool:
        return not any(self.replica)

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.shape, self.dtype, self.layer, None)

def shards(model: torch.nn.Module, dp: Any, layers: int) -> list[Shard]:
    """Every piece of ``model``'s state on this rank, from its ``sharded_state_dict`` (``dp``: the
    data-parallel group Megatron numbers replicas over; ``layers``: the model's layer count).
    ValueError naming the key for what this engine does not describe (a flattened range, an
    object with state)."""
    m = megatron()
    out: list[Shard] = []
    for item in _walk(model.sharded_state_dict(metadata={"dp_cp_group": dp})):
        if isinstance(item, m.ShardedObject):
            if item.data is not None and not _empty_extra(item.data):
                raise ValueError(f"megatron: {item.key!r} holds state that is not a tensor")
            continue
        if isinstance(item, m.ShardedTensorFactory):
            pieces = list(_walk(item.build()))
            if len(pieces) != 2 or pieces[0].key != pieces[1].key:
                raise ValueError(f"megatron: {item.key!r}: a factory of {len(pieces)} pieces; allowed SwiGLU's two")
            out += _halves(pieces, layers)
            continue
        if not isinstance(item, m.ShardedTensor):
            raise ValueError(f"megatron: {getattr(item, 'key', item)!r} is a {type(item).__name__}; allowed tensors")
        out.append(_shard(item, layers))
    return out

def _walk(x: Any) -> Iterator[Any]:
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _walk(v)
    else:
        yield x

def _empty_extra(data: Any) -> bool:
    """The local layer spec's ``_extra_state`` (no FP8 metadata): None, or an empty buffer."""
    return data is None or (isinstance(data, torch.Tensor) and data.numel() == 0)

def _shard(t: Any, layers: int) -> Shard:
    if t.flattened_range is not None:
        raise ValueError(f"megatron: {t.key!r} is a flattened range (distributed optimizer): not described yet")
    if t.dtype not in _DTYPES:
        raise ValueError(f"megatron: {t.key!r} has dtype {t.dtype}: allowed {sorted(map(str, _DTYPES))}")
    shape, offset, local = tuple(t.global_shape), tuple(t.global_offset), tuple(t.local_shape)
    n = t.prepend_axis_num
    replica = t.replica_id if isinstance(t.replica_id, tuple) else (t.replica_id,)
    if n == 1 and t.key.startswith(_STACK):  # one layer of the stack
        layer = offset[0]
        return Shard(f"{_STACK}{layer}.{t.key[len(_STACK):]}", shape[1:], _box(offset[1:], local),
                     tuple(replica), _DTYPES[t.dtype], layer, t.key, data=t.data)
    if n:
        raise ValueError(f"megatron: {t.key!r} has {n} leading axes of its own; allowed the layer stack's one")
    layer = -1 if t.key.startswith("embedding.") else layers
    return Shard(t.key, shape, _box(offset, local), tuple(replica), _DTYPES[t.dtype], layer, t.key, data=t.data)

def _box(offset: tuple[int, ...], local: tuple[int, ...]) -> Box:
    return tuple((o, o + n) for o, n in zip(offset, local))

def _halves(pieces: list[Any], layers: int) -> list[Shard]:
    """SwiGLU's two pieces of one key: the gate (``_w``, the first half along the axis they
    differ on) and the up projection (``_v``), each over half the global shape."""
    a, b = (_shard(p, layers) for p in pieces)
    axis = next(d for d, (x, y) in enumerate(zip(a.box, b.box)) if x != y)
    half = a.shape[axis] // 2
    if a.shape[axis] % 2 or not (a.box[axis][1] <= half <= b.box[axis][0]):
        raise ValueError(f"megatron: {a.key!r}: two pieces that are not its halves")
    shape = tuple(half if d == axis else n for d, n in enumerate(a.shape))
    v_box = tuple((lo - half, hi - half) if d == axis else (lo, hi) for d, (lo, hi) in enumerate(b.box))
    return [replace(a, name=a.name + "_w", shape=shape, part=(axis, 0, 2)),
            replace(b, name=b.name + "_v", shape=shape, box=v_box, part=(axis, 1, 2))]

@contextlib.contextmanager
def rank_model(config: GPTConfig, layout: Layout, rank: int,
               dtype: torch.dtype = torch.float32) -> Iterator[tuple[torch.nn.Module, Any]]:
    """Rank ``rank``'s stage of ``config``'s model under ``layout``, built on the meta device over
    fake groups as that rank, and its data-parallel group; the fake world is torch's default group
    for the duration (Megatron asks torch whether distributed is initialised), in this thread only:
    a worker's companion reads a layout's view beside the training thread, whose checkpoint writes
    see the Active World's groups meanwhile."""
    world = FakeWorld.build_fake(0, layout, rank, "gloo", torch.device("cpu"))
    with world.registered_here():
        pgs = collection(world.tp.pg, world.pp.pg, world.dp.pg, fake_pg(f"megatron-solo-{rank}", 0, 1))
        with torch.device("meta"):
            model = gpt(config, layout.parallel, list(layout.layers_per_stage), layout.coord(rank).pp, pgs, dtype,
                        perform_initialization=False)
        yield model, world.dp.pg


def rank_shards(config: GPTConfig, layout: Layout, rank: int, dtype: torch.dtype = torch.float32) -> list[Shard]:
    """Rank ``rank``'s pieces under ``layout`` (``rank_model``'s)."""
    with rank_model(config, layout, rank, dtype) as (model, dp):
        return shards(model, dp, config.num_layers)


def layout_shards(config: GPTConfig, layout: Layout, dtype: torch.dtype = torch.float32) -> list[list[Shard]]:
    """Every rank's pieces: one model per (stage, TP rank) as the rank of DP coordinate 0; its
    DP replicas' pieces the same, Megatron's replica id carrying their DP rank last."""
    config.check(layout.parallel)
    made: dict[tuple[int, int], list[Shard]] = {}
    out = []
    for rank in range(layout.size):
        c = layout.coord(rank)
        key = (c.pp, c.tp)
        if key not in made:
            made[key] = rank_shards(config, layout, layout.rank(c.pp, 0, c.tp), dtype)
        out.append([s if c.dp == 0 else replace(s, replica=(*s.replica[:-1], c.dp)) for s in made[key]])
    return out

def table(config: GPTConfig, layout: Layout, dtype: torch.dtype = torch.float32) -> tuple[list[TensorSpec], BoxTable]:
    """The tensors of ``config``'s model and the layout's box table (``BoxTable``: checked)."""
    per_rank = layout_shards(config, layout, dtype)
    specs: dict[str, TensorSpec] = {}
    for row in per_rank:
        for s in row:
            specs.setdefault(s.name, s.spec())
    ordered = sorted(specs.values(), key=lambda s: (s.layer, s.name))
    boxes = {s.name: [[] for _ in range(layout.size)] for s in ordered}
    for rank, row in enumerate(per_rank):
        for s in row:
            boxes[s.name][rank].append(s.box)
    return ordered, BoxTable.build(layout.size, boxes, ordered, name=f"megatron {layout.parallel.short()}")

def tiling_errors(per_rank: list[list[Shard]]) -> list[str]:
    """What keeps the main replicas' boxes from tiling each tensor exactly once: a tensor whose main
    boxes overlap, or leave elements out (by volume and pairwise overlap). Empty: they tile."""
    shape: dict[str, tuple[int, ...]] = {}
    mains: dict[str, list[Box]] = {}
    for row in per_rank:
        for s in row:
            shape.setdefault(s.name, s.shape)
            if s.main:
                mains.setdefault(s.name, []).append(s.box)
    errors = []
    for name, full in shape.items():
        boxes = mains.get(name, [])
        total = sum(_volume(b) for b in boxes)
        if total != _volume(tuple((0, n) for n in full)):
            errors.append(f"{name}: main replicas hold {total} elements of {_volume(tuple((0, n) for n in full))}")
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                if all(max(x[0], y[0]) < min(x[1], y[1]) for x, y in zip(a, b)):
                    errors.append(f"{name}: boxes {list(a)} and {list(b)} overlap")
    return errors

def _volume(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= max(0, hi - lo)
    return n


def facts(config: GPTConfig) -> ModelFacts:
    """What the rest of LiveR knows of the model (``ModelFacts``): its parameters counted on the
    whole model as one process builds it (meta device), its layers, width and sequence; a decoder's
    FLOPs a token of them."""
    whole = Layout(config.num_layers, ParallelConfig(), TrainConfig(global_batch=1, micro_batch=1))
    with rank_model(config, whole, 0) as (model, _):
        params = sum(p.numel() for p in model.parameters())
    return ModelFacts.decoder(params, config.num_layers, config.hidden_size, config.seq_length)
