"""The Megatron-Core engine behind the runtime's adapter interface (``ADAPTER``; a job file selects
it with ``engine = "liver.engine.megatron:ADAPTER"`` and sets its model in ``[job.model]`` with
``GPTConfig``'s fields).

Its logical tensors are the pieces of Megatron's ``sharded_state_dict`` as one rank holds them all
(``view.Shard``), each followed by its two AdamW moments; who holds what under a layout is
Megatron's own metadata of every rank (``view.table``), read over fake groups on the meta device,
once per layout.
"""

from __future__ import annotations

import threading

import torch

from liver.engine.interface import EngineAdapter, state_and_grad_bytes, TrainingEngine
from liver.engine.megatron.config import GPTConfig, stages
from liver.engine.reference.optim import with_adam_state
from liver.resource_view.spec import TensorSpec
from liver.resource_view.table import BoxTable
from liver.topology import JobConfig, Layout, ModelFacts, ParallelConfig
from liver.world.world import World

_lock = threading.Lock()  # (a fake world is torch's default group while a meta model is built)


class MegatronAdapter(EngineAdapter):
    name = "megatron"
    model_config = GPTConfig
    restart_format = "megatron-dist-checkpointing"

    def __init__(self) -> None:
        self._specs: dict[JobConfig, list[TensorSpec]] = {}
        self._tables: dict[tuple[JobConfig, ParallelConfig], BoxTable] = {}
        self._facts: dict[GPTConfig, ModelFacts] = {}

    def facts(self, job: JobConfig) -> ModelFacts:
        from liver.engine.megatron.view import facts
        if job.model not in self._facts:
            with _lock:
                self._facts[job.model] = facts(job.model)
        return self._facts[job.model]

    def state_specs(self, job: JobConfig) -> list[TensorSpec]:
        """Every piece of the model on one rank, by layer, with the dimension TP splits it along
        (read from the smallest TP degree the model allows), each followed by its moments."""
        if job not in self._specs:
            from liver.engine.megatron.view import rank_shards
            cfg = job.model
            with _lock:
                whole = rank_shards(cfg, Layout(cfg.num_layers, ParallelConfig(), job.train), 0)
                split = _smallest_tp(cfg)
                cut = {} if split is None else {
                    s.name: next((d for d, ((lo, hi), n) in enumerate(zip(s.box, s.shape)) if hi - lo < n), None)
                    for s in rank_shards(cfg, Layout(cfg.num_layers, ParallelConfig(tp=split), job.train), 0)}
            params = sorted((TensorSpec(s.name, s.shape, s.dtype, s.layer, cut.get(s.name)) for s in whole),
                            key=lambda s: (s.layer, s.name))
            self._specs[job] = with_adam_state(params)
        return list(self._specs[job])

    def check(self, job: JobConfig, parallel: ParallelConfig) -> None:
        if not isinstance(job.model, GPTConfig):
            raise ValueError(f"engine megatron: job.model is a {type(job.model).__name__}; allowed GPTConfig")
        job.model.check(parallel)
        stages(parallel, list(Layout(job.model.num_layers, parallel, job.train).layers_per_stage))

    def view(self, job: JobConfig, layout: Layout) -> BoxTable:
        """Megatron's own metadata of every rank (``view.table``), its moments boxed as their pieces."""
        key = (job, layout.parallel)
        if key not in self._tables:
            from liver.engine.megatron.view import layout_shards
            with _lock:
                per_rank = layout_shards(job.model, layout)
            specs = self.state_specs(job)
            boxes: dict[str, list[list]] = {s.name: [[] for _ in range(layout.size)] for s in specs}
            for rank, row in enumerate(per_rank):
                for piece in row:
                    for name in (piece.name, *(f"{piece.name}.{k}" for k in ("exp_avg", "exp_avg_sq"))):
                        boxes[name][rank].append(piece.box)
            self._tables[key] = BoxTable.build(layout.size, boxes, specs, name=f"megatron {layout.parallel.short()}")
        return self._tables[key]

    def build(self, job: JobConfig, world: World, device: torch.device, *, initialise: bool = True,
              state: dict[str, torch.Tensor] | None = None) -> TrainingEngine:
        from liver.engine.megatron.engine import MegatronEngine
        return MegatronEngine(job, world, device, self.state_specs(job), self.facts(job).flops_per_token,
                              initialise=initialise, state=state)

    def rehearsal_job(self) -> JobConfig:
        from liver.topology.presets import preset
        return JobConfig(model=GPTConfig(), train=preset("tiny").train)

    def rank_bytes(self, job: JobConfig, layout: Layout, rank: int) -> int:
        """Its pieces and moments (fp32), and a gradient for each parameter's piece."""
        return state_and_grad_bytes(self, job, layout, rank)

    def save_for_restart(self, engine: TrainingEngine, path: str) -> float:
        """Megatron's own checkpoint (``dist_checkpointing``): the baseline as its users restart."""
        from liver.engine.megatron import checkpoint
        return checkpoint.save(engine, path)

    def load_checkpoint(self, engine: TrainingEngine, path: str) -> float:
        """Megatron's checkpoint where ``path`` is one (a restart's), else DCP's (a periodic one)."""
        from liver.engine.megatron import checkpoint
        return checkpoint.load(engine, path) if checkpoint.is_megatron(path) else super().load_checkpoint(engine, path)

    def joiner_storage(self, engine: TrainingEngine) -> dict[str, torch.Tensor] | None:
        return None  # (a warm-up engine's pieces are views of its model: the switch builds its own)

    def mock_world(self, generation: int, layout: Layout, rank: int, backend: str, device: torch.device) -> World:
        from liver.world.fake import FakeWorld
        return FakeWorld.build_fake(generation, layout, rank, backend, device)


class MegatronGpuAdapter(MegatronAdapter):
    """The Megatron-Core engine trained as Megatron trains on a GPU: its DDP, its distributed
    optimizer and its own pipeline schedule (``gpu_engine``); a job file selects it with
    ``engine = "liver.engine.megatron:GPU_ADAPTER"``. The same tensors and views as ``ADAPTER``'s,
    at one DP rank (the optimizer's shards are then whole parameters)."""

    name = "megatron-distributed-optimizer"

    def check(self, job: JobConfig, parallel: ParallelConfig) -> None:
        super().check(job, parallel)
        if parallel.dp != 1:
            raise ValueError(f"engine megatron-distributed-optimizer: parallel.dp={parallel.dp}: allowed 1 (over "
                             f"several DP ranks its optimizer's shards are flat ranges, which LiveR does not move "
                             f"yet); engine = 'liver.engine.megatron:ADAPTER' takes any DP degree")

    def build(self, job: JobConfig, world: World, device: torch.device, *, initialise: bool = True,
              state: dict[str, torch.Tensor] | None = None) -> TrainingEngine:
        from liver.engine.megatron.gpu_engine import MegatronGpuEngine
        return MegatronGpuEngine(job, world, device, self.state_specs(job), self.facts(job).flops_per_token,
                                 initialise=initialise, state=state)


def _smallest_tp(cfg: GPTConfig) -> int | None:
    """The smallest TP degree above one that ``cfg`` allows (None: none up to its heads)."""
    for tp in range(2, cfg.num_attention_heads + 1):
        try:
            cfg.check(ParallelConfig(tp=tp))
        except ValueError:
            continue
        return tp
    return None


ADAPTER = MegatronAdapter()
GPU_ADAPTER = MegatronGpuAdapter()
