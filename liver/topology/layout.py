"""Layout: a ParallelConfig validated against a model and a batch, with the rank <-> (pp, dp, tp)
coordinate map and the assignment of layers to pipeline stages.

Rank order is tp fastest, then dp, then pp (Megatron's default), so a TP group is a run of
consecutive ranks and a pipeline stage is a contiguous block of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from liver.topology.config import ParallelConfig, TrainConfig


class Coord(NamedTuple):
    pp: int
    dp: int
    tp: int


def default_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Even split; the remainder goes to the first stages (the last one carries the output head)."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if s < extra else 0) for s in range(pp))


@dataclass(frozen=True)
class Layout:
    """A validated parallel layout of one model of ``layers`` blocks (its engine's count:
    ``ModelFacts.layers``). Construction raises ValueError on any mismatch of the degrees with the
    layers and the batch; what an engine adds (the TP degree against its shapes) its adapter checks
    (``EngineAdapter.layout``)."""

    layers: int
    parallel: ParallelConfig
    train: TrainConfig
    world_size: int | None = None

    def __post_init__(self) -> None:
        n, p, t = self.layers, self.parallel, self.train
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:  # (a caller's mistake, not a user's)
            raise TypeError(f"Layout.layers={n!r}: the model's layer count (ModelFacts.layers) is required")
        if self.world_size is not None and p.world_size != self.world_size:
            raise ValueError(f"parallel: tp*pp*dp={p.tp}*{p.pp}*{p.dp}={p.world_size} must equal "
                             f"world_size={self.world_size}")
        if p.pp > n:
            raise ValueError(f"parallel.pp={p.pp} exceeds the model's {n} layers: "
                             "every stage needs at least one layer")
        if p.layers_per_stage is not None and sum(p.layers_per_stage) != n:
            raise ValueError(f"parallel.layers_per_stage={list(p.layers_per_stage)} sums to "
                             f"{sum(p.layers_per_stage)}; the model's {n} layers required")
        if t.global_batch % (p.dp * t.micro_batch):
            raise ValueError(f"train.global_batch={t.global_batch} is not divisible by "
                             f"dp*micro_batch={p.dp}*{t.micro_batch}={p.dp * t.micro_batch}")

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.parallel.tp

    @property
    def pp(self) -> int:
        return self.parallel.pp

    @property
    def dp(self) -> int:
        return self.parallel.dp

    @property
    def size(self) -> int:
        return self.parallel.world_size

    @property
    def local_batch(self) -> int:
        return self.train.global_batch // self.dp

    @property
    def num_micro_batches(self) -> int:
        return self.local_batch // self.train.micro_batch

    # ---- stages ------------------------------------------------------------------------------
    @cached_property
    def layers_per_stage(self) -> tuple[int, ...]:
        return self.parallel.layers_per_stage or default_split(self.layers, self.pp)

    @cached_property
    def stage_bounds(self) -> tuple[tuple[int, int], ...]:
        """[first, last) transformer-layer index of each stage."""
        out, lo = [], 0
        for n in self.layers_per_stage:
            out.append((lo, lo + n))
            lo += n
        return tuple(out)

    def stage_of_layer(self, layer: int) -> int:
        """Stage owning a layer; -1 is the embedding (stage 0), num_layers the head (last stage)."""
        if layer < 0:
            return 0
        if layer >= self.layers:
            return self.pp - 1
        for s, (lo, hi) in enumerate(self.stage_bounds):
            if lo <= layer < hi:
                return s
        raise AssertionError(layer)

    # ---- ranks -------------------------------------------------------------------------------
    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank={rank} outside [0, {self.size})")
        tp = rank % self.tp
        dp = (rank // self.tp) % self.dp
        pp = rank // (self.tp * self.dp)
        return Coord(pp, dp, tp)

    def rank(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def tp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.pp, c.dp, t) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.pp, d, c.tp) for d in range(self.dp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(s, c.dp, c.tp) for s in range(self.pp)]

    def all_groups(self, axis: str) -> list[list[int]]:
        """Every group along an axis ('tp', 'dp' or 'pp'), in a fixed order."""
        fn = {"tp": self.tp_group, "dp": self.dp_group, "pp": self.pp_group}[axis]
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.size):
            seen.setdefault(tuple(fn(r)), None)
        return [list(g) for g in seen]

    def describe(self) -> str:
        return f"{self.parallel.short()} ({self.size} ranks, stages {list(self.layers_per_stage)})"
