"""The simulator's event streams: when the job's GPU count changes, and (for a loss) how much
notice it had. A spot trace (Bamboo's ``time_ms,add|remove,nodeNAME`` lines or SkyPilot's JSON of
instances a tick: ``liver.policy.events.trace_counts``; each trace node ``gpus_per_node``
GPUs), a schedule file of the controller's grammar (``at Ts: scale-out N`` / ``scale-in N
deadline Ds``; time triggers only), or a synthetic regime: exponential intervals of a given mean,
each a node lost (with the notice) or one back, for a given length of time and seed."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from liver.policy.events import EventError, EventKind, parse_schedule, trace_counts


@dataclass(frozen=True)
class Change:
    t: float            # when the count becomes ``gpus`` (a loss: when the GPUs are gone)
    gpus: int
    notice_s: float = 0.0   # a loss: how long before ``t`` the notice came (0: none, a fail-stop)


def check(name: str, value: float, low: float = 0.0, zero: bool = False) -> float:
    """``value`` if it is a finite number above ``low`` (or equal to it, ``zero``); EventError
    naming ``name``, the value and what is allowed otherwise (a NaN or an infinity would run a
    simulation forever or give NaN figures)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low or (value == low and not zero):
        raise EventError(f"{name}={value!r}: allowed a finite number {'of at least' if zero else 'above'} {low:g}")
    return value


def from_trace(path: str | Path, gpus_per_node: int, notice_s: float = 120.0,
               hours: float | None = None) -> tuple[int, list[Change]]:
    """(GPUs at the start, the changes) of a spot trace, cut at ``hours`` if given. The trace's
    time 0 is the job's: a trace whose first node comes later starts with no GPU (idle until then)."""
    if gpus_per_node < 1:
        raise EventError(f"gpus_per_node={gpus_per_node}: allowed 1 or more")
    check("notice_s", notice_s, zero=True)
    if hours is not None:
        check("hours", hours)
    counts = trace_counts(path)
    if counts[0][0] > 0:
        counts = [(0, 0), *counts]
    start = counts[0][1] * gpus_per_node
    out, current = [], start
    for t_ms, c in counts[1:]:
        t = t_ms / 1000
        if hours is not None and t > hours * 3600:
            break
        g = c * gpus_per_node
        if g != current:
            out.append(Change(t, g, notice_s if g < current else 0.0))
            current = g
    return start, out


def from_schedule(path: str | Path, gpus: int) -> list[Change]:
    """A schedule file's time-triggered events (``at Ts: ...``) as changes; a scale-in's deadline is
    its notice, the GPUs gone at the deadline."""
    out = []
    for ev in parse_schedule(path):
        if ev.at_time is None:
            raise EventError(f"{ev.source}: the simulator takes time triggers (at Ts:), not steps")
        if ev.kind is EventKind.RESHAPE:
            raise EventError(f"{ev.source}: reshape: the simulator's policies choose their configurations")
        notice = ev.deadline_s or 0.0
        out.append(Change(ev.at_time + notice, ev.gpus, notice if ev.kind is EventKind.SCALE_IN else 0.0))
    return out


def synthetic(gpus: int, node_size: int, mean_interval_s: float, notice_s: float, hours: float,
              seed: int = 0) -> list[Change]:
    """A node lost (with ``notice_s``) or, when some are out, one back, at exponential intervals
    of ``mean_interval_s``: a volatility regime around ``gpus``."""
    check("mean_interval_s", mean_interval_s)
    check("notice_s", notice_s, zero=True)
    check("hours", hours)
    if gpus < node_size:
        raise EventError(f"synthetic regime: mean interval {mean_interval_s} s, {hours} h, {gpus} GPUs "
                         f"(nodes of {node_size}): allowed positive times and at least one node")
    rng = random.Random(seed)
    t, out, current = 0.0, [], gpus
    while True:
        t += rng.expovariate(1 / mean_interval_s)
        if t > hours * 3600:
            return out
        back = current < gpus and (current <= node_size or rng.random() < 0.5)
        current += node_size if back else -node_size
        out.append(Change(t, current, 0.0 if back else notice_s))
