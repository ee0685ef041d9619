"""The controller of ``liver run``, the part every mode shares: owns the job's store, the node
agent and the event queue; starts whole generations; learns the workers' progress; handles a
fail-stop. The modes (``live.py``, ``restart.py``) add how an event is carried out.

One event at a time, monotonic generation ids, at most two generations alive. Workers learn its
wishes through the store (``liver.protocol``); it learns their progress the same way. A worker
that dies without notice while in the Active World is a fail-stop: every process is stopped and
the job restarts from the latest periodic checkpoint on the slots it still has.
"""

from __future__ import annotations

import collections
import pickle
import threading
import time
from pathlib import Path
from typing import Any

from liver import logs
from liver.host import cores
from liver.agent.node import NodeAgent, Starter, Worker
from liver.agent.zygote import ForkedWorkers
from liver.checkpoint.periodic import latest
from liver.config import RunConfig
from liver.config.fields import to_dict
from liver.controller import target
from liver.controller.admission import admit, hardware_of, without
from liver.controller.decisions import EndState, job_finished
from liver.controller.endpoint import ControlEndpoint
from liver.controller.events import Event, parse_action
from liver.controller.phases import Phase, Trigger, advance
from liver.controller.records import Handling, first, least, new_record
from liver.protocol import store as protocol
from liver.protocol.messages import M, GenerationSpec, Progress, StartReport, Wish, beat_key, read, read_if, write
from liver.protocol.worker import WorkerConfig
from liver.runtime import preload
from liver.topology import ParallelConfig
from liver.transfer.rehearsal import rehearse
from liver.world.world import make_store


class ControllerError(RuntimeError):
    pass


def forked_workers(backend: str, engine: str, joiners: bool) -> ForkedWorkers:
    """Workers forked from the agent's zygote (and cold ``joiners`` from one at idle priority):
    their imports were done before they were needed (a CPU training step rehearsed too, for CPU
    workers; GPU workers make their own CUDA context after the fork)."""
    return ForkedWorkers(preload.for_backend(backend), preload.ENTRY, (engine,), joiners=joiners)


def _last_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip() and not x.startswith(("step:", "[rank"))]
    return lines[-1][:300] if lines else ""


class Controller:
    mode = "base"

    def starter(self, backend: str, engine: str) -> Starter:
        """How this mode's node agent makes worker processes."""
        raise NotImplementedError

    def tick(self) -> None:
        """One pass of the mode's handling of the current event."""
        raise NotImplementedError

    def __init__(self, cfg: RunConfig, events: list[Event], run_dir: Path, token: str | None = None) -> None:
        """``cfg`` with its slots set (``RunConfig.with_slots``); ``token``: the control endpoint's
        (default: a random one, in the run's control.json)."""
        self.cfg, self.run_dir, self.token = cfg, run_dir, token
        self.job = cfg.job
        self.adapter = cfg.adapter
        self.hardware = hardware_of(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "steps.jsonl").write_text("")
        # its first event's planning and pickling, warm before any step runs beside them (on a
        # machine whose cores the controller shares with the workers)
        pickle.dumps(rehearse(self.adapter))
        self.master, self.store_addr = make_store()
        self.store = protocol.run_store(self.master)
        worker = WorkerConfig(job=cfg.job, engine=cfg.engine, backend=cfg.backend, steps=cfg.steps, digest=cfg.digest, log_rank=cfg.log_rank, warm=cfg.warm,
                              transfer=cfg.transfer, prepare=cfg.prepare, checkpoint=cfg.checkpoint)
        bind = cfg.agent.bind_cores and cfg.backend == "gloo"
        self.agent = NodeAgent(run_dir, cfg.slots, {"store_addr": self.store_addr, "run_dir": str(run_dir),
                                                    "config": to_dict(worker)},
                               self.starter(cfg.backend, cfg.engine), quiet=cfg.agent.quiet,
                               cores=cores.per_slot(cfg.slots, cores.available()) if bind else None)
        self.queue: collections.deque[Event] = collections.deque(events)
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.gen = -1
        self.active: GenerationSpec | None = None
        self.slot_of: dict[int, int] = {}
        self.lost_slots: set[int] = set()
        self.phase = Phase.STABLE
        self.current: Handling | None = None  # the event being handled
        self.progress: Progress | None = None
        self.t_start: float | None = None
        self.interrupted = False  # the caller was interrupted (Ctrl-C): stop the job
        self.end_at = 0  # set when the job ends early (end_after_events)
        self.endpoint: ControlEndpoint | None = None
        self.started_at = time.time()
        self._last_phase_t = self.started_at
        self._hang_checked = 0.0

    def go(self, trigger: Trigger) -> None:
        """The one way the phase changes (``phases.TRANSITIONS``)."""
        self.phase = advance(self.phase, trigger)

    @property
    def finished(self) -> bool:
        return self.phase is Phase.ENDED

    @property
    def step(self) -> int:
        return self.progress.step if self.progress else 0

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        if self.cfg.controller.endpoint:
            self.endpoint = ControlEndpoint(self.submit, self.status, self.run_dir, token=self.token,
                                            queue=self.queued, withdraw=self.withdraw)
            logs.PHASES.info(f"control endpoint {self.endpoint.url} (token in {self.run_dir / 'control.json'})")
        try:
            parallel = self.cfg.parallel or target.choose(self.adapter, self.job, self.cfg.gpus, self.hardware)
            self._start_generation(parallel, slots=list(range(self.cfg.gpus)), load_from=None, kind="start")
            while not self.finished and not self.interrupted:
                # one round trip a tick once the key exists (it is never deleted)
                self.progress = read(self.store, Progress.KEY, Progress) if self.progress \
                    else read_if(self.store, Progress.KEY, Progress)
                if self.progress and self.t_start is None:
                    self.t_start = self.progress.time
                self._hung()
                for w in self.agent.poll():
                    self._exited(w)
                if not self.finished:
                    self.tick()
                    if self.phase is Phase.STABLE:
                        self._maybe_end()
                time.sleep(0.01)
        except KeyboardInterrupt:  # Ctrl-C in this thread: the job ends here, with its report
            self.interrupted = True
        finally:
            self.agent.shutdown()
            if self.endpoint is not None:
                self.endpoint.close()
        for rec in self.records:  # the state digest each recovery started from
            if rec.get("status") == "recovered":
                procs = list(GenerationSpec.fetch(self.store, rec["generation"]).procs)
                starts = self._collect(rec["generation"], procs, StartReport) or {}
                rec["digest_after"] = first(starts.values(), "digest_after")
                rec["digest_after_s"] = least(starts.values(), "digest_after_s")
        why = "interrupted (Ctrl-C)" if self.interrupted else "training ended"
        if self.current is not None:
            self.current.record["status"] = f"not completed: {why} in phase {self.phase.value}"
            self.records.append(self.current.record)
        for ev in self.queue:
            self.records.append({"event": ev.to_dict(), "status": f"not reached: {why}"})
        return {"mode": self.mode, "records": self.records, "wall_s": time.time() - self.started_at,
                "interrupted": self.interrupted}

    # ---- events --------------------------------------------------------------------------
    def submit(self, action: str) -> dict[str, Any]:
        """From the control endpoint: validate against the GPUs the job will have, then queue."""
        ev = parse_action(action.strip(), "http")
        ev.arrived = time.time()
        with self.lock:
            self.validate(ev, self._projected_gpus())
            self.queue.append(ev)
            return {"accepted": ev.describe(), "position": len(self.queue)}

    def queued(self) -> dict[str, Any]:
        """The events waiting, in the order they will be handled (the one in flight apart)."""
        with self.lock:
            return {"in_flight": self.current.event.describe() if self.current else None,
                    "queued": [{"position": i + 1, "event": ev.describe(), "source": ev.source}
                               for i, ev in enumerate(self.queue)]}

    def withdraw(self, position: int) -> dict[str, Any]:
        """From the control endpoint: take a queued event back (the one in flight cannot be)."""
        with self.lock:
            n_now = self.current.record["gpus"] if self.current else len(self.active.procs) if self.active \
                else self.cfg.gpus
            events = list(self.queue)
            rest = without(events, position, n_now, self.cfg.slots - len(self.lost_slots), self.adapter, self.job,
                           self.hardware)
            self.queue.clear()
            self.queue.extend(rest)
            gone = events[position - 1]
        self.records.append({"event": gone.to_dict(), "status": "withdrawn before it was handled"})
        return {"withdrawn": gone.describe(), "queued": len(rest)}

    def status(self) -> dict[str, Any]:
        return {"mode": self.mode, "phase": self.phase.value, "generation": self.gen,
                "parallel": to_dict(self.active.parallel) if self.active else None,
                "step": self.step, "queued": len(self.queue)}

    def _projected_gpus(self) -> int:
        n = len(self.active.procs) if self.active else self.cfg.gpus
        if self.current is not None:
            n = self.current.record["gpus"]
        for ev in self.queue:
            n = ev.gpus
        return n

    def validate(self, ev: Event, n_before: int) -> ParallelConfig:
        """Refuse (ValueError naming the field) what cannot be done; returns the target."""
        return admit(ev, n_before, self.cfg.slots - len(self.lost_slots), self.adapter, self.job, self.hardware)

    def _head_triggered(self) -> Event | None:
        if not self.queue:
            return None
        ev = self.queue[0]
        if ev.at_step is not None and self.step < ev.at_step:
            return None
        if ev.at_time is not None and (self.t_start is None or time.time() - self.t_start < ev.at_time):
            return None
        return ev

    def _refuse(self, ev: Event, e: ValueError) -> None:
        self.records.append({"event": ev.to_dict(), "status": f"refused: {e}"})
        self.phase_log("refused", event=ev.describe(), error=str(e))

    # ---- generations ---------------------------------------------------------------------
    def _handling(self, ev: Event) -> Handling:
        """The event's target, its processes and its record (refused: ValueError)."""
        old = self.active
        n_old = len(old.procs)
        tgt = self.validate(ev, n_old)
        old_layout, new_layout = self.adapter.layout(self.job, old.parallel), self.adapter.layout(self.job, tgt)
        if ev.kind == "reshape" and (new_layout.tp, new_layout.pp, new_layout.dp, new_layout.layers_per_stage) \
                == (old_layout.tp, old_layout.pp, old_layout.dp, old_layout.layers_per_stage):
            raise ValueError(f"{ev.source}: reshape {tgt.short()}: the job already runs {tgt.short()}")
        h = Handling(event=ev, record=new_record(ev, self._arrival(ev), old.parallel, tgt, old.generation, self.step),
                     target=tgt)
        if ev.kind == "scale-out":
            free = [s for s in self.agent.free_slots() if s not in self.lost_slots]
            if len(free) < ev.gpus - n_old:
                raise ValueError(f"{ev.source}: scale-out {ev.gpus}: only {len(free)} free slots")
            h.join_slots = free[: ev.gpus - n_old]
        elif ev.kind == "scale-in":
            by_slot = sorted(old.procs, key=lambda p: self.slot_of[p], reverse=True)
            h.leaving = by_slot[: n_old - ev.gpus]  # the most recently added slots go
        return h

    def _start_generation(self, parallel: ParallelConfig, slots: list[int], load_from: str | None,
                          kind: str) -> GenerationSpec:
        """Fresh processes for a whole generation (first start, restart, recovery)."""
        self.gen += 1
        procs = self.agent.new_proc_ids(len(slots))
        spec = GenerationSpec(generation=self.gen, parallel=parallel, procs=tuple(procs), load_from=load_from, kind=kind)
        spec.publish(self.store)
        self._wish()
        for p, s in zip(procs, slots):
            self.slot_of[p] = s
            self.agent.start(p, s, "start", self.gen)
        self.active = spec
        self.phase_log("generation", generation=self.gen, parallel=parallel.short(), kind=kind,
                       procs=procs, load_from=load_from)
        return spec

    def _wish(self, wanted: int = 0, stop_at: int = 0, force: int = 0) -> None:
        write(self.store, Wish.KEY, Wish(wanted=wanted, stop_at=stop_at, force=force, end_at=self.end_at))

    def _maybe_end(self) -> None:
        """Nothing left to do: end the job ``end_after_events`` steps from now, if asked."""
        n = self.cfg.controller.end_after_events
        if n is None or self.queue or self.current is not None or self.end_at \
                or not self.progress or self.progress.generation != self.active.generation:
            return
        self.end_at = self.progress.step + n
        self._wish()

    def phase_log(self, what: str, **kw: Any) -> None:
        """A structured line for a phase event (``liver.logs``): with the generation, how long the
        controller was in the phase it leaves, and the step the job is at."""
        now = time.time()
        logs.phase(what, **{"generation": self.gen, **kw, "step": self.step,
                            "since_last_s": round(now - self._last_phase_t, 4)})
        self._last_phase_t = now

    # ---- failures ------------------------------------------------------------------------
    def _hung(self) -> None:
        """Once a second: a live worker whose heartbeat is older than ``hang_timeout_s`` (or that
        never wrote one that long after it started) is killed; its exit is then a fail-stop."""
        limit, now = self.cfg.controller.hang_timeout_s, time.time()
        if not limit or now - self._hang_checked < 1.0:
            return
        self._hang_checked = now
        for w in self.agent.alive():
            key = beat_key(w.proc)
            last = float(self.store.get(key)) if self.store.check([key]) else w.started
            if now - last > limit:
                self.phase_log("hung", proc=w.proc, slot=w.slot, silent_s=round(now - last, 1))
                self.agent.kill(w.proc)
                self._exited(w)  # (the kill took its exit status: no later poll reports it)
                return

    def _exited(self, w: Worker) -> None:
        if self.finished:
            return
        if w.returncode == 0 or w.leaving:
            # the job's end: every rank of the Active World done, the last one to exit checks (a
            # rank marked to leave by a handoff that the end cut short may well be the last)
            if self.active and w.proc in self.active.procs and w.returncode == 0:
                codes = tuple(self.agent.workers[p].returncode for p in self.active.procs)
                if job_finished(EndState(step=self.step, steps=self.cfg.steps, end_at=self.end_at,
                                         active_exit_codes=codes)):
                    self.go(Trigger.END)
            return
        if self.active is not None and w.proc in self.active.procs:
            self._fail_stop([w])
        else:
            self._joiner_died(w)

    def _joiner_died(self, w: Worker) -> None:
        logs.PHASES.warning(f"process {w.proc} (slot {w.slot}, {w.role}) died: {self.agent.log_tail(w.proc, 300)!r}")

    def _fail_stop(self, dead: list[Worker], preempted: bool = False) -> None:
        """A rank vanished: stop everyone, restart from the latest checkpoint on the slots left.
        ``preempted``: the event in flight was a scale-in whose deadline passed; its GPUs are gone,
        so the recovery is its outcome (it is not queued again with a fresh deadline)."""
        t0 = time.time()
        old_generation = self.active.generation
        failed_step = self.step
        dead_slots = {w.slot for w in dead}
        self.lost_slots |= dead_slots
        survivors = [self.slot_of[p] for p in self.active.procs if self.slot_of[p] not in dead_slots]
        self.agent.stop_all()
        if not survivors:
            tails = "\n".join(f"--- process {w.proc} (slot {w.slot}), exit {w.returncode}:\n"
                              f"{self.agent.log_tail(w.proc, 1500)}" for w in dead)
            raise ControllerError("every process of the job died; nothing to recover on. Last words:\n" + tails)
        ck = latest(self.run_dir / "ckpt", verify=True)  # the newest whose files are whole
        n = len(survivors)
        old = self.active.parallel
        parallel = old if old.world_size == n else target.choose(self.adapter, self.job, n, self.hardware, current=old)
        if self.current is not None:  # the event in flight: re-queued if it still applies
            ev = self.current.event
            try:
                if preempted:
                    raise ValueError("its deadline passed")
                self.validate(ev, n)
                self.current.record["status"] = "interrupted by a fail-stop; re-queued"
                self.queue.appendleft(ev)
            except ValueError:
                self.current.record["status"] = ("deadline missed: the leaving processes were stopped at the deadline "
                                                  "and the job recovered on the others" if preempted else
                                                  "superseded by the fail-stop recovery")
            self.records.append(self.current.record)
            self.current = None
        self.go(Trigger.FAIL_STOP)
        self._start_generation(parallel, sorted(survivors), ck["path"] if ck else None, "recover")
        rec = {"event": {"kind": "fail-stop", "source": f"process {[w.proc for w in dead]} exited "
                         f"{[w.returncode for w in dead]}"},
               "status": "recovered", "generation": self.gen, "old_generation": old_generation,
               "old": old.short(), "new": parallel.short(),
               "failed_at_step": failed_step, "restored_step": ck["step"] if ck else 0,
               "lost_steps": failed_step - (ck["step"] if ck else 0), "checkpoint": ck["path"] if ck else None,
               "lost_slots": sorted(dead_slots), "t_event": t0,
               # what the dead processes said last (a traceback's final line, where there was one)
               "last_words": {w.proc: _last_line(self.agent.log_tail(w.proc, 2000)) for w in dead}}
        self.records.append(rec)
        self.phase_log("fail-stop", **{k: rec[k] for k in ("failed_at_step", "restored_step", "lost_steps", "new",
                                                          "last_words")})

    # ---- event records -------------------------------------------------------------------
    def _arrival(self, ev: Event) -> float:
        """When the event reached the job: a notice's deadline counts from here, even if the event
        waited behind another one (the provider does not wait)."""
        if ev.arrived is not None:
            return ev.arrived
        if ev.at_time is not None and self.t_start is not None:
            return self.t_start + ev.at_time
        return time.time()

    def _close(self, status: str, trigger: Trigger) -> None:
        h = self.current
        rec = h.record
        rec["status"] = status
        rec["t_done"] = time.time()
        # the controller loop's CPU time from the event to its end (its routine polling included)
        rec["controller_cpu_s"] = time.thread_time() - h.cpu0
        self.records.append(rec)
        self.current = None
        self.go(trigger)

    def _collect(self, g: int, procs: list[int], cls: type[M]) -> dict[int, M] | None:
        """Every process's report of generation ``g`` (a ``cls``), or None while any is missing."""
        keys = [cls.key(g, p) for p in procs]
        if not self.store.check(keys):  # one round trip while they are not all there
            return None
        return {p: read(self.store, k, cls) for p, k in zip(procs, keys)}


__all__ = ["Controller", "ControllerError", "forked_workers"]
