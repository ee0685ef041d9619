"""Admission: whether an event can be done, and to which configuration; pure, no process needed.

Every event is checked here before it is queued (control endpoint) and the whole schedule before
the job starts (``check_schedule``), so a refused request never moves state or starts a process.
"""

from __future__ import annotations

from typing import Iterable

from liver.config import RunConfig
from liver.policy import target
from liver.policy.events import Event, EventError, EventKind
from liver.engine.interface import EngineAdapter
from liver.topology import JobConfig, ParallelConfig


def hardware_of(cfg: RunConfig) -> target.Hardware:
    """What the target choice assumes of a GPU: the calibrated profile of the job's backend
    (CPU processes on gloo), its memory limit from ``controller.memory_gib``."""
    gib = cfg.controller.memory_gib
    return target.Hardware.named("cpu" if cfg.backend == "gloo" else "h200",
                                 memory_bytes=gib * 2**30 if gib is not None else None)


def admit(ev: Event, n_before: int, usable_slots: int, adapter: EngineAdapter, job: JobConfig,
          hardware: target.Hardware, current: ParallelConfig | None = None) -> ParallelConfig | None:
    """The target of ``ev`` for a job that will have ``n_before`` GPUs when it comes (None for a
    scale-in to 0: no configuration, the job waits on disk), chosen counting the live handoff from
    ``current`` where the job runs it (an event queued behind others is checked without: its
    target is chosen again when it runs); EventError (a ValueError) naming the source, the field
    and what is allowed."""
    if n_before == 0 and ev.kind is not EventKind.SCALE_OUT:
        raise EventError(f"{ev.source}: {ev.describe()}: the job will have no GPU then; allowed a scale-out")
    if ev.kind is EventKind.SCALE_OUT and ev.gpus <= n_before:
        raise EventError(f"{ev.source}: scale-out {ev.gpus}: the job will have {n_before} GPUs; "
                         "allowed a larger total")
    if ev.kind is EventKind.SCALE_IN and ev.gpus >= n_before:
        raise EventError(f"{ev.source}: scale-in {ev.gpus}: the job will have {n_before} GPUs; "
                         "allowed a smaller total")
    if ev.kind is EventKind.RESHAPE and ev.gpus != n_before:
        raise EventError(f"{ev.source}: reshape {ev.parallel.short()}: tp*pp*dp={ev.gpus} but the job "
                         f"will have {n_before} GPUs; a reshape keeps the GPU count")
    if ev.gpus > usable_slots:
        raise EventError(f"{ev.source}: gpus={ev.gpus} exceeds the {usable_slots} usable slots")
    if ev.gpus == 0:
        if ev.parallel is not None:
            raise EventError(f"{ev.source}: scale-in 0 leaves no GPU to lay out; allowed without 'as'")
        return None
    try:
        if ev.parallel is not None:
            adapter.layout(job, ev.parallel)
            return ev.parallel
        return target.choose(adapter, job, ev.gpus, hardware, current)
    except ValueError as e:
        raise EventError(f"{ev.source}: {e}") from None


def without(queue: list[Event], position: int, n_now: int, usable_slots: int, adapter: EngineAdapter,
            job: JobConfig, hardware: target.Hardware) -> list[Event]:
    """The queue with its ``position``-th event (from 1) withdrawn, every event after it admitted
    again against the GPUs the ones before it leave; ValueError (nothing withdrawn) otherwise."""
    if isinstance(position, bool) or not isinstance(position, int) or not 1 <= position <= len(queue):
        raise EventError(f"position={position!r}: allowed 1 to {len(queue)} (the queued events)"
                         if queue else f"position={position!r}: no event is queued")
    rest = queue[:position - 1] + queue[position:]
    n = n_now
    for i, ev in enumerate(rest):
        try:
            admit(ev, n, usable_slots, adapter, job, hardware)
        except ValueError as e:
            raise EventError(f"withdrawing #{position} ({queue[position - 1].describe()}) would leave "
                             f"#{i + 1 + (i >= position - 1)} invalid: {e}") from None
        n = ev.gpus
    return rest


def check_schedule(cfg: RunConfig, events: Iterable[Event]) -> ParallelConfig:
    """The first configuration, and every event of the schedule admitted in order (each against
    the GPUs the ones before it leave). Returns the first configuration."""
    hw, adapter = hardware_of(cfg), cfg.adapter
    first = cfg.parallel or target.choose(adapter, cfg.job, cfg.gpus, hw)
    n = cfg.gpus
    for ev in events:
        admit(ev, n, cfg.slots, adapter, cfg.job, hw)
        n = ev.gpus
    return first
