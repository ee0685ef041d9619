"""What the runtime needs of a training engine, and nothing more.

The runtime (worker, companion, switch, mock world), the controller, the checkpoint and the
transfer know an engine only through this module. An engine comes in two parts:

- an ``EngineAdapter``, one per kind of engine and stateless: the logical state of a job as tensor
  specs, the layouts the engine accepts, how to build one rank's engine on a World, the memory a
  rank needs, a small job for rehearsals. The job config names it by import path
  (``engine = "liver.engine.reference:ADAPTER"``).
- a ``TrainingEngine``, one rank's running engine: its shards of every logical tensor (``state``,
  keyed by spec name, each of the shape of its box), the scalars that complete the state (step,
  data position, RNG, schedule), one training step, and the release of its compute copies before
  the state is streamed away.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box
from liver.topology import JobConfig, Layout, ParallelConfig
from liver.world.world import World


@dataclass(frozen=True, slots=True)
class StepStats:
    step: int
    loss: float
    grad_norm: float
    lr: float
    step_s: float
    tokens_per_s: float
    mfu: float | None = None


class TrainingEngine(Protocol):
    world: World
    layout: Layout
    step: int
    specs: list[TensorSpec]
    boxes: dict[str, Box]              # spec name -> this rank's box (tensors it holds)
    state: dict[str, torch.Tensor]     # spec name -> this rank's shard

    def train_step(self) -> StepStats: ...

    def scalars(self) -> dict[str, Any]:
        """Plain data that, with the shards, is the whole training state."""
        ...

    def load_scalars(self, scalars: dict[str, Any]) -> None: ...

    def refresh(self) -> None:
        """The state was overwritten (a load, a transfer): re-derive what is computed from it."""
        ...

    def release_compute(self) -> None:
        """Before the state streams away: let go of every copy that is not state (compute-dtype
        weights, caches), so that a handoff needs no memory beyond its staging budget."""
        ...


class EngineAdapter(ABC):
    """One kind of engine, as the runtime sees it (see the module's docstring)."""

    name: str = "engine"

    @abstractmethod
    def state_specs(self, job: JobConfig) -> list[TensorSpec]:
        """Every logical tensor of the job's training state, in streaming order."""

    @abstractmethod
    def check(self, job: JobConfig, parallel: ParallelConfig) -> None:
        """The engine's own constraints on a layout (ValueError naming the field)."""

    @abstractmethod
    def build(self, job: JobConfig, world: World, device: torch.device, *, initialise: bool = True,
              state: dict[str, torch.Tensor] | None = None) -> TrainingEngine:
        """Rank ``world.rank``'s engine: shards from the seed (``initialise``), uninitialised (to be
        loaded), or ``state`` (shards delivered in this layout, adopted without a copy)."""

    @abstractmethod
    def rehearsal_job(self) -> JobConfig:
        """A small job of this engine: rehearsals pay the code paths' first-use costs with it."""

    @abstractmethod
    def rank_bytes(self, job: JobConfig, layout: Layout, rank: int) -> int:
        """Device memory that rank ``rank`` of ``layout`` needs for its state and compute copies."""

    def layout(self, job: JobConfig, parallel: ParallelConfig) -> Layout:
        """The validated layout: the topology's checks, the engine's, and every sharded dimension
        of the state divisible by the TP degree (the analytic view splits evenly)."""
        self.check(job, parallel)
        lay = Layout(job.model, parallel, job.train)
        for s in self.state_specs(job):
            if s.shard_dim is not None and s.shape[s.shard_dim] % parallel.tp:
                raise ValueError(f"parallel.tp={parallel.tp} does not divide dimension {s.shard_dim} of {s.name} "
                                 f"({s.shape[s.shard_dim]})")
        return lay

    def max_rank_bytes(self, job: JobConfig, layout: Layout) -> int:
        return max(self.rank_bytes(job, layout, r) for r in range(layout.size))


def load_adapter(path: str) -> EngineAdapter:
    """The adapter named ``module:attribute``; ValueError naming ``engine`` otherwise."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"engine={path!r}: expected an import path 'module:attribute'")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"engine={path!r}: cannot import it ({type(e).__name__}: {e})") from None
    if isinstance(obj, type) and issubclass(obj, EngineAdapter):
        obj = obj()
    if not isinstance(obj, EngineAdapter):
        raise ValueError(f"engine={path!r}: is a {type(obj).__name__}, not an EngineAdapter")
    return obj


DEFAULT_ENGINE = "liver.engine.reference:ADAPTER"
