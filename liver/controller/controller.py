"""The controller of ``liver run``: owns the job's store, the node agent and the event queue;
starts whole generations; learns the workers' progress. Its components: the mode (a strategy,
``mode.py``: how an event is carried out, live or by restart), the events waiting (``queue.py``),
the failures (``failures.py``: exits, hangs, the fail-stop), the membership of its nodes, the
suspension, the journal.

One event at a time, monotonic generation ids, at most two generations alive. Workers learn its
wishes through the store (``liver.protocol``); it learns their progress the same way. A worker
that dies without notice while in the Active World is a fail-stop: every process is stopped and
the job restarts from the latest periodic checkpoint on the slots it still has.
"""

from __future__ import annotations

import collections
from dataclasses import replace
import pickle
import threading
import time
from pathlib import Path
from typing import Any

from liver import logs
from liver.host import cores
from liver.agent.node import NodeAgent
from liver.controller.metrics import Metrics
from liver.controller.membership import Membership
from liver.controller.suspension import Suspension
from liver.controller.failures import ControllerError, Failures
from liver.controller.queue import EventQueue
from liver.controller.mode import Mode
from liver.controller.modes import MODES
from liver.controller.nodes import Node, Nodes, RemoteNode
from liver.agent import starters
from liver.checkpoint.periodic import saved_step
from liver.config import RunConfig
from liver.config.fields import from_dict, to_dict
from liver.controller import journal, storehost
from liver.controller.report import read_steps
from liver.policy import target
from liver.controller.admission import admit, hardware_of
from liver.controller.endpoint import ControlEndpoint, new_token
from liver.controller.watch import ProgressWatch
from liver.policy.leaving import choose_leaving
from liver.policy.events import Event, EventKind
from liver.policy.outcome import Outcome
from liver.controller.phases import Phase, Trigger, advance
from liver.controller.records import EventRecord, Handling, first, least, new_record, said
from liver.controller.state import ControllerState
from liver.protocol import secret, store as protocol
from liver.protocol.messages import (M, GenerationSpec, Progress, StartReport, Wish, read,
                                    read_if, write)
from liver.protocol.worker import WorkerConfig
from liver.planner.nodes import tp_within_nodes
from liver.planner.plan import Plan, plan_transfer
from liver.topology import ParallelConfig
from liver.transfer.rehearsal import rehearse
from liver.world.world import connect_store, make_store



STORE_PROBE_S = 5.0  # a resumed controller's look for the job's store where it was


class Controller:
    def starter_spec(self) -> dict[str, Any]:
        """This job's way of making workers (its mode's), with the agent's start timeout."""
        spec = self.mode.starter(self.cfg.backend, self.cfg.engine)
        return {**spec, "start_timeout_s": self.cfg.agent.start_timeout_s} if spec["kind"] == "forked" else spec

    def __init__(self, cfg: RunConfig, events: list[Event], run_dir: Path, token: str | None = None,
                 local_node: bool = True, resume: dict[str, Any] | None = None, *,
                 store: Any = None, node: Node | None = None) -> None:
        """``cfg`` with its slots set (``RunConfig.with_slots``); ``token``: the control endpoint's
        (default: a random one, in the run's control.json); ``local_node``: the workers run on this
        machine, from an agent in this process (else on the ``liver agent`` nodes that register);
        ``resume``: a journal (``liver.controller.journal``) to go on from (``liver controller --resume``).
        ``store``, ``node``: the job's store and its one node, given (an in-process test's: a
        ``HashStore`` and a node whose processes it plays) instead of a TCP store this process
        serves and an agent of worker processes on this machine."""
        self.cfg, self.run_dir = cfg, run_dir
        # the job's token (the endpoint's; a resumed controller's, its journal's) and the secret made from it
        self.token = resume["token"] if resume is not None else (token or new_token())
        self.secret = secret.of_token(self.token)
        self.mode: Mode = MODES[cfg.controller.mode](self)  # how events are carried out
        self.job = cfg.job
        self.adapter = cfg.adapter
        self._hardware = hardware_of(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume is None:
            (run_dir / "steps.jsonl").write_text("")
        # its first event's planning and pickling, rehearsed before any step runs beside them (on a
        # machine whose cores the controller shares with the workers)
        pickle.dumps(rehearse(self.adapter))
        c = cfg.controller
        self.store_pid: int | None = None  # the store's own process (``liver controller``), or this one
        self.store_lost: str | None = None  # a resumed controller's: the store it found gone (its address)
        if store is not None:
            self.master, self.store_addr = store, "in-process"
        elif resume is not None:
            self.store_pid, self.store_addr = resume["store_pid"], resume["store_addr"]
            try:
                self.master = connect_store(self.store_addr, timeout_s=STORE_PROBE_S)
            except RuntimeError:  # (DistNetworkError) gone with the controller's node: a new one here
                self.store_lost = self.store_addr
                self.store_pid, self.store_addr = storehost.start(run_dir, c.host, c.port + 1 if c.port else 0,
                                                                  self.secret, c.advertise)
                self.master = connect_store(self.store_addr)
        elif not local_node:
            self.store_pid, self.store_addr = storehost.start(run_dir, c.host, c.port + 1 if c.port else 0, self.secret,
                                                              c.advertise)
            self.master = connect_store(self.store_addr)
        else:
            self.master, self.store_addr = make_store(host=c.host, port=c.port + 1 if c.port else 0,
                                                      advertise=c.advertise)
        self.store = protocol.run_store(self.master, self.secret)
        worker = WorkerConfig(job=cfg.job, engine=cfg.engine, backend=cfg.backend, steps=cfg.steps, digest=cfg.digest, log_rank=cfg.log_rank, connect=cfg.connect,
                              transfer=cfg.transfer, prepare=cfg.prepare, checkpoint=cfg.checkpoint,
                              # (a worker cut off from the store as long as a lost node's agent stops)
                              orphan_after_s=cfg.controller.agent_timeout_s)
        self.base_spec = {"store_addr": self.store_addr, "run_dir": str(run_dir), "config": to_dict(worker)}
        self.nodes = Nodes()
        self.remote = not local_node
        self.metrics = Metrics(self)
        if node is not None:
            self.nodes.add(lambda base: node)
        elif local_node:
            bind = cfg.agent.bind_cores and cfg.backend == "gloo"
            self.nodes.add(lambda base: NodeAgent(run_dir, cfg.slots, self.base_spec,
                                                  starters.make(self.starter_spec()), secret=self.secret,
                                                  quiet=cfg.agent.quiet,
                                                  cores=cores.per_slot(cfg.slots, cores.available()) if bind else None))
        self.lock = threading.Lock()  # (the state, between the loop and the endpoint's threads)
        self.state = ControllerState(queue=collections.deque(events))  # (what the journal saves)
        self.interrupted = False  # the caller was interrupted (Ctrl-C): stop the job
        self.endpoint: ControlEndpoint | None = None
        self._last_phase_t = self.state.started_at
        self.resumed = resume is not None
        self._url: str | None = None  # the endpoint's, where it was before (a resumed controller)
        self.watch = ProgressWatch(cfg.controller.stop_on_nonfinite_loss, cfg.checkpoint.escalate_after)
        self.membership = Membership(self, url=lambda: self.endpoint.url if self.endpoint else "?")
        self.suspension = Suspension(self)  # no GPU left: the state on disk until GPUs come back
        self.failures = Failures(self)  # exits, hangs, the fail-stop
        self.events = EventQueue(self)  # the events waiting, their triggers, the one due
        # the journal, where the store outlives this process (``liver controller``): a controller
        # started again on the run goes on from it
        self.journal = journal.Journal(run_dir, self.store) if self.store_pid is not None else None
        if resume is not None:
            self.state = journal.restore(resume, self.nodes)
            self._url = resume["url"]  # (None: it listens elsewhere now, ``--host``/``--port``)

    @property
    def hardware(self) -> target.Hardware:
        """What the target choice assumes: the job's GPUs, and (on several nodes) the smallest
        node's slot count, so that configurations whose TP groups fit in a node come first."""
        up = self.nodes.up()
        if len(up) < 2:
            return self._hardware
        return self._hardware.with_nodes(min(n.slots for n in up))

    def go(self, trigger: Trigger) -> None:
        """The one way the phase changes (``phases.TRANSITIONS``)."""
        self.state.phase = advance(self.state.phase, trigger)

    @property
    def finished(self) -> bool:
        return self.state.phase is Phase.ENDED

    @property
    def step(self) -> int:
        return self.state.progress.step if self.state.progress else 0

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """The job to its end, as the mode drives the loop: its report's data."""
        return self.mode.drive(self._run)

    def _run(self) -> dict[str, Any]:
        c = self.cfg.controller
        if c.endpoint or self.remote:
            port = int(self._url.rsplit(":", 1)[1]) if self._url else c.port  # (where the agents look)
            self.endpoint = ControlEndpoint(self.events.submit, self.status, self.run_dir, host=c.host, port=port,
                                            token=self.token, queue=self.events.queued, withdraw=self.events.withdraw,
                                            agents=self.membership.agent_request, metrics=self.metrics.exposition,
                                            end=self.end_after)
            logs.PHASES.info(f"control endpoint {self.endpoint.url} (token in {self.run_dir / 'control.json'})")
        try:
            self.start()
            while not self.finished and not self.interrupted:
                self.once()
                time.sleep(0.01)
        except KeyboardInterrupt:  # Ctrl-C in this thread: the job ends here, with its report
            self.interrupted = True
        finally:
            self.nodes.shutdown()
            self.membership.await_shutdown()
            if self.endpoint is not None:
                self.endpoint.close()
            self._recovery_digests()  # (from the store: before it goes)
            self._journal(force=True)
            if self.store_pid is not None:  # the job is over: its store goes too
                self.store.set(storehost.STOP_KEY, "1")
        why = "interrupted (Ctrl-C)" if self.interrupted else "training ended"
        if self.state.current is not None:
            self.state.current.record.settle(Outcome.NOT_COMPLETED, f"not completed: {why} in phase {self.state.phase.value}")
            self.state.records.append(self.state.current.record)
        for ev in self.state.queue:
            self.state.records.append(EventRecord.of(ev.to_dict(), Outcome.NOT_REACHED, f"not reached: {why}"))
        # (the report's boundary: plain data from here)
        return {"mode": self.mode.name, "records": [r.to_dict() for r in self.state.records],
                "wall_s": time.time() - self.state.started_at,
                "interrupted": self.interrupted}

    def start(self) -> None:
        """The job's first generation, once its nodes give it the GPUs; a resumed controller's
        first look at the phase it was in instead."""
        if self.resumed:
            self.phase_log("resumed", phase=self.state.phase.value, queued=len(self.state.queue),
                           nodes=list(self.nodes.nodes))
            if self.store_lost is not None:
                return self._store_lost()
            self.mode.resume()
            return
        self.membership.await_nodes()
        parallel = self.cfg.parallel or target.choose(self.adapter, self.job, self.cfg.gpus, self.hardware)
        start = self.cfg.checkpoint.start_from
        self.start_generation(parallel, slots=self.nodes.free_slots()[: self.cfg.gpus], load_from=start, kind="start")
        if start is not None:
            self.state.records.append(EventRecord.of(
                {"kind": "start", "source": "checkpoint.start_from"}, Outcome.RESUMED,
                "resumed from an earlier run's checkpoint", checkpoint=start, restored_step=saved_step(start),
                generation=self.state.gen, new=parallel.short(), t_event=time.time()))

    def once(self) -> None:
        """One pass of the loop: what the ranks and the nodes reported, then the mode's handling
        of the phase it is in, then the journal."""
        # one round trip a pass once the key exists (it is never deleted)
        p = read(self.store, Progress.KEY, Progress) if self.state.progress else read_if(self.store, Progress.KEY, Progress)
        if not self._fenced(p):
            self.state.progress = p
        if self.state.progress and self.state.t_start is None:
            self.state.t_start = self.state.progress.time
        self.events.stamp_triggers()
        self._watch_progress()
        self.failures.hung()
        self.membership.watch()
        self.failures.exits(self.failures.polled())
        if not self.finished:
            if self.state.phase is Phase.SUSPENDED:
                self.suspension.while_suspended()
            elif self.state.suspending:
                self.suspension.watch()
            else:
                self.mode.tick()
            if self.state.phase is Phase.STABLE:
                self._maybe_end()
        self._journal()

    def _fenced(self, p: Progress | None) -> bool:
        """A step record its rank 0 wrote after that process was fenced: not the job's step."""
        a = self.state.active
        if p is None or a is None or p.generation != a.generation:
            return False
        at = self.state.fenced.get(a.procs[0])
        return at is not None and p.time > at

    def _store_lost(self) -> None:
        """Resumed on another node after the controller's own was lost, the job's store with it:
        every process of the job lost it too (each stops itself, ``runtime.fence``), so nothing it
        ran is the job's any more. The nodes are taken for lost (their agents, back, register as
        new nodes and are offered as any node that joins), and the job waits, suspended, with its
        newest checkpoint until they give it GPUs again."""
        t0, s = time.time(), self.state
        if s.suspended is not None:
            return self.phase_log("store-lost", was=self.store_lost, now=self.store_addr, how="already suspended")
        gone = [w for n in list(self.nodes.nodes.values()) if isinstance(n, RemoteNode) for w in n.mark_lost()]
        s.pending, s.members = None, []  # (a handoff in flight: superseded, its record says so)
        # the step it had reached: its rank 0's log of steps (the run directory's; the store that
        # held its progress is gone)
        logged = [r for r in read_steps(self.run_dir) if r.get("generation") == s.active.generation]
        if logged:  # (and the new store holds it: the loop reads it there)
            s.progress = from_dict(Progress, max(logged, key=lambda r: r["step"]), "steps.jsonl")
            write(self.store, Progress.KEY, s.progress)
        # (cut off, the workers trained on unobserved until their timeout: a checkpoint they wrote
        # then may stand beyond the last step logged)
        ck = self.suspension.newest_checkpoint()
        failed = max(self.failures.failed_step(), ck["step"] if ck else 0)
        self.phase_log("store-lost", was=self.store_lost, now=self.store_addr, procs=[w.proc for w in gone],
                       failed_at_step=failed)
        self.suspension.every_gpu_lost(gone, failed, t0,
                                       source=f"the job's store at {self.store_lost} was lost with the controller's node")

    def _journal(self, force: bool = False) -> None:
        if self.journal is None:
            return
        identity = {"cfg": self.cfg, "mode": self.mode.name, "token": self.endpoint.token if self.endpoint else self.token,
                    "url": self.endpoint.url if self.endpoint else None, "store_pid": self.store_pid,
                    "store_addr": self.store_addr}
        with self.lock, self.nodes.lock:  # (in that order, as the endpoint's threads take them)
            blob = self.journal.snapshot(self.state, self.nodes, identity, force)
        if blob is not None:  # (written by this thread alone: the controller's loop)
            self.journal.write(blob)

    def _recovery_digests(self) -> None:
        """The state digest each recovery started from, as its new generation's ranks reported it."""
        for rec in self.state.records:
            # (a scale-in's drop whose survivors could not heal says "recovered" and has no
            # generation of its own: the fail-stop record after it has)
            if rec.outcome in (Outcome.RECOVERED, Outcome.RESUMED) and rec.get("generation") is not None:
                procs = list(GenerationSpec.fetch(self.store, rec["generation"]).procs)
                starts = self.collect(rec["generation"], procs, StartReport) or {}
                rec["digest_after"] = first(starts.values(), "digest_after")
                rec["digest_after_s"] = least(starts.values(), "digest_after_s")
                rec["digest_error"] = said(starts.values(), "digest_error")

    # ---- events --------------------------------------------------------------------------
    def end_after(self, steps: int) -> dict[str, Any]:
        """From the control endpoint: the job ends ``steps`` steps from the latest one (an event in
        flight finishes first: the end waits for the phase to be stable)."""
        if not 0 <= steps <= 10**9:
            raise ValueError(f"after={steps!r}: allowed 0 to 1000000000 steps")
        with self.lock:
            self.state.end_requested = steps
        return {"ending": True, "after_steps": steps, "step": self.step}

    def status(self) -> dict[str, Any]:
        p = self.state.progress
        return {"mode": self.mode.name, "phase": self.state.phase.value, "generation": self.state.gen,
                "parallel": to_dict(self.state.active.parallel) if self.state.active else None,
                "step": self.step, "queued": len(self.state.queue), "nodes": self.node_table(),
                "checkpoint": {"step": p.checkpoint_step, "failures_in_a_row": p.checkpoint_failures,
                               "error": p.checkpoint_error} if p is not None else None}

    def node_table(self) -> list[dict[str, Any]]:
        """Each node: its slots, whether it is up, the active ranks it holds (rank, process), and
        how long its latest commands waited to be taken (seconds, the newest last)."""
        ranks = list(enumerate(self.state.active.procs)) if self.state.active else []
        with self.nodes.lock:
            nodes = list(self.nodes.nodes.values())
        return [{"node": n.name, "up": not n.lost, "notice": n.notice is not None,
                 "slots": list(range(n.slot_base, n.slot_base + n.slots)),
                 "ranks": [(r, p) for r, p in ranks if n.slot_base <= self.state.slot_of.get(p, -1) < n.slot_base + n.slots],
                 "command_delivery_s": list(getattr(n, "delivery_s", ()))}
                for n in nodes]

    def capacity(self) -> int:
        """The slots the job can use now: those of its nodes that are up, less those lost."""
        return len([s for s in self.nodes.slots() if s not in self.state.lost_slots])

    def validate(self, ev: Event, n_before: int, current: ParallelConfig | None = None) -> ParallelConfig:
        """Refuse (ValueError naming the field) what cannot be done; returns the target (from
        ``current``, the configuration the job runs: ``admit``). A
        scale-out reports capacity: the slots of processes lost earlier count (it begins by
        taking them back), else a slot lost once on a node that is up could never be used again."""
        capacity = len(self.nodes.slots()) if ev.kind is EventKind.SCALE_OUT else self.capacity()
        return admit(ev, n_before, capacity, self.adapter, self.job, self.hardware, current)

    def _watch_progress(self) -> None:
        """Said and recorded once each (``watch.py``): a non-finite loss (ending the job there where
        asked), a failed periodic checkpoint."""
        for f in self.watch.see(self.state.progress):
            (logs.PHASES.error if f.error else logs.PHASES.warning)(f.message)
            self.state.records.append(f.record)
            if f.stop and not self.state.end_at:
                self.state.end_at, self.state.ending = max(1, self.state.progress.step), True
                self.wish()

    def refuse(self, ev: Event, e: ValueError) -> None:
        self.state.records.append(EventRecord.of(ev.to_dict(), Outcome.REFUSED, f"refused: {e}"))
        self.phase_log("refused", event=ev.describe(), error=str(e))

    # ---- generations ---------------------------------------------------------------------
    def handling(self, ev: Event) -> Handling:
        """The event's target, its processes and its record (refused: ValueError); its ``event``
        is ``ev`` as far as it now applies (a node's notice: the GPUs its node leaves)."""
        old = self.state.active
        n_old = len(old.procs)
        if ev.node is not None:  # a node's notice: its ranks leave, however many it holds by now
            on_node = [p for p in old.procs if self.nodes.node_of(self.state.slot_of[p]).name == ev.node]
            if not on_node:
                raise ValueError(f"{ev.source}: node {ev.node} holds no rank of the job any more")
            gpus = n_old - len(on_node)
            if gpus > 0 and (ev.parallel is None or ev.parallel.world_size != gpus):
                try:  # (where no configuration uses every process left: the best on fewer; others go too)
                    gpus = target.choose_up_to(self.adapter, self.job, gpus, self.hardware, old.parallel).world_size
                except ValueError:
                    pass  # (validate says why none fits)
            ev = replace(ev, gpus=gpus, parallel=ev.parallel if ev.parallel and ev.parallel.world_size == gpus else None)
        tgt = self.validate(ev, n_old, old.parallel)
        old_layout, new_layout = self.adapter.layout(self.job, old.parallel), self.adapter.layout(self.job, tgt)
        if ev.kind is EventKind.RESHAPE and (new_layout.tp, new_layout.pp, new_layout.dp, new_layout.layers_per_stage) \
                == (old_layout.tp, old_layout.pp, old_layout.dp, old_layout.layers_per_stage):
            raise ValueError(f"{ev.source}: reshape {tgt.short()}: the job already runs {tgt.short()}")
        h = Handling(event=ev, record=new_record(ev, self.events.arrival(ev), old.parallel, tgt, old.generation, self.step),
                     target=tgt)
        if ev.parallel is None:  # (the choice's target, not one the event named)
            h.choice = target.why(self.adapter, self.job, self.hardware, old.parallel, tgt)
        if ev.kind is EventKind.SCALE_OUT:
            free = [s for s in self.nodes.free_slots() if s not in self.state.lost_slots]
            if len(free) < ev.gpus - n_old:
                raise ValueError(f"{ev.source}: scale-out {ev.gpus}: only {len(free)} free slots")
            h.join_slots = free[: ev.gpus - n_old]
        elif ev.kind is EventKind.SCALE_IN and ev.node is not None:
            # the node's ranks, and where no configuration uses every other one, the most recently added of them
            rest = sorted((p for p in old.procs if p not in on_node), key=self.state.slot_of.__getitem__, reverse=True)
            h.leaving = on_node + rest[:n_old - len(on_node) - ev.gpus]
        elif ev.kind is EventKind.SCALE_IN:  # replicas where they can go, else the fewest bytes (``leaving.py``)
            a, job = self.adapter, self.job
            chosen = choose_leaving(a.view(job, old_layout), old.procs, n_old - ev.gpus, a.state_specs(job),
                                    self.state.slot_of.__getitem__,
                                    lambda stay: self.plan(old.parallel, tgt, list(old.procs), stay).bytes_moved)
            h.leaving = chosen.procs
            h.record["leaving_chosen"] = chosen.why
        return h

    def start_generation(self, parallel: ParallelConfig, slots: list[int], load_from: str | None,
                          kind: str) -> GenerationSpec:
        """Fresh processes for a whole generation (first start, restart, recovery)."""
        self.state.gen += 1
        procs = self.nodes.new_proc_ids(len(slots))
        for p, s in zip(procs, slots):
            self.state.slot_of[p] = s
        placed = self._within_nodes(self.adapter.layout(self.job, parallel), procs)
        spec = GenerationSpec(generation=self.state.gen, parallel=parallel, procs=tuple(placed), load_from=load_from,
                              nodes=self.node_names(placed),
                              kind=kind)
        spec.publish(self.store)
        self.wish()
        for p in procs:
            self.nodes.start(p, self.state.slot_of[p], "start", self.state.gen)
        self.state.active = spec
        self.phase_log("generation", generation=self.state.gen, parallel=parallel.short(), kind=kind,
                       procs=procs, load_from=load_from, **self.where(spec))
        return spec

    def node_names(self, procs) -> tuple[str, ...]:
        """The node of each process (a generation's spec: its workers' LOCAL_WORLD_SIZE)."""
        def name(p: int) -> str:
            try:
                return self.nodes.node_of(self.state.slot_of[p]).name
            except KeyError:  # (a slot of a node the job no longer has)
                return "?"
        return tuple(name(p) for p in procs)

    def _within_nodes(self, layout, placement: list[int]) -> list[int]:
        """``placement`` (rank -> process) with each TP group on one node where the nodes allow."""
        if len(self.nodes.nodes) < 2:
            return list(placement)
        return tp_within_nodes(layout, placement, {p: self.nodes.node_of(self.state.slot_of[p]).name for p in placement})

    def plan(self, old: ParallelConfig, new: ParallelConfig, old_procs: list[int], new_procs: list[int],
             old_view=None) -> Plan:
        """The transfer plan from ``old`` (or ``old_view``, a heal's survivors) to ``new``: the
        placement that moves fewest bytes, with each TP group kept on one node where it can be."""
        a, job = self.adapter, self.job
        src = old_view if old_view is not None else a.view(job, a.layout(job, old))
        dst, specs = a.view(job, a.layout(job, new)), a.state_specs(job)
        plan = plan_transfer(src, dst, specs, old_procs, new_procs)
        placed = self._within_nodes(a.layout(job, new), plan.placement)
        if placed != plan.placement:
            plan = plan_transfer(src, dst, specs, old_procs, new_procs, placement=placed)
        return plan

    def where(self, spec: GenerationSpec) -> dict[str, Any]:
        """Which node holds which ranks of ``spec`` (for the log), where the job has several nodes."""
        if len(self.nodes.nodes) < 2:
            return {}
        by: dict[str, list[int]] = {}
        for r, p in enumerate(spec.procs):
            by.setdefault(self.nodes.node_of(self.state.slot_of[p]).name, []).append(r)
        return {"ranks_by_node": by}

    def wish(self, wanted: int = 0, stop_at: int = 0, force: int = 0) -> None:
        Wish(wanted=wanted, stop_at=stop_at, force=force, end_at=self.state.end_at).publish(self.store)

    def _maybe_end(self) -> None:
        """Nothing left to do: end the job ``end_after_events`` steps from now, if asked; or as an
        operator asked (``POST /end``), once no event is in flight."""
        if self.state.end_requested is not None and self.state.current is None and self.state.progress \
                and self.state.progress.generation == self.state.active.generation:
            self.state.end_at, self.state.end_requested = self.state.progress.step + max(1, self.state.end_requested), None
            self.state.ending = True
            self.wish()
            return
        n = self.cfg.controller.end_after_events
        if n is None or self.state.queue or self.state.current is not None or self.state.end_at \
                or not self.state.progress or self.state.progress.generation != self.state.active.generation:
            return
        self.state.end_at = self.state.progress.step + n
        self.wish()

    def phase_log(self, what: str, **kw: Any) -> None:
        """A structured line for a phase event (``liver.logs``): with the generation, how long the
        controller was in the phase it leaves, and the step the job is at."""
        now = time.time()
        logs.phase(what, **{"generation": self.state.gen, **kw, "step": self.step,
                            "since_last_s": round(now - self._last_phase_t, 4)})
        self._last_phase_t = now

    # ---- event records -------------------------------------------------------------------
    def close_event(self, outcome: Outcome, trigger: Trigger, says: str | None = None) -> None:
        h = self.state.current
        rec = h.record
        rec.settle(outcome, says)
        rec["t_done"] = time.time()
        # the controller loop's CPU time from the event to its end (its routine polling included)
        rec["controller_cpu_s"] = time.thread_time() - h.cpu0
        self.state.records.append(rec)
        self.state.current = None
        self.go(trigger)

    def collect(self, g: int, procs: list[int], cls: type[M]) -> dict[int, M] | None:
        """Every process's report of generation ``g`` (a ``cls``), or None while any is missing."""
        keys = [cls.key(g, p) for p in procs]
        if not self.store.check(keys):  # one round trip while they are not all there
            return None
        return {p: read(self.store, k, cls) for p, k in zip(procs, keys)}


__all__ = ["Controller", "ControllerError"]
