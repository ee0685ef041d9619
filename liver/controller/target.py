"""Target choice: the configuration the controller gives a GPU count when an event names none.

Candidates are every (tp, pp, dp) with tp*pp*dp = GPUs that the model and batch allow (Layout
validates). Those whose per-rank state does not fit the memory limit are dropped; the rest are
ranked by an analytic step-time estimate (compute with the pipeline bubble, TP activation
all-reduces, DP gradient all-reduce). Ties go to the configuration closest to the current one.
"""

from __future__ import annotations

from dataclasses import dataclass

from liver.engine.interface import EngineAdapter
from liver.topology import JobConfig, Layout, ParallelConfig


@dataclass(frozen=True)
class Hardware:
    flops: float = 400e12          # sustained per GPU
    tp_bandwidth: float = 150e9    # bytes/s for TP all-reduce (within a node)
    dp_bandwidth: float = 50e9     # bytes/s for the DP gradient all-reduce
    memory_bytes: float | None = None  # per GPU; None: no limit (CPU)
    node_slots: int | None = None  # GPUs per node (the smallest); a TP group larger runs over dp_bandwidth


def state_bytes_per_rank(adapter: EngineAdapter, job: JobConfig, layout: Layout) -> int:
    """The largest rank's memory for its state and compute copies (the engine's own count)."""
    return adapter.max_rank_bytes(job, layout)


def step_time(job: JobConfig, layout: Layout, hw: Hardware) -> float:
    m, t = job.model, job.train
    tokens = t.global_batch * m.seq_len
    compute = 6 * m.num_params() * tokens / (hw.flops * layout.size)
    micro = layout.num_micro_batches
    bubble = (micro + layout.pp - 1) / micro
    act = t.micro_batch * m.seq_len * m.hidden_size * 2
    tp_bytes = 0.0 if layout.tp == 1 else \
        4 * m.num_layers / layout.pp * micro * act * 2 * (layout.tp - 1) / layout.tp
    dp_bytes = 0.0 if layout.dp == 1 else \
        2 * (layout.dp - 1) / layout.dp * 4 * m.num_params() / (layout.tp * layout.pp)
    fits = hw.node_slots is None or (layout.tp <= hw.node_slots and hw.node_slots % layout.tp == 0)
    tp_link = hw.tp_bandwidth if fits else hw.dp_bandwidth  # (a TP group split over nodes)
    return compute * bubble + tp_bytes / tp_link + dp_bytes / hw.dp_bandwidth


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
