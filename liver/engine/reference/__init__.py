"""The reference engine: a Llama-style decoder (RMSNorm, RoPE, SwiGLU) with Megatron-style tensor
parallelism, a 1F1B pipeline and AdamW over fp32 master shards (``trainer.Engine``), behind the
runtime's adapter interface (``ADAPTER``)."""

from __future__ import annotations

import functools

import torch

from liver.engine.interface import EngineAdapter, TrainingEngine
from liver.topology import JobConfig, Layout, ModelFacts, ParallelConfig
from liver.world.world import World

_COMPUTE_BYTES = {"float32": 4, "bfloat16": 2}


@functools.lru_cache(maxsize=8)
def _specs(job: JobConfig):
    """The job's logical tensors, made once per job (callers only read them)."""
    from liver.engine.reference.trainer import state_specs
    return tuple(state_specs(job))


class ReferenceAdapter(EngineAdapter):
    name = "reference"

    def facts(self, job: JobConfig) -> ModelFacts:
        return job.model.facts()

    def state_specs(self, job: JobConfig):
        return list(_specs(job))

    def check(self, job: JobConfig, parallel: ParallelConfig) -> None:
        m = job.model
        for field, value in (("num_heads", m.num_heads), ("hidden_size", m.hidden_size),
                             ("ffn_size", m.ffn_size), ("padded_vocab_size", m.padded_vocab_size)):
            if value % parallel.tp:
                raise ValueError(f"parallel.tp={parallel.tp} does not divide model.{field}={value}")

    def build(self, job: JobConfig, world: World, device: torch.device, *, initialise: bool = True,
              state: dict[str, torch.Tensor] | None = None) -> TrainingEngine:
        from liver.engine.reference.trainer import Engine
        return Engine(job, world, device, initialise=initialise, state=state)

    def replay(self, job: JobConfig, device: torch.device, engine: TrainingEngine | None = None):
        """The engine's own AdamW (foreach, element-wise: the same bits on any cut of a tensor),
        on the shards given; every tensor of its state changes only through it."""
        from liver.engine.reference.optim import AdamWReplay
        return AdamWReplay({s.name: s for s in _specs(job)}, job.train)

    def rehearsal_job(self) -> JobConfig:
        from liver.topology.presets import preset
        return preset("tiny")

    def rank_bytes(self, job: JobConfig, layout: Layout, rank: int) -> int:
        """fp32 master and moments, plus each parameter's compute copy and its fp32 gradient."""
        from liver.resource_view.view import box_numel, view
        compute = _COMPUTE_BYTES[job.compute_dtype]
        n = 0
        for s in self.state_specs(job):
            b = view(s, layout, rank)
            if b is not None:
                n += box_numel(b) * (4 + (compute + 4 if s.kind == "param" else 0))
        return n

    def max_rank_bytes(self, job: JobConfig, layout: Layout) -> int:
        """The largest of ``rank_bytes`` over the ranks, a stage at a time: every rank of a stage
        holds an even TP slice of its tensors (``view``), whatever its TP and DP coordinates."""
        compute = _COMPUTE_BYTES[job.compute_dtype]
        stages = [0] * layout.pp
        for s in _specs(job):
            n = s.numel // (layout.tp if s.shard_dim is not None else 1)
            stages[layout.stage_of_layer(s.layer)] += n * (4 + (compute + 4 if s.kind == "param" else 0))
        return max(stages)


ADAPTER = ReferenceAdapter()
