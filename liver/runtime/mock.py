"""A cold joiner's warm-up on a mock world (``liver.world.mock``), and the rehearsal of a training
step that the worker template does once."""

from __future__ import annotations

import torch

from liver.engine.interface import EngineAdapter, TrainingEngine
from liver.engine.loop import Steps
from liver.topology import JobConfig, ParallelConfig
from liver.topology.layout import Layout


class _WarmUp:
    """The loop's driver for a warm-up: ``steps`` iterations on a mock world, no boundary."""

    def __init__(self, engine: TrainingEngine, steps: int) -> None:
        self.engine, self.total_steps = engine, engine.step + steps

    def after_step(self, stats) -> None:
        pass

    def can_stall(self) -> bool:
        return False

    def stall(self, err: BaseException) -> None:
        raise err


def warm_up(adapter: EngineAdapter, job: JobConfig, layout: Layout, rank: int, backend: str, device: torch.device,
            steps: int, generation: int = 0) -> TrainingEngine:
    """A cold worker's warm-up: ``steps`` iterations of the training loop (the engine's, or a
    recipe's own: the very code it will run) as rank ``rank`` of ``layout`` on a mock world.
    Returns the engine: its state is already in the new layout."""
    world = adapter.mock_world(generation, layout, rank, backend, device)
    with world.registered():
        engine = adapter.build(job, world, device)
        adapter.drive(Steps(_WarmUp(engine, steps), adapter.make_step))
    return engine


def rehearse_step(adapter: EngineAdapter) -> None:
    """One training step of the engine's rehearsal job (tensor, pipeline and data parallel where it
    allows them, rank 0) on a mock world: torch's first-use costs (autograd, the optimizer, the
    kernels' dispatch) paid once, in the zygote (liver/runtime/preload.py), so that a joiner forked
    from it does not pay them beside the training it joins."""
    job = adapter.rehearsal_job()
    warm_up(adapter, job, adapter.layout(job, rehearsal_parallel(adapter, job)), 0, "gloo", torch.device("cpu"), 1)


def rehearsal_parallel(adapter: EngineAdapter, job: JobConfig) -> ParallelConfig:
    """The richest of tp2pp2dp2, tp2, pp2, dp2 that the engine accepts for ``job``."""
    for p in (ParallelConfig(tp=2, pp=2, dp=2), ParallelConfig(tp=2), ParallelConfig(pp=2), ParallelConfig(dp=2)):
        try:
            adapter.layout(job, p)
            return p
        except ValueError:
            continue
    return ParallelConfig()
