"""What the runtime needs of a training engine, and nothing more.

The runtime (worker, companion, switch, mock world), the controller, the checkpoint and the
transfer know an engine only through this module. An engine comes in two parts:

- an ``EngineAdapter``, one per kind of engine and stateless: the model's configuration (the
  dataclass a job's ``[job.model]`` table fills: ``model_config``) and what the rest of LiveR knows
  of the model (``facts``: parameters, layers, width, tokens a sample, FLOPs a token), the logical
  state of a job as tensor specs, the layouts the engine accepts, how to build one rank's engine on a World, the memory a
  rank needs, a small job for rehearsals. The job config names it by import path
  (``engine = "liver.engine.reference:ADAPTER"``).
- a ``TrainingEngine``, one rank's running engine: its shards of every logical tensor (``state``,
  keyed by spec name, each of the shape of its box), the scalars that complete the state (step,
  data position, RNG, schedule), one training step, and the release of its compute copies before
  the state is streamed away.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import torch

from liver.engine.loop import Step
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import RankView, box_of
from liver.resource_view.view import Box, box_numel, local_shape
from liver.topology import JobConfig, Layout, ModelConfig, ModelFacts, ParallelConfig
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


@dataclass(frozen=True, slots=True)
class Update:
    """What one step's optimizer update needs besides the state and the gradients: an engine hands
    it, with its reduced gradients, to a pre-copy's mirror (liver/runtime/mirror.py), which replays
    the update on its copy (``EngineAdapter.replay``)."""

    step: int          # the engine's step before the update (0 for the first)
    lr: float
    grad_scale: float = 1.0  # a clip coefficient the update applies (1.0: none, or clipped in place before)
    groups: tuple = ()       # the optimizer's parameter groups' options now (lr among them), in order
    counters: tuple = ()     # (key, value) of the optimizer's 0-dim state before the update (``step``, ...)


class NotReplayable(Exception):
    """``EngineAdapter.replay``'s answer where the engine cannot replay its update on another cut of
    its state bit for bit: the reason, for the event's record."""


class Replay(Protocol):
    def replayable(self, name: str) -> bool:
        """Whether the state tensor ``name`` changes only through the update (a buffer that the
        forward pass writes does not: it streams at the switch)."""
        ...

    def __call__(self, shards: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], update: Update) -> None:
        """The update on ``shards`` (by state name, any layout's boxes) from the reduced gradients
        ``grads`` of their parameters (by parameter name, the same boxes)."""
        ...


class TrainingEngine(Protocol):
    world: World
    layout: Layout
    step: int
    specs: list[TensorSpec]
    boxes: dict[str, Box]              # spec name -> this rank's box (tensors it holds)
    state: dict[str, torch.Tensor]     # spec name -> this rank's shard
    # an engine whose adapter replays its update (``EngineAdapter.replay``) also has ``mirror``
    # (None, or a pre-copy's mirror that the runtime sets): it calls ``mirror.before_update()``
    # right before its optimizer update and ``mirror.after_update(grads, Update(...))`` right after

    def train_step(self) -> StepStats: ...

    def scalars(self) -> dict[str, Any]:
        """Plain data that, with the shards, is the whole training state."""
        ...

    def load_scalars(self, scalars: dict[str, Any]) -> None: ...

    def refresh(self) -> None:
        """The state was overwritten (a load, a transfer): re-derive what is computed from it."""
        ...

    def checkpoint_tensors(self, tensors: dict[str, torch.Tensor] | None = None,
                           cpu: bool = False) -> dict[str, torch.Tensor]:
        """DCP's view of the shards (``tensors``, else ``state``): sharded ones as DTensors, so
        that DCP records their global offsets; ``cpu``: over the World's CPU groups."""
        ...

    def align_replicas(self) -> None:
        """At a boundary, before the state leaves (collective over the World's groups): where the
        framework lets ranks' copies of one box drift apart, make each the copy its checkpoint
        saves, so that a live handoff carries what a restart would load; nothing where the
        framework keeps its copies equal."""
        ...

    def release_compute(self) -> None:
        """Before the state streams away: let go of every copy that is not state (compute-dtype
        weights, caches), so that a handoff needs no memory beyond its staging budget."""
        ...

    def drop_grads(self) -> None:
        """Let go of every gradient (set to None): an iteration starts from none, whatever an
        aborted attempt before it (a peer lost mid-step, then healed) left behind."""
        ...

    def held_grads(self) -> list[str]:
        """The parameters that hold a gradient now (none may be held across a boundary)."""
        ...

    def unaccounted(self) -> list[str]:
        """Tensors that influence the next step but are not part of ``state`` (so neither moved
        nor digested): optimizer state of a kind the engine does not know, persistent buffers."""
        ...


@dataclass
class Prebuilt:
    """What Prepare made of the new generation's engine before the pause (``EngineAdapter.prebuild``):
    ``storage``, this rank's new-layout shards (by state name) that the transfer writes into, made
    and touched beside training within the spare of the staging budget; ``structure``, the
    engine's own (a user's model, laid out on the new World's mesh, without storage); or
    ``engine``, the whole engine, its storage ``storage`` and the old shards it ``adopted`` (by
    state name: the live tensors of this process's old engine that stay in the same box)."""

    storage: dict[str, torch.Tensor]
    structure: Any = None
    wanted_bytes: int = 0  # the storage the switch would make (all of it in ``storage``, or none)
    sharding: dict | None = None  # DTensor's propagation on the new mesh, worked out ahead (world/sharding.py)
    ahead: dict[str, Any] = field(default_factory=dict)  # what was worked out ahead, for the record
    engine: Any = None
    adopted: dict[str, torch.Tensor] = field(default_factory=dict)
    stale: bool = False  # the engine was made, but its adopted shards changed after: not used (``still_adopts``)

    def still_adopts(self, kept: dict[str, torch.Tensor]) -> bool:
        """Every old shard the engine adopted is still the storage of the old engine's tensor
        (``kept``, at the switch): else the engine holds stale memory and is not used."""
        return all((k := kept.get(n)) is not None and k.data_ptr() == t.data_ptr() and k.shape == t.shape
                   for n, t in self.adopted.items())

    @property
    def storage_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage.values())

    @property
    def path(self) -> str:
        """Which build the switch runs, for its record."""
        if self.stale:
            return "built at the switch (the old shards adopted before the pause had changed)"
        if self.engine is not None:
            return "engine made before the pause"
        made = [w for w, done in (("structure", self.structure is not None),
                                  ("storage", bool(self.storage) or not self.wanted_bytes)) if done]
        return " and ".join(made) + " made before the pause" if made else "built at the switch"


def new_storage(specs: list[TensorSpec], view, rank: int, device: torch.device, skip,
                spare_bytes: int) -> tuple[dict[str, torch.Tensor], int]:
    """Rank ``rank``'s shards under ``view`` of the specs not in ``skip``, as zeroed local tensors
    (written now: a host's pages are faulted in here, not in the pause), if they fit in
    ``spare_bytes`` all together and the device has them; else none. Returns them and the bytes
    they need."""
    boxes = {s: b for s in specs if s.name not in skip and (b := box_of(view, s, rank)) is not None}
    wanted = sum(box_numel(b) * s.itemsize for s, b in boxes.items())
    if wanted > spare_bytes:
        return {}, wanted
    try:
        return {s.name: torch.zeros(local_shape(b), dtype=getattr(torch, s.dtype), device=device)
                for s, b in boxes.items()}, wanted
    except torch.OutOfMemoryError:  # (the device's memory, not the budget, is short now: made at the switch)
        return {}, wanted


class EngineAdapter(ABC):
    """One kind of engine, as the runtime sees it (see the module's docstring)."""

    name: str = "engine"
    #: what stop-and-restart writes (``save_for_restart``), for its event's record
    restart_format: str = "torch-dcp"
    #: the model's configuration: the frozen dataclass a job's model table fills (``job.model``)
    model_config: type = ModelConfig

    @abstractmethod
    def facts(self, job: JobConfig) -> ModelFacts:
        """What the layout checks, the target choice, the cost model and the simulator know of
        the job's model (they never read its configuration's fields)."""

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
        lay = Layout(self.facts(job).layers, parallel, job.train)
        for s in self.state_specs(job):
            if s.shard_dim is not None and s.shape[s.shard_dim] % parallel.tp:
                raise ValueError(f"parallel.tp={parallel.tp} does not divide dimension {s.shard_dim} of {s.name} "
                                 f"({s.shape[s.shard_dim]})")
        return lay

    def view(self, job: JobConfig, layout: Layout) -> Layout | RankView:
        """Who holds what under ``layout``, for the planner: the Layout itself (its analytic view),
        or a box table."""
        return layout

    def enter(self, job: JobConfig, world: World, device: torch.device,
              deliver: Callable[[dict[str, torch.Tensor] | None], dict[str, torch.Tensor]],
              into: dict[str, torch.Tensor] | None = None,
              kept: dict[str, torch.Tensor] | None = None,
              prebuilt: Prebuilt | None = None) -> TrainingEngine:
        """The new generation's engine, its state delivered by the transfer: ``deliver(storage)``
        runs it, writing into ``storage`` where given (else into fresh tensors), and returns the
        shards. ``kept``: this process's old shards that stay in the same box (the engine may
        adopt their storage; ``storage`` then holds them). ``prebuilt``: what Prepare made
        (``prebuild``). Here: into ``into`` (a joiner's warm-up state), the prebuilt storage or
        fresh, then adopted; a kept shard is the old tensor itself."""
        if into is None and prebuilt is not None and prebuilt.storage:
            into = prebuilt.storage
        return self.build(job, world, device, state=deliver(into))

    def prebuild(self, job: JobConfig, world: World, device: torch.device, kept: Mapping[str, torch.Tensor],
                 spare_bytes: int) -> Prebuilt:
        """Beside training, in the companion (``world`` registered in its thread only): what of
        rank ``world.rank``'s engine can be made before the pause. ``kept``: this process's old
        shards that stay in the same box, by state name (the old engine's live tensors: it trains
        on them until the switch). Here: the storage of the shards not ``kept``, where it fits in
        ``spare_bytes``; the engine itself is built on the delivered shards at the switch."""
        storage, wanted = new_storage(self.state_specs(job), self.view(job, world.layout), world.rank, device, kept,
                                      spare_bytes)
        return Prebuilt(storage, wanted_bytes=wanted)

    def joiner_storage(self, engine: TrainingEngine) -> dict[str, torch.Tensor] | None:
        """What of a cold joiner's warm-up engine the switch may write the state into."""
        return engine.state

    def mock_world(self, generation: int, layout: Layout, rank: int, backend: str, device: torch.device) -> World:
        """The world a cold joiner warms up on: every collective answered locally."""
        from liver.world.mock import MockWorld
        return MockWorld.build_mock(generation, layout, rank, backend, device)

    def make_step(self, engine: TrainingEngine):
        """One iteration of the loop on ``engine`` (``liver.engine.loop.Step``)."""
        return Step(engine)

    def drive(self, steps) -> None:
        """The training loop over LiveR's iterations (``liver.engine.loop.Steps``): here the
        engine's own step, once an iteration."""
        steps.run_all()

    def replay(self, job: JobConfig, device: torch.device, engine: TrainingEngine | None = None) -> Replay:
        """Pre-copy (liver/runtime/mirror.py), asked on every process of a handoff: on an old rank
        with its running ``engine``, on a cold joiner with none. The engine's optimizer update as a
        ``Replay`` on ``device``, the same bits as the engine's own on any cut of the state; the
        engine then calls its ``mirror``'s ``before_update`` and ``after_update`` around each
        update. ``NotReplayable`` with the reason where it cannot (here: the engine does not say
        how), and its state streams at the switch."""
        raise NotReplayable(f"engine {self.name} does not replay its optimizer's update")

    def max_rank_bytes(self, job: JobConfig, layout: Layout) -> int:
        return max(self.rank_bytes(job, layout, r) for r in range(layout.size))

    def save_for_restart(self, engine: TrainingEngine, path: str) -> float:
        """Stop-and-restart's save, collective (the baseline a live switch is compared with):
        torch's DCP here (``liver.checkpoint.dcp``). Seconds taken."""
        from liver.checkpoint import dcp
        return dcp.save(engine, path)

    def load_checkpoint(self, engine: TrainingEngine, path: str) -> float:
        """Collective: ``engine``'s state from ``path`` (a restart's save, or a periodic DCP
        checkpoint for a recovery), whatever layout wrote it. Seconds taken."""
        from liver.checkpoint import dcp
        return dcp.load(engine, path)


def state_and_grad_bytes(adapter: EngineAdapter, job: JobConfig, layout: Layout, rank: int) -> int:
    """Rank ``rank``'s shards of the state under ``adapter``'s view of ``layout``, plus a gradient
    of each parameter's shard (an engine whose parameters are its state: no other copy)."""
    t = adapter.view(job, layout)
    n = 0
    for s in adapter.state_specs(job):
        b = box_of(t, s, rank)
        if b is not None:
            n += box_numel(b) * s.itemsize * (2 if s.kind == "param" else 1)
    return n


def absolute_engine_path(path: str) -> str:
    """``file.py:ATTR`` with the file made absolute (a worker's directory may differ); a module
    path unchanged."""
    module, sep, attr = path.partition(":")
    if sep and module.endswith(".py"):
        return f"{os.path.abspath(module)}:{attr}"
    return path


@functools.lru_cache(maxsize=16)
def load_adapter(path: str) -> EngineAdapter:
    """The adapter named ``module:attribute`` (or ``path/to/file.py:attribute``): an
    EngineAdapter, or a ``Recipe`` (liver.engine.native) behind its adapter; one per path and
    process. ValueError naming ``engine`` otherwise."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"engine={path!r}: expected an import path 'module:attribute' or 'file.py:attribute'")
    try:
        if module.endswith(".py"):
            if not os.path.isfile(module):
                raise ImportError(f"no file {module}")
            name = "liver_user_" + os.path.splitext(os.path.basename(module))[0]
            here = os.path.dirname(os.path.abspath(module))
            if here not in sys.path:  # its own modules beside it import, as for a script Python runs
                sys.path.insert(0, here)
            spec = importlib.util.spec_from_file_location(name, module)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # (pickling and dataclasses look the module up)
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(module)
        obj = getattr(mod, attr)
    except (ImportError, AttributeError, SyntaxError) as e:
        raise ValueError(f"engine={path!r}: cannot import it ({type(e).__name__}: {e})") from None
    from liver.engine.native.recipe import Recipe
    if isinstance(obj, type) and issubclass(obj, (EngineAdapter, Recipe)):
        obj = obj()
    if isinstance(obj, Recipe):
        from liver.engine.native.adapter import NativeAdapter
        obj = NativeAdapter(obj)
    if not isinstance(obj, EngineAdapter):
        raise ValueError(f"engine={path!r}: is a {type(obj).__name__}, not an EngineAdapter or a Recipe")
    return obj


DEFAULT_ENGINE = "liver.engine.reference:ADAPTER"
