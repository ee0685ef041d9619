"""A controller's job in this process, for in-process tests of the controller (as torchft tests its
Manager): a real controller (``Controller``, in the mode its configuration names) over an in-memory store
(``HashStore``) and one node whose processes are played by the test (``FakeNode``); the ranks'
side of the protocol written by the test (``FakeRanks``: steps, ready, commit, switch reports,
exits). Each pass of the controller's loop is one call (``Controller.once``): a scenario runs in
milliseconds and every intermediate state can be checked."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from liver.agent.node import Worker
from liver.config import RunConfig
from liver.controller.controller import Controller
from liver.controller.phases import Phase
from liver.policy.events import Event, parse_schedule_text
from liver.protocol.messages import (PrepareReport, Progress, Saved, StartReport, Stalled, StopReport,
                                     SwitchReport, beat_key, read_if, write)
from liver.protocol.store import COMMIT, decide


class FakeNode:
    """The controller's one node, its processes played by the test: started ones are only
    recorded; the test says when one exits (``exit``)."""

    lost = False
    notice = None

    def __init__(self, slot_base: int, slots: int, name: str = "local") -> None:
        self.name, self.slot_base, self.slots = name, slot_base, slots
        self.workers: dict[int, Worker] = {}
        self.started: list[tuple[int, str, int]] = []  # (proc, role, generation), in order
        self._exits: list[Worker] = []

    def free_slots(self) -> list[int]:
        busy = {w.slot for w in self.workers.values() if w.returncode is None}
        return [s for s in range(self.slot_base, self.slot_base + self.slots) if s not in busy]

    def start(self, proc: int, slot: int, role: str, generation: int) -> Worker:
        if slot not in self.free_slots():
            raise RuntimeError(f"slot {slot} is busy")
        w = self.workers[proc] = Worker(proc, slot, role, generation, 10_000 + proc, time.time())
        self.started.append((proc, role, generation))
        return w

    def exit(self, proc: int, code: int) -> None:
        """The test's: process ``proc`` ended with ``code`` (the next poll reports it)."""
        w = self.workers[proc]
        assert w.returncode is None, f"process {proc} already ended ({w.returncode})"
        w.returncode = code
        self._exits.append(w)

    def poll(self) -> list[Worker]:
        out, self._exits = self._exits, []
        return out

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.returncode is None]

    def kill(self, proc: int) -> None:
        w = self.workers[proc]
        if w.returncode is None:
            w.returncode = -9

    def wait(self, procs: list[int], timeout_s: float) -> bool:
        return all(self.workers[p].returncode is not None for p in procs)

    def log_tail(self, proc: int, chars: int = 2000) -> str:
        return ""

    def interrupt(self) -> None:
        pass

    def stop_all(self) -> None:
        for w in self.alive():
            self.kill(w.proc)

    def shutdown(self) -> None:
        self.stop_all()


class FakeRanks:
    """What the ranks write to the store, written by the test."""

    def __init__(self, ctl) -> None:
        self.ctl, self.store = ctl, ctl.store
        self.t = time.time()

    def step(self, step: int, generation: int | None = None, step_s: float = 0.05) -> None:
        """Rank 0 of the Active World (or of ``generation``) finished ``step``; every live
        process's heartbeat is fresh."""
        g = self.ctl.state.active.generation if generation is None else generation
        self.t = time.time()
        write(self.store, Progress.KEY, Progress(step=step, generation=g, loss=1.0, step_s=step_s, time=self.t,
                                                 parallel="?"))
        for w in self.ctl.nodes.alive():
            self.store.set(beat_key(w.proc), str(self.t))

    def ready(self, procs=None) -> None:
        """Every member (or ``procs``) prepared the pending generation."""
        g = self.ctl.state.pending.generation
        for p in self.ctl.state.members if procs is None else procs:
            self.store.set(f"ready/{g}/{p}", str(time.time()))

    def commit(self) -> str:
        """Rank 0 of the Active World commits the pending generation (or finds it withdrawn)."""
        return decide(self.store, self.ctl.state.pending.generation, COMMIT)

    def switched(self, step: int) -> None:
        """Every member's switch into the pending generation is done, after step ``step``."""
        spec, now = self.ctl.state.pending, time.time()
        old = self.ctl.state.active.procs
        for p in self.ctl.state.members:
            new_rank = spec.procs.index(p) if p in spec.procs else None
            rep = SwitchReport(proc=p, generation=spec.generation, prepare=PrepareReport(),
                               transfer={"switch_s": 0.01, "seconds": 0.005, "peak_staging_bytes": 0},
                               switch_start=now - 0.01, switch_end=now, old_step=step if p in old else None,
                               new_rank=new_rank, step=step)
            write(self.store, SwitchReport.key(spec.generation, p), rep)

    def switch_into(self, generation: int, procs, step: int) -> None:
        """``procs`` switched into ``generation`` (a heal's: the controller waits for it in one
        pass, so the test writes it ahead), at step ``step``."""
        now = time.time()
        for r, p in enumerate(procs):
            write(self.store, SwitchReport.key(generation, p),
                  SwitchReport(proc=p, generation=generation, prepare=PrepareReport(), transfer={}, switch_start=now,
                               switch_end=now, new_rank=r, step=step, digest_after="after"))

    def saved(self, path: str, step: int, exit_code: int = 0) -> None:
        """Restart mode: the Active World saved its state at ``step`` to ``path`` and its
        processes ended (``exit_code``)."""
        g = self.ctl.state.active.generation
        write(self.store, Saved.key(g), Saved(path=path, step=step))
        for p in self.ctl.state.active.procs:
            write(self.store, StopReport.key(g, p), StopReport(proc=p, generation=g, step=step, save_s=0.1,
                                                               saved_at=time.time(), digest_before="before"))
            self.ctl.nodes.node_of(self.ctl.state.slot_of[p]).exit(p, exit_code)

    def started_all(self, step: int) -> None:
        """Every process of the Active World (a whole new generation) loaded and reported."""
        g, now = self.ctl.state.active.generation, time.time()
        for p in self.ctl.state.active.procs:
            write(self.store, StartReport.key(g, p),
                  StartReport(proc=p, generation=g, timings={"group_init_s": 0.1, "build_s": 0.2, "load_s": 0.3},
                              process_start=now, imported=now, ready=now, step=step, digest_after="after"))

    def stalled(self, procs, step: int) -> None:
        """Survivors of a broken generation stopped at ``step`` and wait to be healed."""
        g = self.ctl.state.active.generation
        for p in procs:
            write(self.store, Stalled.key(g, p), Stalled(proc=p, generation=g, step=step, error="peer lost"))

    def wish(self):
        from liver.protocol.messages import Wish
        return read_if(self.store, Wish.KEY, Wish)


def config(gpus: int = 2, slots: int = 4, mode: str = "live", parallel=None, **controller) -> RunConfig:
    cfg = RunConfig(gpus=parallel.world_size if parallel else gpus, parallel=parallel)
    cfg = replace(cfg, agent=replace(cfg.agent, slots=slots),
                  checkpoint=replace(cfg.checkpoint, every=0),
                  controller=replace(cfg.controller, mode=mode, end_after_events=None, endpoint=False, **controller))
    return cfg


def controller(tmp_path: Path, schedule: str = "", **cfg):
    """A controller over a HashStore and a ``FakeNode``, its first generation started
    (not yet trained a step), its events from ``schedule`` (a schedule file's text)."""
    c = config(**cfg)
    events: list[Event] = parse_schedule_text(schedule, "schedule") if schedule else []
    node = FakeNode(0, c.slots)
    ctl = Controller(c, events, tmp_path, store=dist.HashStore(), node=node)
    ctl.start()
    return ctl, node, FakeRanks(ctl)


def run_until(ctl, done, ranks: FakeRanks | None = None, step: int | None = None, passes: int = 200) -> None:
    """Passes of the controller's loop until ``done()`` (AssertionError naming the phase after
    ``passes``); ``ranks``/``step``: rank 0 reports that step before each pass."""
    for _ in range(passes):
        if ranks is not None and step is not None:
            ranks.step(step)
        ctl.once()
        if done():
            return
    raise AssertionError(f"not reached after {passes} passes: phase {ctl.state.phase.value}, "
                         f"records {[r.status for r in ctl.state.records]}")


__all__ = ["FakeNode", "FakeRanks", "controller", "run_until", "Phase"]
