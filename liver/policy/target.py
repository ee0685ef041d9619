"""The target choice: the configuration a GPU count gets, the one the controller runs and the
simulator projects (both call ``choose``/``best``; ``tests/test_policy.py`` checks they agree).

Candidates are every (tp, pp, dp) with tp*pp*dp = GPUs that the engine accepts (its adapter
validates the layout: the model's and the batch's divisibility). Those whose largest rank's state
(the engine's own count, ``EngineAdapter.max_rank_bytes``) does not fit the GPU's memory with
``ACTIVATIONS`` to spare are dropped; the rest are ranked by the cost model's step time
(``costs.step_time``: a roofline paced by the fullest pipeline stage, with the bubble and the TP
and DP all-reduces, and on CPU processes the framework's per-layer time and the collectives'
round trips) under the hardware's profile: "h200" for NCCL, "cpu" for gloo (``calibration.json``; ``liver bench target`` checks the
choice against measurement). Where the job runs a configuration already (``current``), the cost of
getting from it to each candidate is counted too (``moves``: the live pause by default, a restart
for the simulator's baselines), weighed against the steps over the horizon the job expects on the
target: between candidates whose steps differ by a fraction of a percent, the one reached in the
shorter pause wins, so neighbouring GPU counts do not flip between configurations a move apart.
Ties go to the configuration closest to the current one, then to less pipelining, then to less
tensor parallelism.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from liver.engine.interface import EngineAdapter
from liver.policy import costs
from liver.policy.moves import LIVE, Move
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
    def shares_cores(self) -> bool:
        """Processes share a host's cores (CPU processes): more of them than cores always step
        slower, so a count's own layouts never pay for leaving some idle; GPUs each have their own."""
        return self.profile.cores is not None

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


@functools.lru_cache(maxsize=65536)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending (found up to its square root: a count of 100,000 GPUs and
    every count below it, as ``best_up_to`` walks them, are enumerated in seconds, not hours)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*low, *(n // d for d in low)}))


@functools.lru_cache(maxsize=65536)
def candidates(adapter: EngineAdapter, job: JobConfig, gpus: int) -> tuple[Layout, ...]:
    """Every layout of ``gpus`` GPUs the engine accepts for this job."""
    out = []
    for tp in _divisors(gpus):
        for pp in _divisors(gpus // tp):
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


def fitting(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware,
            keep_tp_pp: tuple[int, int] | None = None) -> list[Layout]:
    """The candidates of ``gpus`` GPUs that fit (``keep_tp_pp``: only those of this TP and PP)."""
    return [c for c in candidates(adapter, job, gpus)
            if (keep_tp_pp is None or (c.tp, c.pp) == keep_tp_pp) and fits(adapter, job, c, hw)]


def _rank(job: Workload, hw: Hardware, current: ParallelConfig | None):
    def key(c: Layout):
        moved = 0 if current is None else sum(a != b for a, b in zip((c.tp, c.pp, c.dp),
                                                                     (current.tp, current.pp, current.dp)))
        return round(step_time(job, c, hw), 12), moved, c.pp, c.tp
    return key


def best(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware, current: ParallelConfig | None = None,
         keep_tp_pp: tuple[int, int] | None = None, move: Move = LIVE) -> Layout | None:
    """The best layout for ``gpus`` GPUs that fits (``keep_tp_pp``: only those of this TP and PP,
    data-parallel-only resizing), or None: the fastest, or where the job runs ``current``, the one
    that trains the most over ``move``'s horizon once the move to it is counted."""
    fit = fitting(adapter, job, gpus, hw, keep_tp_pp)
    work = Workload(adapter, job)
    if current is None or len(fit) < 2:
        return min(fit, key=_rank(work, hw, current), default=None)
    return _cheapest_to_reach(work, fit, hw, current, move)


def _cheapest_to_reach(work: Workload, fit: list[Layout], hw: Hardware, current: ParallelConfig,
                       move: Move) -> Layout:
    """The least ``cost + horizon * step / fastest step`` (``moves``), ties as ``_rank``'s. The
    candidates are taken fastest first, and once a candidate's steps alone lose more over the
    horizon than the best total so far, none after it can win (a move costs nothing or more):
    the costs of the rest are never computed (a live handoff's plans them)."""
    rank = _rank(work, hw, current)
    fit = sorted(fit, key=rank)
    fastest = step_time(work, fit[0], hw)
    scale = move.horizon_s / fastest
    best_key, best_lay = None, fit[0]
    for c in fit:
        steps = scale * step_time(work, c, hw)
        if best_key is not None and steps >= best_key[0]:
            break
        key = (round(move.cost_s(work, current, c.parallel, hw.costs) + steps, 9), *rank(c)[1:])
        if best_key is None or key < best_key:
            best_key, best_lay = key, c
    return best_lay


def why(adapter: EngineAdapter, job: JobConfig, hw: Hardware, current: ParallelConfig, chosen: ParallelConfig,
        move: Move = LIVE) -> str | None:
    """Where the move counted (``best`` from ``current``) chose another configuration than the
    fastest of its GPU count: both, their steps and their moves, in words; None where it did not."""
    work = Workload(adapter, job)
    fastest = min(fitting(adapter, job, chosen.world_size, hw), key=_rank(work, hw, current), default=None)
    if fastest is None or fastest.parallel == chosen:
        return None
    lay = adapter.layout(job, chosen)
    slower = step_time(work, lay, hw) / step_time(work, fastest, hw) - 1
    return (f"{chosen.short()} over the fastest {fastest.parallel.short()}: its step {slower:.2%} slower, its move "
            f"{move.cost_s(work, current, chosen, hw.costs):.3g} s against "
            f"{move.cost_s(work, current, fastest.parallel, hw.costs):.3g} s (over a {move.horizon_s:g} s horizon)")


@functools.lru_cache(maxsize=65536)
def best_up_to(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware,
               current: ParallelConfig | None = None, move: Move = LIVE) -> Layout | None:
    """The best layout (``best``) on ``gpus`` GPUs, as the controller chooses it; where no layout
    of exactly ``gpus`` fits (a count that the batch or the shapes do not divide), the best on
    fewer of them, the rest left idle: every smaller count is a candidate, not only the largest
    that has a layout (whose only layouts may split the layers unevenly: 80 layers on 63 stages
    at 1,008 GPUs step slower than on 31 at 992), taken from ``gpus`` down until not even a
    count's compute alone (``costs.step_floor``) could beat the fastest found. Where the job runs
    ``current`` on no more than ``gpus``, staying on it (the rest idle, no move) is a candidate
    too: a job on 864 of 1,016 GPUs that loses idle ones, or gains a few, does not move to
    1,008's layouts, which all step 40% slower, and back. From ``current`` on GPUs of their own
    (not ``hw.shares_cores``), every smaller count is a candidate even where ``gpus`` has layouts:
    70B that loses a node of its 640 GPUs goes to tp2pp9dp32 on 576, not to 632's only layout,
    tp2pp79dp4, 83% slower; and so does a first choice (``current`` None, the simulator's: the
    GPUs a trace gives, not a count a user asked for), else the job would start on 1,008's
    tp2pp63dp8 and jump to a layout 40% faster at its first change. None where no layout fits at
    all."""
    if not hw.shares_cores:
        fit = _down_from(adapter, job, gpus, hw)
    else:
        fit = fitting(adapter, job, gpus, hw) or _down_from(adapter, job, gpus - 1, hw)
    work = Workload(adapter, job)
    if current is not None and current.world_size <= gpus and all(c.parallel != current for c in fit):
        stay = adapter.layout(job, current)
        fit = [*fit, stay] if fits(adapter, job, stay, hw) else fit
    if current is None or len(fit) < 2:
        return min(fit, key=_rank(work, hw, current), default=None)
    return _cheapest_to_reach(work, fit, hw, current, move)


@functools.lru_cache(maxsize=65536)
def fastest_up_to(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware) -> Layout | None:
    """The layout that steps fastest on at most ``gpus`` GPUs, the rest left idle: what a job
    with no cost to change would run (an exact count's layouts may all step slower than a smaller
    count's: 80 layers on 63 stages at 1,008 GPUs, against 27 stages on 864). None where none fits."""
    work = Workload(adapter, job)
    return min(_down_from(adapter, job, gpus, hw), key=lambda c: step_time(work, c, hw), default=None)


def _down_from(adapter: EngineAdapter, job: JobConfig, top: int, hw: Hardware) -> list[Layout]:
    """The layouts that fit on each count from ``top`` down, until not even a count's compute
    alone (``costs.step_floor``) could beat the fastest found."""
    work, fit, fastest = Workload(adapter, job), [], float("inf")
    for n in range(top, 0, -1):
        if costs.step_floor(work, n, hw.costs) >= fastest:
            break
        here = fitting(adapter, job, n, hw)
        fit += here
        fastest = min([fastest, *(step_time(work, c, hw) for c in here)])
    return fit


def choose(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware,
           current: ParallelConfig | None = None, move: Move = LIVE) -> ParallelConfig:
    """The best valid configuration for exactly ``gpus`` GPUs (from ``current``: counting the
    ``move`` to it, a live handoff by default); ValueError naming why none exists."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: allowed a positive GPU count")
    cands = candidates(adapter, job, gpus)
    if not cands:
        raise ValueError(f"gpus={gpus}: no tp*pp*dp={gpus} is valid for this model and batch "
                         f"({adapter.facts(job).layers} layers, the engine's shapes, global batch "
                         f"{job.train.global_batch}, micro batch {job.train.micro_batch})")
    lay = best(adapter, job, gpus, hw, current, move=move)
    if lay is None:
        need = min(state_bytes(adapter, job, c) for c in cands) * ACTIVATIONS
        raise ValueError(f"gpus={gpus}: no configuration fits memory_bytes={hw.memory_bytes:.3g} per GPU "
                         f"(the smallest needs {need:.3g} with activations)")
    return lay.parallel


def choose_up_to(adapter: EngineAdapter, job: JobConfig, gpus: int, hw: Hardware,
                 current: ParallelConfig | None = None, move: Move = LIVE) -> ParallelConfig:
    """Where GPUs are lost, not asked for: ``choose`` on exactly ``gpus`` where a configuration
    fits; else the best on fewer of them (``best_up_to``), the rest left idle (seven survivors of
    a job whose batch of 8 no count of 7 divides train on 4, not stop). ValueError only where no
    configuration fits at all."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: allowed a positive GPU count")
    lay = best_up_to(adapter, job, gpus, hw, current, move)
    if lay is None:
        choose(adapter, job, gpus, hw)  # (raises, saying why: no configuration of these GPUs or fewer fits)
        raise ValueError(f"gpus={gpus}: no configuration of {gpus} GPUs or fewer fits")
    return lay.parallel

