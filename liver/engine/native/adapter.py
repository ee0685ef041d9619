"""A ``Recipe`` behind the runtime's adapter interface (``EngineAdapter``).

The Resource View of a layout comes from the recipe's own model: built and parallelised on the
meta device as rank 0 of that layout over fake process groups (``liver.world.fake``), in this
process, with no process of the layout needed; its DTensor placements then give every rank's box
(``resource.table``). With pipeline stages, as the first rank of each stage: a tensor lives on
the stage whose model names it. Made once per job and layout. The live switch builds the new
generation's model first (meta, parallelise, storage for this rank's shards only) and lets the executor write
the state straight into that storage.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Mapping

import torch

from liver.engine.interface import EngineAdapter, NotReplayable, state_and_grad_bytes, Prebuilt, TrainingEngine
from liver.engine.native.optim import OptimizerReplay, groups_of, optimizer_over_stand_ins as _optimizer_over_stand_ins
from liver.engine.shard_invariance import invariant
from liver.engine.native.ahead import first_step_ahead, fsdp_initialised, fsdp_unsharded_made
from liver.engine.native.engine import NativeEngine, build_model, fsdp, model_facts, optimizer_state, structure
from liver.engine.native.recipe import Recipe
from liver.engine.native.resource import Placed, table
from liver.engine.native.step import NativeStep
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable
from liver.resource_view.view import box_numel
from liver.topology import JobConfig, Layout, ModelFacts, ParallelConfig
from liver.world.fake import FakeWorld
from liver.world.world import World, forget_meshes

_lock = threading.Lock()  # a metadata build installs its fake World as the default group meanwhile


class NativeAdapter(EngineAdapter):
    """The adapter of one recipe (see the module's docstring)."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.name = recipe.name
        self.model_config = recipe.config
        self._placed: dict[tuple[JobConfig, ParallelConfig], list[Placed]] = {}
        self._tables: dict[tuple[JobConfig, ParallelConfig], BoxTable] = {}
        self._facts: dict[JobConfig, ModelFacts] = {}

    def facts(self, job: JobConfig) -> ModelFacts:
        """The recipe's (``Recipe.facts``), over the parameters and blocks its model has on one
        rank (a meta build, once per job)."""
        if job not in self._facts:
            self._facts[job] = model_facts(self.recipe, job, self.state_specs(job))
        return self._facts[job]

    # ---- metadata ----------------------------------------------------------------------------
    def placed(self, job: JobConfig, layout: Layout) -> list[Placed]:
        """Every logical tensor with its placements under ``layout`` (a meta build, cached)."""
        key = (job, layout.parallel)
        if key not in self._placed:
            stages = [self._meta(job, layout, layout.rank(s, 0, 0)) for s in range(layout.pp)]
            if layout.pp == 1:
                self._placed[key] = stages[0]
            else:
                seen: dict[str, int] = {}
                out = []
                for s, part in enumerate(stages):
                    for p in part:
                        if p.spec.name in seen:
                            raise ValueError(f"parallel={layout.parallel.short()}: tensor {p.spec.name!r} is on "
                                             f"stages {seen[p.spec.name]} and {s} of the recipe {self.name!r}: "
                                             f"allowed each tensor on one stage (tied weights are not moved)")
                        seen[p.spec.name] = s
                        out.append(dataclasses.replace(p, stage=s))
                self._placed[key] = out
        return self._placed[key]

    def _meta(self, job: JobConfig, layout: Layout, rank: int) -> list[Placed]:
        with _lock:
            world = FakeWorld.build_fake(0, layout, rank, "gloo", torch.device("cpu"))
            # (as the default group of this thread only: the training thread, and its checkpoint
            # writes beside a preparation, keep the Active World's)
            with world.registered_here():
                try:
                    return build_model(self.recipe, job, world, torch.device("meta"))[2]
                except ValueError:
                    raise
                except Exception as e:
                    raise ValueError(f"parallel={layout.parallel.short()}: the recipe {self.name!r} cannot "
                                     f"build its model on this layout ({type(e).__name__}: {e})") from None
                finally:
                    forget_meshes()  # nothing cached about the fake mesh outlives it

    def state_specs(self, job: JobConfig) -> list[TensorSpec]:
        # (on one rank every block is the rank's: the layout's layer count plays no part)
        return [p.spec for p in self.placed(job, Layout(1, ParallelConfig(), job.train))]

    def view(self, job: JobConfig, layout: Layout) -> BoxTable:
        key = (job, layout.parallel)
        if key not in self._tables:
            coords = [layout.coord(r)._asdict() for r in range(layout.size)]
            self._tables[key] = table(self.placed(job, layout), coords, f"{self.name} {layout.parallel.short()}")
        return self._tables[key]

    def check(self, job: JobConfig, parallel: ParallelConfig) -> None:
        if parallel.pp > 1 and not self.recipe.pipelines():
            raise ValueError(f"parallel.pp={parallel.pp}: the recipe {self.name!r} defines no stage() (how to cut "
                             f"its model into pipeline stages); allowed pp=1")
        self.recipe.check(job, parallel)

    def layout(self, job: JobConfig, parallel: ParallelConfig) -> Layout:
        """DTensor splits unevenly where it must: the recipe's and the topology's checks, and the
        model's tensors the same as on one rank (``same_tensors``)."""
        self.check(job, parallel)
        lay = Layout(self.facts(job).layers, parallel, job.train)
        if parallel.world_size > 1:
            self.same_tensors(job, lay)
        return lay

    def same_tensors(self, job: JobConfig, layout: Layout) -> None:
        """The model holds the same logical tensors (names, global shapes, dtypes) under ``layout``
        as on one rank; ValueError naming those that differ otherwise (a tie kept on one rank and
        broken by tensor parallelism, say): no switch or checkpoint could carry the state over."""
        one = {s.name: (s.shape, s.dtype) for s in self.state_specs(job)}
        here = {p.spec.name: (p.spec.shape, p.spec.dtype) for p in self.placed(job, layout)}
        only_here, only_one = sorted(set(here) - set(one)), sorted(set(one) - set(here))
        other = sorted(n for n in set(one) & set(here) if one[n] != here[n])
        if only_here or only_one or other:
            parts = ([f"only under it: {', '.join(only_here[:4])}"] if only_here else []) + \
                ([f"only on one rank: {', '.join(only_one[:4])}"] if only_one else []) + \
                ([f"of another shape or dtype: {', '.join(other[:4])}"] if other else [])
            raise ValueError(f"parallel={layout.parallel.short()}: the recipe {self.name!r}'s model holds other "
                             f"tensors under this layout than on one rank ({'; '.join(parts)}); a tie kept in one "
                             f"layout and broken in the other cannot be moved: tie (or untie) them alike in every "
                             f"layout")

    # ---- engines -----------------------------------------------------------------------------
    def build(self, job: JobConfig, world: World, device: torch.device, *, initialise: bool = True,
              state: dict[str, torch.Tensor] | None = None) -> TrainingEngine:
        engine = NativeEngine(self.recipe, job, world, device, initialise=initialise and state is None,
                              specs=self._specs(job, world.layout), boxes=self._boxes(job, world))
        if state is not None:
            with torch.no_grad():
                for name, t in engine.state.items():
                    t.copy_(state[name])
        return engine

    def enter(self, job: JobConfig, world: World, device: torch.device,
              deliver: Callable[[dict[str, torch.Tensor] | None], dict[str, torch.Tensor]],
              into: dict[str, torch.Tensor] | None = None,
              kept: dict[str, torch.Tensor] | None = None,
              prebuilt: Prebuilt | None = None) -> TrainingEngine:
        """The engine Prepare made, if the old shards it adopted are still the old engine's
        storage (``Prebuilt.still_adopts``): this thread's DTensor caches then take the table
        worked out ahead, and the executor writes the rest into its storage. Else the new model
        now: its structure as Prepare made it (else made now), its storage where a shard stays
        the old one's (re-wrapped on the new mesh without a copy), else Prepare's, else new."""
        kept = kept or {}
        if prebuilt is not None and prebuilt.engine is not None:
            if prebuilt.still_adopts(kept):
                forget_meshes(keep=prebuilt.sharding, device=device)
                return self._delivered(prebuilt.engine, deliver)
            prebuilt.engine, prebuilt.stale = None, True
        adopt = {**(prebuilt.storage if prebuilt is not None else {}), **kept}
        engine = NativeEngine(self.recipe, job, world, device, initialise=False, specs=self._specs(job, world.layout),
                              adopt=adopt, model=prebuilt.structure if prebuilt is not None else None,
                              sharding=prebuilt.sharding if prebuilt is not None else None,
                              boxes=self._boxes(job, world))
        return self._delivered(engine, deliver)

    @staticmethod
    def _delivered(engine: NativeEngine, deliver) -> NativeEngine:
        delivered = deliver(engine.state)
        for name, t in delivered.items():
            if t is not engine.state[name]:
                raise RuntimeError(f"the transfer delivered {name!r} outside the engine's storage")
        return engine

    def prebuild(self, job: JobConfig, world: World, device: torch.device, kept: Mapping[str, torch.Tensor],
                 spare_bytes: int) -> Prebuilt:
        """The model's structure on ``world``'s mesh (the recipe's model on the meta device, its
        stage, its ``parallelize``); its first step's DTensor work done ahead on it (``ahead.py``:
        the table this thread filled goes to the switch); then, where the storage it needs beyond
        the ``kept`` shards (which it adopts; FSDP2 makes its parameters' own) fits in
        ``spare_bytes``, the whole engine on it: storage touched, optimizer and its state, LR
        schedule, its pipeline stage's schedule. Else only the structure: the switch builds the
        engine on it."""
        if device.type == "cuda":
            torch.cuda.set_device(device)  # (this thread's: FSDP2 asks for the current device)
        model = structure(self.recipe, job, world)  # (this thread's table of propagations starts here)
        table, ahead = first_step_ahead(self.recipe, job, world, model, optimizer_state(self.recipe, job), device)
        own = {p.spec.name for p in self.placed(job, world.layout) if p.spec.kind in ("param", "buffer")} \
            if fsdp(model) else set()
        wanted = sum(box_numel(b) * s.itemsize for s, b in self._held(job, world)
                     if s.name not in kept or s.name in own)

        def structure_only(model: torch.nn.Module | None = None) -> Prebuilt:
            """The switch builds the engine (on a fresh structure where this one got storage)."""
            return Prebuilt({}, model or structure(self.recipe, job, world), wanted, sharding=table, ahead=ahead)

        if wanted > spare_bytes:
            return structure_only(model)
        try:
            engine = NativeEngine(self.recipe, job, world, device, initialise=False,
                                  specs=self._specs(job, world.layout), adopt=dict(kept), model=model,
                                  boxes=self._boxes(job, world), here=False)
        except torch.OutOfMemoryError:  # (the device's memory, not the budget, is short now)
            return structure_only()
        engine.prepare_pipeline()  # (its stages' schedule: the first step after the switch does not make it)
        try:  # (what FSDP2's first forward would initialise: done here, or left to it)
            if fsdp_initialised(engine.model):
                ahead = {**ahead, "ahead": ahead["ahead"] + " and FSDP2's initialisation"}
                if fsdp_unsharded_made(engine.model):
                    ahead = {**ahead, "ahead": ahead["ahead"] + " and its unsharded parameters"}
        except Exception as e:  # (its state half made: this engine is not used)
            ahead = {**ahead, "ahead_error": f"FSDP2's initialisation: {type(e).__name__}: {e}"[:300]}
            return structure_only()
        adopted = {n: kept[n] for n, t in engine.state.items() if n in kept and kept[n].data_ptr() == t.data_ptr()}
        storage = {n: t for n, t in engine.state.items() if n not in adopted}
        with torch.no_grad():
            for t in storage.values():
                t.zero_()  # (written now: a host's pages are faulted in here, not in the pause)
        return Prebuilt(storage, None, wanted, sharding=table, ahead=ahead, engine=engine, adopted=adopted)

    def replay(self, job: JobConfig, device: torch.device, engine: TrainingEngine | None = None) -> OptimizerReplay:
        """The recipe's optimizer, made again over the shards of the new layout (``OptimizerReplay``),
        where its update gives the same bits on any cut of a tensor on ``device`` in the
        parameters' dtypes (measured here with each of its groups' options: ``shard_invariance.
        invariant``; the groups of ``engine``'s optimizer, else of one over the whole model), and,
        on a running ``engine``, each parameter is in the same group of its optimizer as of the
        whole model's."""
        with torch.device("meta"):
            whole = self.recipe.model(job)
        group = groups_of(lambda m: self.recipe.optimizer(m, job), whole)
        if engine is not None:
            opt, dtypes = engine.optimizer, {p.dtype for _, p in engine._named_params}
            mine = {n: i for i, g in enumerate(opt.param_groups) for n, p in engine._named_params
                    if any(p is q for q in g["params"])}
            moved = [n for n, i in mine.items() if group.get(n) != i]
            if moved:
                raise NotReplayable(f"optimizer {type(opt).__name__}: parameter {moved[0]!r} is in group "
                                    f"{mine[moved[0]]} of this rank's optimizer and in group {group.get(moved[0])} "
                                    f"of the whole model's")
        else:  # (a cold joiner: the recipe's optimizer over the whole model, on stand-ins)
            with torch.device("meta"):
                stand = self.recipe.model(job)
            dtypes = {p.dtype for p in stand.parameters()}
            opt = _optimizer_over_stand_ins(lambda m: self.recipe.optimizer(m, job), stand)
        cls = type(opt)
        for i, g in enumerate(opt.param_groups):
            options = {k: v for k, v in g.items() if k != "params"}
            for dtype in sorted(dtypes, key=str):
                if not invariant(lambda ps: cls([{**options, "params": ps}]), (67, 5), (1, 30, 31), device, dtype):
                    raise NotReplayable(f"optimizer {cls.__name__} (group {i}: foreach={options.get('foreach')}, "
                                        f"fused={options.get('fused')}) gives other bits on a cut of a {dtype} tensor "
                                        f"on {torch.device(device).type}")
        return OptimizerReplay(cls, group, optimizer_state(self.recipe, job), frozenset(group))

    def make_step(self, engine: TrainingEngine) -> NativeStep:
        return NativeStep(engine)

    def drive(self, steps) -> None:
        self.recipe.loop(steps)

    def _held(self, job: JobConfig, world: World) -> list[tuple[TensorSpec, tuple]]:
        """Each tensor rank ``world.rank`` holds, with its box."""
        t = self.view(job, world.layout)
        return [(s, b) for s in self._specs(job, world.layout) if (b := t.box(s, world.rank)) is not None]

    def _boxes(self, job: JobConfig, world: World) -> dict:
        """Rank ``world.rank``'s box of each tensor it holds, from the layout's view."""
        return {s.name: b for s, b in self._held(job, world)}

    def _specs(self, job: JobConfig, layout: Layout) -> list[TensorSpec]:
        return [p.spec for p in self.placed(job, layout)]

    def joiner_storage(self, engine: TrainingEngine) -> dict[str, torch.Tensor] | None:
        return None  # a warm-up engine lives on a fake mesh: the switch builds on the real one

    def mock_world(self, generation: int, layout: Layout, rank: int, backend: str, device: torch.device) -> World:
        return FakeWorld.build_fake(generation, layout, rank, backend, device)

    def rehearsal_job(self) -> JobConfig:
        return self.recipe.rehearsal_job()

    def rank_bytes(self, job: JobConfig, layout: Layout, rank: int) -> int:
        """The shards of the state, plus a gradient for each parameter's shard."""
        return state_and_grad_bytes(self, job, layout, rank)
