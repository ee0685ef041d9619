"""A rehearsal of the planner and the executor on a small reshape, communicating nothing: the
first real preparation (or the controller's first plan) then finds their code, imports and caches
loaded, instead of paying for them beside the running steps."""

from __future__ import annotations

import torch

from liver.engine.interface import EngineAdapter
from liver.planner.plan import Plan, plan_transfer
from liver.topology import JobConfig, ParallelConfig
from liver.transfer.executor import StreamingExecutor
from liver.world.mock import MockGroup


def rehearse(adapter: EngineAdapter) -> Plan:
    """Plan a small reshape (placement search included) and work out both processes' schedules,
    communicating nothing: the first real preparation (or the controller's first plan) then finds
    the planner's and the executor's code, imports and caches loaded, instead of paying for them
    beside the running steps. Returns the plan."""
    job = adapter.rehearsal_job()
    specs = adapter.state_specs(job)
    two = [p for p in (ParallelConfig(tp=2), ParallelConfig(pp=2), ParallelConfig(dp=2)) if _accepts(adapter, job, p)]
    if len(two) < 2:
        raise ValueError(f"engine {adapter.name}: its rehearsal job allows fewer than two 2-rank layouts")
    old, new = adapter.layout(job, two[0]), adapter.layout(job, two[1])
    plan = plan_transfer(old, new, specs, [0, 1], [0, 1])
    for proc in (0, 1):
        StreamingExecutor(plan, specs, proc, MockGroup("rehearsal", [0, 1], proc, "gloo", torch.device("cpu")),
                          1 << 20, torch.device("cpu"))
    return plan


def _accepts(adapter: EngineAdapter, job: JobConfig, parallel: ParallelConfig) -> bool:
    try:
        adapter.layout(job, parallel)
        return True
    except ValueError:
        return False
