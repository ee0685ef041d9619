"""The controller of ``liver run``: owns the job's store, the node agent and the event queue, and runs
the generation state machine

    Stable -> Prepare -> Ready -> Switch -> Cleanup -> Stable        (LiveController)
    Stable -> Stop (DCP save) -> Start (new processes, DCP load)      (RestartController)

one event at a time, with monotonic generation ids and at most two generations alive. Workers
learn its wishes through the store (runtime/protocol.py); it learns their progress the same way.
A worker that dies without notice while in the Active World is a fail-stop: every process is
stopped and the job restarts from the latest periodic checkpoint on the slots it still has.
"""

from __future__ import annotations

import collections
import json
import pickle
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from liver.agent import cores
from liver.agent.interpreter import FreshInterpreters
from liver.agent.priority import background
from liver.agent.node import NodeAgent, Starter, Worker
from liver.agent.zygote import ForkedWorkers
from liver.checkpoint.periodic import latest
from liver.controller import target
from liver.controller.admission import admit, hardware_of
from liver.controller.endpoint import ControlEndpoint
from liver.controller.events import Event, EventError, parse_action
from liver.engine.trainer import state_specs
from liver.planner.plan import plan_transfer
from liver.runtime import protocol
from liver.runtime.companion import rehearse
from liver.runtime.protocol import GenerationSpec, get, publish_plan, put
from liver.config import RunConfig
from liver.config.fields import to_dict
from liver.protocol.worker import WorkerConfig
from liver.topology import Layout, ParallelConfig
from liver.world.world import make_store


class ControllerError(RuntimeError):
    pass


def _least(records, key: str) -> float:
    """A check's cost on the critical path: every rank runs it together (a collective), so the
    shortest time is the check itself; longer ones include waiting for the others to arrive."""
    return min((r[key] for r in records if key in r), default=0.0)


def forked_workers(backend: str, joiners: bool) -> ForkedWorkers:
    """Workers forked from the agent's zygote (and cold ``joiners`` from one at idle priority):
    their imports were done before they were needed (a CPU training step rehearsed too, for CPU
    workers; GPU workers make their own CUDA context after the fork)."""
    return ForkedWorkers(cpu_step=backend == "gloo", joiners=joiners)


class Controller:
    mode = "base"

    def starter(self, backend: str) -> Starter:
        """How this mode's node agent makes worker processes."""
        raise NotImplementedError

    def __init__(self, cfg: RunConfig, events: list[Event], run_dir: Path,
                 log: Callable[[str], None] = print, token: str | None = None) -> None:
        """``cfg`` with its slots set (``RunConfig.with_slots``); ``token``: the control endpoint's
        (default: a random one, in the run's control.json)."""
        self.cfg, self.run_dir, self.log, self.token = cfg, run_dir, log, token
        self.job = cfg.job
        self.hardware = hardware_of(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "steps.jsonl").write_text("")
        # its first event's planning and pickling, warm before any step runs beside them (on a
        # machine whose cores the controller shares with the workers)
        pickle.dumps(rehearse())
        self.master, self.store_addr = make_store()
        self.store = protocol.run_store(self.master)
        worker = WorkerConfig(job=cfg.job, backend=cfg.backend, steps=cfg.steps, digest=cfg.digest, warm=cfg.warm,
                              transfer=cfg.transfer, prepare=cfg.prepare, checkpoint=cfg.checkpoint)
        bind = cfg.agent.bind_cores and cfg.backend == "gloo"
        self.agent = NodeAgent(run_dir, cfg.slots, {"store_addr": self.store_addr, "run_dir": str(run_dir),
                                                    "config": to_dict(worker)},
                               self.starter(cfg.backend), quiet=cfg.agent.quiet,
                               cores=cores.per_slot(cfg.slots, cores.available()) if bind else None)
        self.queue: collections.deque[Event] = collections.deque(events)
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.gen = -1
        self.active: GenerationSpec | None = None
        self.slot_of: dict[int, int] = {}
        self.lost_slots: set[int] = set()
        self.phase = "stable"
        self.current: dict[str, Any] | None = None  # the event being handled
        self.progress: dict[str, Any] | None = None
        self.t_start: float | None = None
        self.finished = False
        self.interrupted = False  # the caller was interrupted (Ctrl-C): stop the job
        self.end_at = 0  # set when the job ends early (end_after_events)
        self.endpoint: ControlEndpoint | None = None
        self.started_at = time.time()

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        if self.cfg.controller.endpoint:
            self.endpoint = ControlEndpoint(self.submit, self.status, self.run_dir, token=self.token)
            self.log(f"control endpoint {self.endpoint.url} (token in {self.run_dir / 'control.json'})")
        try:
            parallel = self.cfg.parallel or target.choose(self.job, self.cfg.gpus, self.hardware)
            self._start_generation(parallel, slots=list(range(self.cfg.gpus)), load_from=None, kind="start")
            while not self.finished and not self.interrupted:
                # one round trip a tick once the key exists (it is never deleted)
                self.progress = json.loads(self.store.get("progress")) if self.progress \
                    else get(self.store, "progress", self.progress)
                if self.progress and self.t_start is None:
                    self.t_start = self.progress["time"]
                for w in self.agent.poll():
                    self._exited(w)
                if not self.finished:
                    self.tick()
                    if self.phase == "stable":
                        self._maybe_end()
                time.sleep(0.01)
        finally:
            self.agent.shutdown()
            if self.endpoint is not None:
                self.endpoint.close()
        for rec in self.records:  # the state digest each recovery started from
            if rec.get("status") == "recovered":
                starts = self._collect(rec["generation"], self.agent_procs_of(rec["generation"])) or {}
                rec["digest_after"] = next((r.get("digest_after") for r in starts.values()), None)
                rec["digest_after_s"] = _least(starts.values(), "digest_after_s")
        if self.current is not None:
            self.current["status"] = f"not completed: training ended in phase {self.phase}"
            self.records.append(self.current)
        for ev in self.queue:
            self.records.append({"event": ev.to_dict(), "status": "not reached: training ended"})
        return {"mode": self.mode, "records": self.records, "wall_s": time.time() - self.started_at}

    def tick(self) -> None:
        raise NotImplementedError

    def agent_procs_of(self, generation: int) -> list[int]:
        return GenerationSpec.fetch(self.store, generation).procs

    # ---- events --------------------------------------------------------------------------
    def submit(self, action: str) -> dict[str, Any]:
        """From the control endpoint: validate against the GPUs the job will have, then queue."""
        ev = parse_action(action.strip(), "http")
        ev.arrived = time.time()
        with self.lock:
            n = self._projected_gpus()
            self.validate(ev, n)
            self.queue.append(ev)
            return {"accepted": ev.describe(), "position": len(self.queue)}

    def status(self) -> dict[str, Any]:
        return {"mode": self.mode, "phase": self.phase, "generation": self.gen,
                "parallel": self.active.parallel if self.active else None,
                "step": self.progress["step"] if self.progress else 0, "queued": len(self.queue)}

    def _projected_gpus(self) -> int:
        n = len(self.active.procs) if self.active else self.cfg.gpus
        if self.current is not None:
            n = self.current["gpus"]
        for ev in self.queue:
            n = ev.gpus
        return n

    def validate(self, ev: Event, n_before: int) -> ParallelConfig:
        """Refuse (ValueError naming the field) what cannot be done; returns the target."""
        return admit(ev, n_before, self.cfg.slots - len(self.lost_slots), self.job, self.hardware)

    def _head_triggered(self) -> Event | None:
        if not self.queue:
            return None
        ev = self.queue[0]
        step = self.progress["step"] if self.progress else 0
        if ev.at_step is not None and step < ev.at_step:
            return None
        if ev.at_time is not None and (self.t_start is None or time.time() - self.t_start < ev.at_time):
            return None
        return ev

    # ---- generations ---------------------------------------------------------------------
    def _plan(self, ev: Event) -> dict[str, Any]:
        """Target, processes and placement of the event's generation (refused: ValueError)."""
        old = self.active
        n_old = len(old.procs)
        tgt = self.validate(ev, n_old)
        old_layout = Layout(self.job.model, ParallelConfig.from_dict(old.parallel), self.job.train)
        new_layout = Layout(self.job.model, tgt, self.job.train)
        if ev.kind == "reshape" and (new_layout.tp, new_layout.pp, new_layout.dp, new_layout.layers_per_stage) \
                == (old_layout.tp, old_layout.pp, old_layout.dp, old_layout.layers_per_stage):
            raise EventError(f"{ev.source}: reshape {tgt.short()}: the job already runs {tgt.short()}")
        leaving: list[int] = []
        join_slots: list[int] = []
        if ev.kind == "scale-out":
            free = [s for s in self.agent.free_slots() if s not in self.lost_slots]
            if len(free) < ev.gpus - n_old:
                raise EventError(f"{ev.source}: scale-out {ev.gpus}: only {len(free)} free slots")
            join_slots = free[: ev.gpus - n_old]
        elif ev.kind == "scale-in":
            by_slot = sorted(old.procs, key=lambda p: self.slot_of[p], reverse=True)
            leaving = by_slot[: n_old - ev.gpus]  # the most recently added slots go
        return {"target": tgt, "old_layout": old_layout, "new_layout": new_layout,
                "leaving": leaving, "join_slots": join_slots}

    def _start_generation(self, parallel: ParallelConfig, slots: list[int], load_from: str | None,
                          kind: str) -> GenerationSpec:
        """Fresh processes for a whole generation (first start, restart, recovery)."""
        self.gen += 1
        procs = self.agent.new_proc_ids(len(slots))
        spec = GenerationSpec(generation=self.gen, parallel=parallel.to_dict(), procs=procs,
                              load_from=load_from, kind=kind)
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
        put(self.store, "ctl", {"wanted": wanted, "stop_at": stop_at, "force": force,
                                "end_at": self.end_at})

    def _maybe_end(self) -> None:
        """Nothing left to do: end the job ``end_after_events`` steps from now, if asked."""
        n = self.cfg.controller.end_after_events
        if n is None or self.queue or self.current is not None or self.end_at \
                or not self.progress or self.progress["generation"] != self.active.generation:
            return
        self.end_at = self.progress["step"] + n
        self._wish()

    def phase_log(self, what: str, **kw: Any) -> None:
        self.log("[liver] " + json.dumps({"what": what, **kw}))

    # ---- failures ------------------------------------------------------------------------
    def _exited(self, w: Worker) -> None:
        if w.returncode == 0 or w.leaving:
            # the job's end: every rank of the Active World done, the last one to exit checks (a
            # rank marked to leave by a handoff that the end cut short may well be the last)
            if self.active and w.proc in self.active.procs and w.returncode == 0:
                step = self.progress["step"] if self.progress else 0
                if step >= min(self.cfg.steps, self.end_at or self.cfg.steps) and all(
                        self.agent.workers[p].returncode == 0 for p in self.active.procs):
                    self.finished = True
            return
        if self.active is not None and w.proc in self.active.procs:
            self._fail_stop([w])
        else:
            self._joiner_died(w)

    def _joiner_died(self, w: Worker) -> None:
        self.log(f"[liver] process {w.proc} (slot {w.slot}, {w.role}) died: {self.agent.log_tail(w.proc, 300)!r}")

    def _fail_stop(self, dead: list[Worker]) -> None:
        """A rank vanished: stop everyone, restart from the latest checkpoint on the slots left."""
        t0 = time.time()
        old_generation = self.active.generation
        failed_step = self.progress["step"] if self.progress else 0
        dead_slots = {w.slot for w in dead}
        self.lost_slots |= dead_slots
        survivors = [self.slot_of[p] for p in self.active.procs if self.slot_of[p] not in dead_slots]
        self.agent.stop_all()
        if not survivors:
            tails = "\n".join(f"--- process {w.proc} (slot {w.slot}), exit {w.returncode}:\n"
                              f"{self.agent.log_tail(w.proc, 1500)}" for w in dead)
            raise ControllerError("every process of the job died; nothing to recover on. Last words:\n" + tails)
        ck = latest(self.run_dir / "ckpt")
        n = len(survivors)
        old = ParallelConfig.from_dict(self.active.parallel)
        parallel = old if old.world_size == n else target.choose(self.job, n, self.hardware, current=old)
        if self.current is not None:  # the event in flight: re-queued if it still applies
            ev = self.current["_event"]
            try:
                self.validate(ev, n)
                self.current["status"] = "interrupted by a fail-stop; re-queued"
                self.queue.appendleft(ev)
            except ValueError:
                self.current["status"] = "superseded by the fail-stop recovery"
            self.records.append(self.current)
            self.current = None
        self.phase = "stable"
        self._start_generation(parallel, sorted(survivors), ck["path"] if ck else None, "recover")
        rec = {"event": {"kind": "fail-stop", "source": f"process {[w.proc for w in dead]} exited "
                         f"{[w.returncode for w in dead]}"},
               "status": "recovered", "generation": self.gen, "old_generation": old_generation,
               "old": old.short(), "new": parallel.short(),
               "failed_at_step": failed_step, "restored_step": ck["step"] if ck else 0,
               "lost_steps": failed_step - (ck["step"] if ck else 0), "checkpoint": ck["path"] if ck else None,
               "lost_slots": sorted(dead_slots), "t_event": t0}
        self.records.append(rec)
        self.phase_log("fail-stop", **{k: rec[k] for k in ("failed_at_step", "restored_step", "lost_steps", "new")})

    # ---- event records -------------------------------------------------------------------
    def _arrival(self, ev: Event) -> float:
        """When the event reached the job: a notice's deadline counts from here, even if the event
        waited behind another one (the provider does not wait)."""
        if ev.arrived is not None:
            return ev.arrived
        if ev.at_time is not None and self.t_start is not None:
            return self.t_start + ev.at_time
        return time.time()

    def _new_record(self, ev: Event, plan: dict[str, Any]) -> dict[str, Any]:
        arrived = self._arrival(ev)
        return {"_event": ev, "_cpu0": time.thread_time(), "event": ev.to_dict(), "status": "started", "gpus": ev.gpus,
                "arrived": arrived,
                "deadline_at": arrived + ev.deadline_s if ev.deadline_s is not None else None,
                "old": ParallelConfig.from_dict(self.active.parallel).short(),
                "new": plan["target"].short(), "old_generation": self.active.generation,
                "t_event": time.time(), "step_at_event": self.progress["step"] if self.progress else 0}

    def _close(self, status: str) -> None:
        rec = self.current
        rec["status"] = status
        rec["t_done"] = time.time()
        # the controller loop's CPU time from the event to its end (its routine polling included)
        rec["controller_cpu_s"] = time.thread_time() - rec.pop("_cpu0")
        self.records.append(rec)
        self.current = None
        self.phase = "stable"

    def _collect(self, g: int, procs: list[int], prefix: str = "switch") -> dict[int, dict[str, Any]] | None:
        keys = [f"{prefix}/{g}/{p}" for p in procs]
        if not self.store.check(keys):  # one round trip while they are not all there
            return None
        return {p: get(self.store, k) for p, k in zip(procs, keys)}


class LiveController(Controller):
    """Live handoffs: joiners warm up on a mock world, companions build the Shadow World, the switch
    streams the state at the first iteration boundary after Ready."""

    mode = "live"

    def starter(self, backend: str) -> Starter:
        return forked_workers(backend, joiners=True)

    def run(self) -> dict[str, Any]:
        """The loop in a thread of its own at idle CPU priority: on a node whose cores the ranks
        keep busy, its polling and planning take only the time they leave (the store it serves
        runs in a thread made before, at normal priority). The caller's thread keeps its own."""
        box: dict[str, Any] = {}

        def loop() -> None:
            background()
            try:
                box["report"] = Controller.run(self)
            except BaseException as e:  # raised again in the caller's thread
                box["error"] = e

        t = threading.Thread(target=loop, name="liver-controller")
        t.start()
        try:
            while t.is_alive():
                t.join(0.2)
        except KeyboardInterrupt:
            self.interrupted = True  # the loop ends, stopping the workers
            t.join()
            raise
        if "error" in box:
            raise box["error"]
        return box["report"]

    def tick(self) -> None:
        if self.phase == "stable":
            with self.lock:
                ev = self._head_triggered()
                if ev is not None:
                    self.queue.popleft()
            if ev is not None:
                self._begin(ev)
        elif self.phase in ("prepare", "ready"):
            self._notice_during_prepare()
            if self.phase in ("prepare", "ready"):
                self._watch_prepare()
        elif self.phase == "cleanup":
            self._watch_cleanup()

    def _notice_during_prepare(self) -> None:
        """A preemption notice must not wait behind a scale-out that has not switched yet: the
        pending scale-out is re-planned to the smaller total (or dropped, and the scale-in goes
        first). Nothing was committed, so nothing is lost."""
        with self.lock:
            head = self._head_triggered()
            if head is None or head.kind != "scale-in" or self.current is None \
                    or self.current["_event"].kind != "scale-out":
                return
            self.queue.popleft()
        rec, n_active = self.current, len(self.active.procs)
        notice = {"event": head.to_dict(), "arrived": self._arrival(head), "t_event": time.time()}
        if not self._drop_pending():  # the handoff went through meanwhile: the notice is next
            with self.lock:
                self.queue.appendleft(head)
            return
        if head.gpus > n_active:  # still a scale-out, to fewer GPUs
            ev: Event = rec["_event"]
            ev.gpus, ev.parallel = head.gpus, head.parallel
            self.records.append({**notice, "status": f"merged into the pending scale-out (now to {head.gpus})"})
            self._cancel(f"scale-in notice to {head.gpus} GPUs", replan=True)
            return
        self._cancel(f"scale-in notice to {head.gpus} GPUs", replan=False)
        if head.gpus < n_active:
            self._begin(head)
        else:
            self.records.append({**notice, "status": "done: the job already has that many GPUs once the pending "
                                 "scale-out is dropped"})

    def _begin(self, ev: Event) -> None:
        if ev.kind == "scale-out":
            self.lost_slots.clear()  # the event reports capacity: slots lost earlier may be back
        try:
            plan = self._plan(ev)
        except ValueError as e:
            self.records.append({"event": ev.to_dict(), "status": f"refused: {e}"})
            self.phase_log("refused", event=ev.describe(), error=str(e))
            return
        self.current = self._new_record(ev, plan)
        self._launch(plan)

    def _launch(self, plan: dict[str, Any]) -> None:
        old = self.active
        joiners = self.agent.new_proc_ids(len(plan["join_slots"]))
        for p, s in zip(joiners, plan["join_slots"]):
            self.slot_of[p] = s
        new_procs = [p for p in old.procs if p not in plan["leaving"]] + joiners
        t0 = time.perf_counter()
        tp = plan_transfer(plan["old_layout"], plan["new_layout"], state_specs(self.job), old.procs, new_procs)
        self.gen += 1
        spec = GenerationSpec(generation=self.gen, parallel=plan["target"].to_dict(), procs=tp.placement,
                              old_generation=old.generation, old_parallel=old.parallel,
                              old_procs=old.procs, kind=self.current["event"]["kind"])
        publish_plan(self.store, self.gen, tp)  # before the spec: a worker that sees one finds both
        spec.publish(self.store)
        rec = self.current
        rec.update(generation=self.gen, plan_s=time.perf_counter() - t0, bytes_moved=tp.bytes_moved,
                   bytes_moved_identity_placement=tp.bytes_moved_identity,
                   max_rank_bytes_in=max(tp.rank_bytes_in.values(), default=0),
                   max_rank_bytes_out=max(tp.rank_bytes_out.values(), default=0),
                   joiners=joiners, leaving=plan["leaving"], procs=tp.placement)
        rec.setdefault("attempts", []).append({"generation": self.gen, "t": time.time(), "joiners": joiners})
        for p in joiners:
            self.agent.start(p, self.slot_of[p], "joiner", self.gen)
        for p in plan["leaving"]:
            self.agent.workers[p].leaving = True
        self.pending = spec
        self.members = sorted(set(old.procs) | set(tp.placement))
        self._wish(wanted=self.gen)
        self.phase = "prepare"
        self.phase_log("prepare", generation=self.gen, event=self.current["event"]["kind"],
                       old=rec["old"], new=rec["new"], joiners=joiners, leaving=plan["leaving"],
                       bytes_moved=tp.bytes_moved)

    def _watch_prepare(self) -> None:
        rec, g, now = self.current, self.pending.generation, time.time()
        if self.phase == "prepare":
            if self.store.check([f"ready/{g}/{p}" for p in self.members]):  # one round trip
                rec["t_ready"] = now
                rec["prepare_s"] = now - rec["attempts"][-1]["t"]
                self.phase = "ready"
                self.phase_log("ready", generation=g, prepare_s=round(rec["prepare_s"], 4))
            elif now - rec["attempts"][-1]["t"] > self.cfg.controller.prepare_timeout_s:
                if self._drop_pending():
                    return self._cancel(f"not ready after {self.cfg.controller.prepare_timeout_s:g} s", replan=False)
                return  # it went through meanwhile (collected)
        ev: Event = rec["_event"]
        if ev.deadline_s is not None:
            left = rec["deadline_at"] - now
            if left < max(0.25 * ev.deadline_s, self._expected_handoff_s(rec)) and not rec.get("forced"):
                rec["forced"] = True  # the fastest safe path: finish preparing in the foreground
                self._wish(wanted=g, force=g)
                self.phase_log("deadline-near", generation=g, seconds_left=round(left, 3))
            if left < 0:
                rec["deadline_met"] = False
                for p in rec["leaving"]:  # the provider takes the GPUs now
                    if self.agent.workers[p].returncode is None:
                        self.agent.workers[p].leaving = False
                        self.agent.kill(p)
                        self.phase_log("preempted", proc=p)
                        return self._fail_stop([self.agent.workers[p]])
        if self.phase == "ready":  # (no process switches before all are ready)
            done = self._collect(g, self.pending.procs)
            if done is not None:
                self._switched(done)

    def _expected_handoff_s(self, rec: dict[str, Any]) -> float:
        """Time a handoff without cold processes took before (prepare + switch); 1 s if none yet."""
        past = [r["prepare_s"] + r["switch_s"] for r in self.records
                if r.get("status") == "done" and not r.get("joiners") and "switch_s" in r]
        return max(past) if past else 1.0

    def _switched(self, done: dict[int, dict[str, Any]]) -> None:
        rec = self.current
        old_procs = [p for p in self.members if p not in self.pending.procs]
        leavers = {p: get(self.store, f"switch/{self.pending.generation}/{p}") for p in old_procs}
        allrec = {**done, **{p: r for p, r in leavers.items() if r}}
        # the pause is the old ranks' (a joiner's switch also counts its wait for them to arrive)
        olds = [r for r in allrec.values() if "old_step" in r] or list(allrec.values())
        rec["switch_s"] = max(r["transfer"]["switch_s"] for r in olds)
        rec["transfer_s"] = max(r["transfer"]["seconds"] for r in allrec.values())
        rec["peak_staging_bytes"] = max(r["transfer"]["peak_staging_bytes"] for r in allrec.values())
        if any("peak_extra_bytes" in r for r in allrec.values()):
            rec["peak_extra_bytes"] = max(r.get("peak_extra_bytes", 0) for r in allrec.values())
        rec["switch_start"] = min(r["switch_start"] for r in olds)
        rec["switch_end"] = max(r["switch_end"] for r in allrec.values())
        rec["digest_after"] = next((r["digest_after"] for r in done.values() if "digest_after" in r), None)
        rec["digest_after_s"] = _least(done.values(), "digest_after_s")
        rec["digest_before"] = next((r["digest_before"] for r in allrec.values() if "digest_before" in r), None)
        rec["digest_before_s"] = _least(allrec.values(), "digest_before_s")
        rec["mock_warmup_s"] = max((r["prepare"].get("mock_warmup_s", 0.0) for r in done.values()), default=0.0)
        rec["joiner_cpu_s"] = max((r["prepare"].get("joiner_cpu_s", 0.0) for r in done.values()), default=0.0)
        rec["groups_s"] = max((r["prepare"].get("groups_s", 0.0) for r in allrec.values()), default=0.0)
        # the preparation's own CPU time on the busiest training process (the companion thread's,
        # and the warm-up's where it ran at a boundary): what Prepare takes from the running steps
        rec["prepare_cpu_s"] = max((r["prepare"].get("build_cpu_s", 0.0) + r["prepare"].get("warm_cpu_s", 0.0)
                                    for r in allrec.values() if "old_step" in r), default=0.0)
        rec["prepare_by_proc"] = {p: r["prepare"] for p, r in allrec.items()}  # each process's phases
        # communicators each process made for the new generation, and took over from the Active World
        rec["comms_created"] = {p: r["prepare"].get("comms_created") for p, r in allrec.items()}
        rec["comms_shared"] = {p: r["prepare"].get("comms_shared") for p, r in allrec.items()}
        if rec["_event"].deadline_s is not None:
            rec["deadline_met"] = rec["switch_end"] <= rec["deadline_at"]
        self.active = self.pending
        self.phase = "cleanup"
        self.phase_log("switch", generation=self.active.generation, switch_s=round(rec["switch_s"], 4),
                       transfer_s=round(rec["transfer_s"], 4))

    def _watch_cleanup(self) -> None:
        rec = self.current
        leaving = [self.agent.workers[p] for p in rec["leaving"]]
        if all(w.returncode is not None for w in leaving) or time.time() - rec["switch_end"] > 30:
            for w in leaving:
                self.agent.kill(w.proc)
            self._close("done")
            self.phase_log("cleanup", generation=self.active.generation)

    def _joiner_died(self, w: Worker) -> None:
        super()._joiner_died(w)
        rec = self.current
        if rec is None or self.phase not in ("prepare", "ready") or w.proc not in self.pending.procs:
            return
        self.lost_slots.add(w.slot)
        self._cancel(f"joiner {w.proc} (slot {w.slot}) died during Prepare", replan=True)

    SETTLE_TIMEOUT_S = 30.0

    def _drop_pending(self) -> bool:
        """Withdraw the pending generation and wait until the ranks have passed a boundary that
        read the withdrawal: every rank switches when all are ready and it is still wanted, without
        asking, so a handoff may be in flight right now, with the joiners among its members. True:
        dropped (no handoff can start any more; its joiners may be stopped); False: the ranks
        switched to it meanwhile (its records are collected as for any switch)."""
        g, old = self.pending.generation, self.active.generation
        self._wish()
        # the last step reported now: the boundary after the next step reads the withdrawal
        seen = (get(self.store, "progress") or {"step": 0})["step"]
        end = time.time() + self.SETTLE_TIMEOUT_S
        while time.time() < end:
            done = self._collect(g, self.pending.procs)
            if done is not None:
                rec = self.current
                if "t_ready" not in rec:  # it went through before this loop saw every ready key
                    rec["t_ready"] = max(get(self.store, f"ready/{g}/{p}") for p in self.members)
                    rec["prepare_s"] = rec["t_ready"] - rec["attempts"][-1]["t"]
                self.phase = "ready"
                self._switched(done)
                return False
            p = get(self.store, "progress")
            if p is not None and p["generation"] == old and p["step"] >= seen + 2:
                return True
            time.sleep(0.005)  # (switched, or switching: its records follow)
        return True  # training is not moving (a rank died: the fail-stop path takes over)

    def _cancel(self, why: str, replan: bool) -> None:
        """The pending generation went stale: drop it (the Active World never changed) and re-plan.
        Only once ``_drop_pending`` said no handoff to it is in flight (or a joiner died)."""
        rec = self.current
        self._wish()
        for p in rec["joiners"]:
            self.agent.kill(p)
        for p in rec["leaving"]:
            self.agent.workers[p].leaving = False
        rec["attempts"][-1]["cancelled"] = why
        self.phase_log("cancelled", generation=self.pending.generation, why=why)
        ev: Event = rec["_event"]
        if replan and ev.kind == "scale-out":
            usable = self.cfg.slots - len(self.lost_slots)
            ev.gpus = min(ev.gpus, usable)
            if ev.parallel is not None and ev.parallel.world_size != ev.gpus:
                ev.parallel = None  # the named configuration no longer fits: the controller chooses
        try:
            if not replan:
                raise EventError(why)
            plan = self._plan(ev)
        except ValueError as e:
            self._close(f"cancelled: {why}; {e}")
            return
        rec["new"], rec["gpus"] = plan["target"].short(), ev.gpus
        self._launch(plan)


class RestartController(Controller):
    """The baseline: each event by stop (DCP save at a boundary), new processes, DCP load. New
    processes as torchrun starts them: fresh interpreters (boot, imports, first use)."""

    mode = "restart"

    def starter(self, backend: str) -> Starter:
        return FreshInterpreters()

    def tick(self) -> None:
        if self.phase == "stable":
            with self.lock:
                head = self.queue[0] if self.queue else None
                step = self.progress["step"] if self.progress else 0
                if head is not None and head.at_step is not None and head.at_step > step \
                        and not head.announced:
                    # a step trigger is known ahead: stop exactly after that step
                    self._wish(stop_at=head.at_step)
                    head.announced = True
                ev = self._head_triggered()
                if ev is not None:
                    self.queue.popleft()
            if ev is not None:
                self._begin(ev)
        elif self.phase == "stop":
            self._watch_stop()
        elif self.phase == "start":
            self._watch_start()

    def _begin(self, ev: Event) -> None:
        try:
            plan = self._plan(ev)
        except ValueError as e:
            self._wish()
            self.records.append({"event": ev.to_dict(), "status": f"refused: {e}"})
            self.phase_log("refused", event=ev.describe(), error=str(e))
            return
        self.current = self._new_record(ev, plan)
        self.current["plan"] = plan
        if not ev.announced:
            step = self.progress["step"] if self.progress else 0
            self._wish(stop_at=step + 1)
        for p in plan["leaving"]:
            self.agent.workers[p].leaving = True
        self.phase = "stop"
        self.phase_log("stop", event=ev.kind, old=self.current["old"], new=self.current["new"])

    def _watch_stop(self) -> None:
        g = self.active.generation
        saved = get(self.store, f"saved/{g}")
        if saved is None or any(self.agent.workers[p].returncode is None for p in self.active.procs):
            return
        rec, plan = self.current, self.current["plan"]
        stops = self._collect(g, self.active.procs, "stopped") or {}
        rec["save_s"] = max((r["save_s"] for r in stops.values()), default=0.0)
        rec["digest_before"] = next((r["digest_before"] for r in stops.values() if "digest_before" in r), None)
        rec["digest_before_s"] = _least(stops.values(), "digest_before_s")
        rec["stopped_at"] = time.time()
        rec["checkpoint"] = saved["path"]
        slots = [self.slot_of[p] for p in self.active.procs if p not in plan["leaving"]] + plan["join_slots"]
        self._start_generation(plan["target"], sorted(slots), saved["path"], "restart")
        rec["generation"] = self.gen
        self.phase = "start"

    def _watch_start(self) -> None:
        done = self._collect(self.gen, self.active.procs)
        if done is None:
            return
        rec = self.current
        rec["digest_after"] = next((r["digest_after"] for r in done.values() if "digest_after" in r), None)
        rec["digest_after_s"] = _least(done.values(), "digest_after_s")
        rec["process_start_s"] = max(r["imported"] for r in done.values()) - rec["stopped_at"]
        rec["group_init_s"] = max(r["timings"]["group_init_s"] for r in done.values())
        rec["load_s"] = max(r["timings"].get("load_s", 0.0) + r["timings"]["build_s"] for r in done.values())
        if rec["_event"].deadline_s is not None:
            rec["deadline_met"] = rec["stopped_at"] <= rec["deadline_at"]
        # every new process has loaded it: the handoff checkpoint is not needed any more (one
        # model's state on disk at a time; off the critical path)
        threading.Thread(target=shutil.rmtree, args=(rec["checkpoint"],), kwargs={"ignore_errors": True},
                         daemon=True).start()
        del rec["plan"]
        self._close("done")
        self.phase_log("start", generation=self.gen, load_s=round(rec["load_s"], 4))


class ForkedRestartController(RestartController):
    """The baseline given the agent's zygote too: its new processes are forked from a template
    that imported everything once, so a restart pays no interpreter boot and imports."""

    mode = "restart-forked"

    def starter(self, backend: str) -> Starter:
        return forked_workers(backend, joiners=False)


CONTROLLERS = {"live": LiveController, "restart": RestartController, "restart-forked": ForkedRestartController}
