"""Target choice: the configuration the controller gives a GPU count when an event names none.

Candidates are every (tp, pp, dp) with tp*pp*dp = GPUs that the model and batch allow (Layout
validates). Those whose per-rank state does not fit the memory limit are dropped; the rest are
ranked by the simulator's calibrated step-time model (``liver.sim.costs.step_time``: a roofline
with the pipeline bubble and the TP and DP all-reduces, and on CPU processes the framework's
per-layer time and the collectives' round trips), with the profile of the job's backend: "h200"
for NCCL, "cpu" for gloo (``liver/sim/calibration.json``; ``liver bench target`` checks the
choice against measurement). Ties go to the configuration closest to the current one.
"""

from __future__ import annotations

from dataclasses import dataclass

from liver.engine.interface import EngineAdapter
from liver.topology import JobConfig, Layout, ParallelConfig


@dataclass(frozen=True)
class Hardware:
    profile: str = "h200"          # the simulator's calibrated profile (liver.sim.profile)
    memory_bytes: float | None = None  # per GPU; None: no limit (CPU)
    node_slots: int | None = None  # GPUs per node (the smallest); a TP group larger crosses nodes


def state_bytes_per_rank(adapter: EngineAdapter, job: JobConfig, layout: Layout) -> int:
    """The largest rank's memory for its state and compute copies (the engine's own count)."""
    return adapter.max_rank_bytes(job, layout)


def step_time(job: JobConfig, layout: Layout, hw: Hardware) -> float:
    from liver.sim import costs, profile

    prof = profile.load(hw.profile)
    if hw.node_slots is not None:
        prof = prof.replace(node_size=hw.node_slots)
    return costs.step_time(job, layout, prof)


def candidates(adapter: EngineAdapter, job: JobConfig, gpus: int) -> list[Layout]:
    out = []
    for tp in range(1, gpus + 1):
        if gpus % tp:
            continue
        for pp in range(1, gpus // tp + 1):
            if (gpus // tp) % pp:
                continue
            try:
                out.append(adapter.layout(job, ParallelConfig(tp=tp, pp=pp, dp=gpus // (tp * pp))))
            except ValueError:
                continue
    return out


def choose(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware = Hardware(),
           current: ParallelConfig | None = None) -> ParallelConfig:
    """The best valid configuration for ``gpus`` GPUs; ValueError naming why none exists."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: allowed a positive GPU count")
    cands = candidates(adapter, job, gpus)
    if not cands:
        raise ValueError(f"gpus={gpus}: no tp*pp*dp={gpus} is valid for this model and batch "
                         f"(heads {job.model.num_heads}, layers {job.model.num_layers}, global batch "
                         f"{job.train.global_batch}, micro batch {job.train.micro_batch})")
    if hw.memory_bytes is not None:
        fit = [c for c in cands if state_bytes_per_rank(adapter, job, c) <= hw.memory_bytes]
        if not fit:
            raise ValueError(f"gpus={gpus}: no configuration fits memory_bytes={hw.memory_bytes:.3g} "
                             f"per GPU (smallest needs {min(state_bytes_per_rank(adapter, job, c) for c in cands):.3g})")
        cands = fit

    def distance(c: Layout) -> int:
        if current is None:
            return 0
        return sum(a != b for a, b in zip((c.tp, c.pp, c.dp), (current.tp, current.pp, current.dp)))

    best = min(cands, key=lambda c: (round(step_time(job, c, hw), 12), distance(c), c.pp, c.tp))
    return best.parallel
