"""Megatron-Core's distributed optimizer: who holds which elements of the optimizer's state.

Megatron's DDP lays a stage's parameters end to end in one gradient buffer, in buckets; its
distributed optimizer gives data-parallel rank r the r-th equal part of every bucket, so a rank
holds, of each parameter, a flat range of the parameter's local tensor (its fp32 main weight and
its two Adam moments: Megatron's ``fp32_param``, ``exp_avg``, ``exp_avg_sq``), which may be empty,
whole, or cut anywhere. The ranges here are Megatron's own: its DDP builds the buffer (over fake
groups of the layout's sizes, in this process) and its optimizer's range arithmetic
(``DistributedOptimizer._build_model_gbuf_param_range_map``) cuts it for every DP rank. A flat
range is then boxes of the parameter's pieces (``ranges.range_boxes``; a SwiGLU weight's halves
each get their part), in the global coordinates of the Resource View (``view.Shard``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from liver.engine.megatron import cpu
from liver.engine.megatron.config import GPTConfig
from liver.engine.megatron.model import collection, gpt
from liver.engine.megatron.ranges import range_boxes, shifted
from liver.engine.megatron.view import Shard, shards
from liver.resource_view.view import Box, box_numel, intersect, local_shape
from liver.topology.layout import Layout
from liver.world.fake import FakeWorld, fake_pg

KINDS = ("fp32_param", "exp_avg", "exp_avg_sq")
"""The distributed optimizer's state of a parameter, each a flat range of it (Megatron's names)."""


def ddp_config(**extra: Any) -> Any:
    """Megatron's ``DistributedDataParallelConfig`` for its distributed optimizer: gradients reduced
    in fp32 (as its main weights are)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    return DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True, **extra)


def full_collection(tp: Any, pp: Any, dp: Any, solo: Any, embedding: Any = None) -> Any:
    """``model.collection`` with the groups Megatron's DDP and optimizer ask for too: no experts
    (their groups are this rank alone), one optimizer instance over the whole DP group."""
    pgs = collection(tp, pp, dp, solo, embedding)
    pgs.ep = pgs.expt_tp = pgs.expt_dp = pgs.tp_ep = solo
    pgs.mp = tp  # (model parallelism within a stage: TP)
    pgs.tp_ep_pp = None
    pgs.intra_dist_opt = dp
    return pgs


def wrap(model: torch.nn.Module, pgs: Any, **extra: Any) -> Any:
    """``model`` in Megatron's DDP over ``pgs`` (its buffers on the device Megatron asks for)."""
    from megatron.core.distributed import DistributedDataParallel
    return DistributedDataParallel(model.config, ddp_config(**extra), model, pg_collection=pgs)


def dp_ranges(ddp: Any, dp_size: int) -> dict[torch.nn.Parameter, list[tuple[int, int]]]:
    """Of each parameter of ``ddp``, the flat range of its local tensor each of ``dp_size`` DP
    ranks holds (``(0, 0)``: none), by Megatron's own arithmetic over its buffers' buckets."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

    out: dict[torch.nn.Parameter, list[tuple[int, int]]] = {}
    for buffer in [*ddp.buffers, *ddp.expert_parallel_buffers]:
        for p in buffer.param_index_map:
            out[p] = [(0, 0)] * dp_size
        for bucket in buffer.buckets:
            size = bucket.grad_data.numel()
            if size % dp_size:
                raise ValueError(f"megatron: a bucket of {size} elements does not divide over {dp_size} DP ranks")
            part = size // dp_size
            for r in range(dp_size):
                world = Range(bucket.offset + r * part, bucket.offset + min(size, (r + 1) * part))
                got = DistributedOptimizer._build_model_gbuf_param_range_map(buffer.param_index_map, world,
                                                                             bucket.offset)
                for p, ranges in got.items():
                    if ranges["param"].size:
                        out[p][r] = (ranges["param"].start, ranges["param"].end)
    return out


def piece_boxes(piece: Shard, local: tuple[int, ...], start: int, stop: int) -> list[Box]:
    """The boxes (global coordinates) of the flat range ``[start, stop)`` of a parameter's local
    tensor (shape ``local``) that fall in ``piece`` (the whole tensor, or one SwiGLU half: a chunk
    along the first axis, contiguous in the flattened tensor)."""
    n = 1
    for k in local:
        n *= k
    lo, hi = 0, n
    if piece.part is not None:
        axis, i, chunks = piece.part
        if axis != 0:
            raise ValueError(f"megatron: {piece.name!r} is a chunk along axis {axis}; a flat range is cut along 0")
        lo, hi = i * n // chunks, (i + 1) * n // chunks
    a, b = max(start, lo), min(stop, hi)
    if a >= b:
        return []
    shape = local_shape(piece.box)
    origin = tuple(x for x, _ in piece.box)
    return [shifted(box, origin) for box in range_boxes(shape, a - lo, b - lo)]


@dataclass(frozen=True)
class RangeShard:
    """One DP rank's part of one piece's optimizer state (``kind``: ``KINDS``): its boxes;
    ``main``: the part of the main replica (a parameter that TP replicates, a norm's weight, is
    held by every TP rank; Megatron saves TP rank 0's)."""

    name: str
    kind: str
    boxes: tuple[Box, ...]
    main: bool = True


@contextlib.contextmanager
def rank_ddp(config: GPTConfig, layout: Layout, rank: int, device: torch.device | str = "cpu",
             **ddp_fields: Any) -> Iterator[tuple[Any, list[tuple[Shard, Any]], Any]]:
    """Rank ``rank``'s stage of ``config``'s model under ``layout`` in Megatron's DDP for the
    distributed optimizer, over fake groups as that rank (``view.rank_model``'s, with storage on
    ``device``: the buffers are real), its pieces each with its parameter, and its DP group;
    ``ddp_fields``: more fields of Megatron's DDP configuration (``bucket_size``)."""
    cpu.install(device)  # (on a CPU: Megatron's buffers where it asks for CUDA's current device)
    world = FakeWorld.build_fake(0, layout, rank, "gloo", torch.device(device))
    with world.registered_here():
        solo = fake_pg(f"megatron-solo-{rank}", 0, 1)
        pgs = full_collection(world.tp.pg, world.pp.pg, world.dp.pg, solo)
        with torch.device(device):
            model = gpt(config, layout.parallel, list(layout.layers_per_stage), layout.coord(rank).pp, pgs,
                        perform_initialization=False)
        pieces = shards(model, world.dp.pg, config.num_layers)
        by_storage = {p.untyped_storage().data_ptr(): p for p in model.parameters()}
        owned = [(s, by_storage[s.data.untyped_storage().data_ptr()]) for s in pieces]
        yield wrap(model, pgs, **ddp_fields), owned, world.dp.pg  # (DDP moves the parameters into its buffer)


def layout_ranges(config: GPTConfig, layout: Layout, device: torch.device | str = "cpu",
                  **ddp_fields: Any) -> list[list[RangeShard]]:
    """Every rank's optimizer state under ``layout`` with Megatron's distributed optimizer: one DDP
    per (stage, TP rank), cut for each of its DP ranks."""
    config.check(layout.parallel)
    out: list[list[RangeShard]] = [[] for _ in range(layout.size)]
    for stage in range(layout.pp):
        for tp in range(layout.tp):
            with rank_ddp(config, layout, layout.rank(stage, 0, tp), device, **ddp_fields) as (ddp, pieces, _):
                ranges = dp_ranges(ddp, layout.dp)
                for piece, p in pieces:
                    for dp in range(layout.dp):
                        boxes = tuple(piece_boxes(piece, tuple(p.shape), *ranges[p][dp]))
                        if boxes:
                            rank = layout.rank(stage, dp, tp)
                            main = not any(piece.replica[:-1])  # (its DP coordinate: DP rank 0's)
                            out[rank] += [RangeShard(piece.name, kind, boxes, main) for kind in KINDS]
    return out


@dataclass(frozen=True)
class Move:
    """Elements ``box`` (global coordinates) of ``name``'s ``kind`` from old rank ``src`` to new
    rank ``dst``."""

    name: str
    kind: str
    src: int
    dst: int
    box: Box


def plan_ranges(old: list[list[RangeShard]], new: list[list[RangeShard]]) -> list[Move]:
    """What each new rank receives of the distributed optimizer's state, from the old layout's
    main replicas: every box of every new rank cut by the old boxes it meets. ValueError where an
    element of a new rank's boxes is held by no old main replica or by several."""
    held: dict[tuple[str, str], list[tuple[int, Box]]] = {}
    for rank, row in enumerate(old):
        for r in row:
            if r.main:
                held.setdefault((r.name, r.kind), []).extend((rank, b) for b in r.boxes)
    moves: list[Move] = []
    for rank, row in enumerate(new):
        for r in row:
            for d in r.boxes:
                covered = 0
                for src, s in held.get((r.name, r.kind), []):
                    if (i := intersect(s, d)) is not None:
                        covered += box_numel(i)
                        moves.append(Move(r.name, r.kind, src, rank, i))
                if covered != box_numel(d):
                    raise ValueError(f"new rank {rank}'s box {list(d)} of {r.name!r} ({r.kind}): the old main "
                                     f"replicas hold {covered} of its {box_numel(d)} elements; they must tile it once")
    return moves


def tiling_errors(per_rank: list[list[RangeShard]], shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """What keeps the main replicas' boxes from tiling each tensor of ``shapes`` exactly once, per
    kind (by volume, and pairwise overlap); empty: they tile."""
    boxes: dict[tuple[str, str], list[Box]] = {}
    for row in per_rank:
        for r in row:
            if r.main:
                boxes.setdefault((r.name, r.kind), []).extend(r.boxes)
    errors = []
    for name, shape in shapes.items():
        whole = tuple((0, n) for n in shape)
        for kind in KINDS:
            got = boxes.get((name, kind), [])
            if sum(box_numel(b) for b in got) != box_numel(whole):
                errors.append(f"{name} ({kind}): main replicas hold {sum(box_numel(b) for b in got)} elements "
                              f"of {box_numel(whole)}")
            for i, a in enumerate(got):
                for b in got[i + 1:]:
                    if intersect(a, b) is not None:
                        errors.append(f"{name} ({kind}): boxes {list(a)} and {list(b)} overlap")
    return errors
