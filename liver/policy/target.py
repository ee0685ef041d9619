"""The target choice: the configuration a GPU count gets, the one the controller runs and the
simulator projects (both call ``choose``/``best``; ``tests/test_policy.py`` checks they agree).

Candidates are every (tp, pp, dp) with tp*pp*dp = GPUs that the engine accepts (its adapter
validates the layout: the model's and the batch's divisibility). Those whose largest rank's state
(the engine's own count, ``EngineAdapter.max_rank_bytes``) does not fit the GPU's memory with
``ACTIVATIONS`` to spare are dropped; the rest are ranked by the cost model's step time
(``costs.step_time``: a roofline with the pipeline bubble and the TP and DP all-reduces, and on CPU
processes the framework's per-layer time and the collectives' round trips) under the hardware's
profile: "h200" for NCCL, "cpu" for gloo (``calibration.json``; ``liver bench target`` checks the
choice against measurement). Ties go to the configuration closest to the current one, then to
less pipelining, then to less tensor parallelism.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from liver.engine.interface import EngineAdapter
from liver.policy import costs
from liver.policy.profile import Profile, load
from liver.policy.workload import Workload
from liver.topology import JobConfig, Layout, ParallelConfig

#: a rank's state must fit the GPU's memory this many times over (the rest: activations, buffers)
ACTIVATIONS = 1.25


@dataclass(frozen=True)
class Hardware:
    """What the choice assumes of the GPUs: the cost model's ``profile``, the memory of one GPU
    (None: no limit, CPU processes), and the GPUs of the smallest node (None: the profile's)."""

    profile: Profile
    memory_bytes: float | None = None
    node_slots: int | None = None

    @classmethod
    def named(cls, profile: str, memory_bytes: float | None = None) -> "Hardware":
        return cls(load(profile), memory_bytes)

    @classmethod
    def of(cls, prof: Profile) -> "Hardware":
        """A class of machines as the simulator models it: the profile's own memory and node size."""
        return cls(prof, prof.memory_bytes)

    def with_nodes(self, node_slots: int | None) -> "Hardware":
        return replace(self, node_slots=node_slots)

    @property
    def costs(self) -> Profile:
        """The profile the step times come from (its node size the smallest node's, where known)."""
        p = self.profile
        return p if self.node_slots is None or self.node_slots == p.node_size else p.replace(node_size=self.node_slots)


def step_time(job: Workload, layout: Layout, hw: Hardware) -> float:
    return _step_time(job, layout, hw.costs)


@functools.lru_cache(maxsize=65536)
def _step_time(job: Workload, layout: Layout, prof: Profile) -> float:
    return costs.step_time(job, layout, prof)


@functools.lru_cache(maxsize=4096)
def candidates(adapter: EngineAdapter, job: JobConfig, gpus: int) -> tuple[Layout, ...]:
    """Every layout of ``gpus`` GPUs the engine accepts for this job."""
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
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def state_bytes(adapter: EngineAdapter, job: JobConfig, layout: Layout) -> int:
    """The largest rank's memory for its state and compute copies (the engine's own count)."""
    return adapter.max_rank_bytes(job, layout)


def fits(adapter: EngineAdapter, job: JobConfig, layout: Layout, hw: Hardware) -> bool:
    return hw.memory_bytes is None or state_bytes(adapter, job, layout) * ACTIVATIONS <= hw.memory_bytes


def _rank(job: Workload, hw: Hardware, current: ParallelConfig | None):
    def key(c: Layout):
        moved = 0 if current is None else sum(a != b for a, b in zip((c.tp, c.pp, c.dp),
                                                                     (current.tp, current.pp, current.dp)))
        return round(step_time(job, c, hw), 12), moved, c.pp, c.tp
    return key


def best(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware, current: ParallelConfig | None = None,
         keep_tp_pp: tuple[int, int] | None = None) -> Layout | None:
    """The fastest layout for ``gpus`` GPUs that fits (``keep_tp_pp``: only those of this TP and
    PP, data-parallel-only resizing), or None."""
    fit = [c for c in candidates(adapter, job, gpus)
           if (keep_tp_pp is None or (c.tp, c.pp) == keep_tp_pp) and fits(adapter, job, c, hw)]
    return min(fit, key=_rank(Workload(adapter, job), hw, current), default=None)


@functools.lru_cache(maxsize=65536)
def best_up_to(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware) -> Layout | None:
    """The best layout on the most of ``gpus`` that any layout can use (a count the batch or the
    shapes do not divide leaves a few GPUs idle), or None."""
    for n in range(gpus, 0, -1):
        lay = best(adapter, job, n, hw)
        if lay is not None:
            return lay
    return None


def choose(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware,
           current: ParallelConfig | None = None) -> ParallelConfig:
    """The best valid configuration for exactly ``gpus`` GPUs; ValueError naming why none exists."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: allowed a positive GPU count")
    cands = candidates(adapter, job, gpus)
    if not cands:
        raise ValueError(f"gpus={gpus}: no tp*pp*dp={gpus} is valid for this model and batch "
                         f"({adapter.facts(job).layers} layers, the engine's shapes, global batch "
                         f"{job.train.global_batch}, micro batch {job.train.micro_batch})")
    lay = best(adapter, job, gpus, hw, current)
    if lay is None:
        need = min(state_bytes(adapter, job, c) for c in cands) * ACTIVATIONS
        raise ValueError(f"gpus={gpus}: no configuration fits memory_bytes={hw.memory_bytes:.3g} per GPU "
                         f"(the smallest needs {need:.3g} with activations)")
    return lay.parallel
