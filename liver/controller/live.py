"""Live handoffs: joiners warm up on a mock world, companions build the Shadow World, and the
ranks switch at the first iteration boundary after every one is ready, unless the controller
withdrew the generation first: rank 0's commit and the controller's withdrawal are one
compare-and-set on ``decision/{g}`` (``liver.protocol.store.decide``), so whichever comes first
holds and neither side waits to learn it.
"""

from __future__ import annotations

import threading
from dataclasses import replace
import time
from typing import TYPE_CHECKING, Any, Callable

from liver.agent.node import Worker
from liver.host import faults
from liver.host.priority import this_thread
from liver.controller.failures import ControllerError
from liver.controller.mode import Mode, forked_workers
from liver.policy.decisions import (NoticeAction, PastHandoff, ScaleInPath, on_notice, predicted_handoff_s, scale_in_path,
                                    link_transfer_s)
from liver.policy.events import Event, EventKind
from liver.policy.outcome import DROPPED_SAYS, Outcome
from liver.controller.healing import Healing
from liver.controller.phases import PENDING, Phase, Trigger
from liver.controller.records import EventRecord, switch_metrics
from liver.policy import heal
from liver.policy import costs
from liver.policy.workload import Workload
from liver.protocol.messages import Failure, GenerationSpec, SwitchReport, read_if
from liver.protocol.store import COMMIT, WITHDRAW, decide, decided, get, publish_plan

if TYPE_CHECKING:
    from liver.controller.controller import Controller

PREPARE_ATTEMPTS = 2  # preparations of one event whose groups timed out before it is cancelled


class LiveMode(Mode):
    name = "live"

    @staticmethod
    def starter(backend: str, engine: str) -> dict[str, Any]:
        return forked_workers(backend, engine, joiners=True)

    def __init__(self, ctl: Controller) -> None:
        super().__init__(ctl)
        self.healing = Healing(ctl)
        self._idle: bool | None = None  # the loop thread's priority: idle, normal, or never set (None)

    def resume(self) -> None:
        """Back after a restart: a pending generation no rank committed yet is withdrawn and its
        event queued again first (its joiners stopped: they prepared for a controller that is
        gone); one that was committed is switching, and is watched to its end as before.
        Generations announced after the journal's last write are withdrawn first (``_forget_unjournaled``)."""
        self._forget_unjournaled()
        if self.state.phase not in PENDING:
            return
        g, h = self.state.pending.generation, self.state.current
        if decide(self.store, g, WITHDRAW) != WITHDRAW:
            return self._committed()
        self.ctl.wish()
        for p in h.joiners:
            self.nodes.kill(p)
        for p in h.leaving:
            self.nodes.workers[p].leaving = False
        h.record["attempts"][-1]["cancelled"] = "the controller restarted"
        h.record.settle(Outcome.REQUEUED, "interrupted by a controller restart; queued again")
        self.state.records.append(h.record)
        with self.ctl.lock:
            self.state.queue.appendleft(h.event)
        self.state.current, self.state.pending = None, None
        self.ctl.go(Trigger.CANCEL)
        self.ctl.phase_log("cancelled", generation=g, why="the controller restarted; its event is queued again")

    def _forget_unjournaled(self) -> None:
        """The controller that died may have announced a generation (its spec in the store, its
        wish to the ranks) after its journal's last write: each is withdrawn, so that no rank
        commits it, and its number is not used again (a rank that prepared it would take a new
        generation of that number for the one it prepared); with no event pending, the ranks are
        told that nothing is wanted."""
        stale, g = [], self.state.gen + 1
        while self.store.check([GenerationSpec.key_of(g)]):
            if decide(self.store, g, WITHDRAW) != WITHDRAW:  # (a switch takes Prepare's seconds: not seen)
                raise ControllerError(f"generation {g} was committed by the ranks after the journal's last write; "
                                      f"this controller cannot go on from {self.ctl.run_dir / 'journal.pkl'}")
            try:
                procs = GenerationSpec.fetch(self.store, g).procs
            except (RuntimeError, ValueError):  # (unreadable: the agents' reports skip their ids)
                procs = ()
            for p in procs:  # its joiners may run: their ids stay theirs
                self.nodes.skip_proc(p)
            stale.append(g)
            g += 1
        if not stale:
            return
        self.state.gen = stale[-1]
        if self.state.phase not in PENDING:
            self.ctl.wish()
        for g in stale:
            self.ctl.phase_log("cancelled", generation=g, why="announced by the controller that died after its journal's "
                                                          "last write; withdrawn")

    def drive(self, loop: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The ``loop`` in a thread of its own at low CPU priority while nothing is due (``_loop_priority``):
        on a node whose cores the ranks keep busy, its polling takes little of their time (the store
        it serves runs in a thread made before, at normal priority). The caller's thread keeps its own."""
        box: dict[str, Any] = {}
        done = threading.Event()  # (not Thread.is_alive: a Ctrl-C inside join() can make it lie)

        def low() -> None:
            this_thread(low=True)
            self._idle = True
            try:
                box["report"] = loop()
            except BaseException as e:  # raised again in the caller's thread
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=low, name="liver-controller", daemon=True).start()
        while not done.is_set():
            try:
                done.wait(0.2)
            except KeyboardInterrupt:
                self.ctl.interrupted = True  # the loop ends, stopping the workers, and reports
                self.nodes.interrupt()   # (even one waiting for a zygote still importing)
        if "error" in box:
            raise box["error"]
        return box["report"]

    def _loop_priority(self, due: bool) -> None:
        """Low priority while nothing is due (its polling takes little of the ranks' time), normal
        priority from an event's trigger to its end: a due event is acted on at once."""
        idle = not due and self.state.phase is Phase.STABLE
        if self._idle is not None and idle != self._idle:
            this_thread(low=idle)
            self._idle = idle

    def tick(self) -> None:
        with self.ctl.lock:
            due = self.ctl.events.due()
            self._loop_priority(due is not None)
            ev = self.ctl.events.take(due[0]) if due is not None and self.state.phase is Phase.STABLE else None
        if self.state.phase is Phase.STABLE:
            if ev is not None:
                self._begin(ev)
        elif self.state.phase in PENDING:
            self._notice_during_prepare()
            if self.state.phase in PENDING:
                self._watch_prepare()
        elif self.state.phase is Phase.SWITCH:
            self._watch_switch()
        elif self.state.phase is Phase.CLEANUP:
            self._watch_cleanup()

    # ---- a fail-stop healed from the survivors ---------------------------------------------
    def fail_stop(self, dead: list[Worker], preempted: bool = False) -> None:
        """Healed from the survivors' memory where they hold every shard (``healing.py``); else the
        checkpoint (``Failures.from_checkpoint``)."""
        if self.cfg.controller.heal_timeout_s > 0 and (self.state.current is None or self._drop_pending(preempted)):
            missed, self.state.missed = self.state.missed, None
            rec = self.healing.attempt(dead, missed.target if missed is not None else None)
            if rec is not None:
                self.state.lost_slots |= {w.slot for w in dead}
                self.state.records.append(rec)
                return
            if missed is not None:  # (its record is written: it says how the job went on after all)
                missed.record.settle(Outcome.DEADLINE_MISSED, "deadline missed: the leaving processes were stopped at "
                                     "the deadline and the job recovered on the others from the checkpoint")
                return self.ctl.failures.from_checkpoint(dead, preempted, named=missed.target)
        self.ctl.failures.from_checkpoint(dead, preempted)

    def _drop_pending(self, preempted: bool) -> bool:
        """A fail-stop while a handoff prepares: the survivors may heal where its pending
        generation is withdrawn (none switched to it). A scale-in whose deadline passed (its
        leaving processes were stopped) ends here, with its outcome in its record; any other
        event is queued again first, as the checkpoint's recovery does."""
        if self.state.phase not in PENDING or decide(self.store, self.state.pending.generation, WITHDRAW) != WITHDRAW:
            return False
        h = self.state.current
        for p in h.joiners:
            self.nodes.kill(p)
        for p in h.leaving:
            self.nodes.workers[p].leaving = False
        if preempted:
            h.record.settle(Outcome.DEADLINE_MISSED, "deadline missed: the leaving processes were stopped at the "
                            "deadline and the survivors healed from their replicas")
            self.state.missed = h
        else:
            h.record.settle(Outcome.REQUEUED, "interrupted by a fail-stop; re-queued")
            with self.ctl.lock:
                self.state.queue.appendleft(h.event)
        self.state.records.append(h.record)
        self.state.current, self.state.pending = None, None
        self.ctl.wish()
        self.ctl.go(Trigger.FAIL_STOP)
        return True

    # ---- starting a handoff ----------------------------------------------------------------
    def _begin(self, ev: Event) -> None:
        h = self.handle(ev)
        if h is None:
            return
        self.state.current = h
        if ev.kind is EventKind.SCALE_IN and ev.deadline_s is not None:
            path = self._path(h)
            if path is ScaleInPath.DROP:
                return self._drop(h)
            h.forced = path is ScaleInPath.RUSH
        self.ctl.go(Trigger.BEGIN)
        self._launch()

    # ---- a scale-in with a deadline: its path, decided before it starts ----------------------
    def _path(self, h) -> ScaleInPath:
        """What the notice needs (the bytes only the leaving ranks hold, the predicted handoff) and
        the path it takes (``decisions.scale_in_path``), written into its record."""
        old, a, job = self.state.active, self.ctl.adapter, self.ctl.job
        stay = [p for p in old.procs if p not in h.leaving]
        plan = self.ctl.plan(old.parallel, h.target, list(old.procs), stay)
        view = heal.surviving_view(a.view(job, a.layout(job, old.parallel)), old.procs, h.leaving)
        replicas = heal.uncovered(view, a.state_specs(job)) is None
        predicted, source = self._predicted_handoff_s(old.parallel, h.target, plan)
        left = h.deadline_at - time.time()
        path = scale_in_path(left, predicted, replicas)
        h.record.update(path=path.value, predicted_handoff_s=predicted, predicted_from=source,
                        seconds_left=left, leaving_hold_only_replicas=replicas,
                        bytes_off_leaving=sum(plan.rank_bytes_out.get(p, 0) for p in h.leaving))
        self.ctl.phase_log("path", path=path.value, predicted_s=round(predicted, 3), source=source,
                       seconds_left=round(left, 3), replicas=replicas, bytes_off_leaving=h.record["bytes_off_leaving"])
        return path

    def _predicted_handoff_s(self, old, new, plan) -> tuple[float, str]:
        """From this job's own handoffs so far, its links' rates among them
        (``decisions.predicted_handoff_s``), else the simulator's calibrated model of one, for the
        machine's profile: (seconds, which)."""
        past = [PastHandoff(prepare_s=r["prepare_s"], switch_s=r["switch_s"], transfer_s=r.get("transfer_s") or 0.0,
                            max_rank_bytes=max(r.get("max_rank_bytes_in") or 0, r.get("max_rank_bytes_out") or 0),
                            joiners=bool(r.get("joiners")))
                for r in self.state.records if r.outcome is Outcome.DONE and "switch_s" in r and "prepare_s" in r]
        moved = max([*plan.rank_bytes_in.values(), *plan.rank_bytes_out.values()], default=0)
        measured = predicted_handoff_s(past, moved)
        if measured is not None:
            return measured, "measured"
        hw = self.ctl.hardware
        model = costs.live(Workload(self.ctl.adapter, self.ctl.job), old, new, hw.costs, plan=costs.work(plan), share=self.cfg.prepare.companion_share)
        link = link_transfer_s(past, moved)  # (a link the job found slower than the profile's: its rate bounds it)
        if link is not None and link > model.downtime_s:
            return model.prepare_s + link, f"model ({hw.profile.name}) at the links' measured rate"
        return model.prepare_s + model.downtime_s, f"model ({hw.profile.name})"

    def _drop(self, h) -> None:
        """No handoff fits and the leaving ranks hold only replicas: they stop now (their GPUs are
        free before the deadline) and the survivors go on from their own state. One record: the
        scale-in's. Where the survivors cannot heal after all, the checkpoint (a fail-stop record)."""
        gone = [self.nodes.workers[p] for p in h.leaving]
        for w in gone:
            self.nodes.kill(w.proc)
        stopped = time.time()
        self.ctl.phase_log("drop", procs=h.leaving, new=h.target.short())
        healed = self.healing.attempt(gone, h.target) if self.cfg.controller.heal_timeout_s > 0 else None
        rec = h.record
        rec.update(t_stopped=stopped, deadline_met=stopped <= h.deadline_at, t_done=time.time())
        self.state.current = None
        if healed is None:
            rec.settle(Outcome.RECOVERED, "recovered: the leaving processes were stopped before the deadline; the "
                       "survivors could not go on from their own state, so from the checkpoint (next record)")
            self.state.records.append(rec)
            return self.ctl.failures.from_checkpoint(gone, named=h.target)
        rec.update({k: healed[k] for k in ("generation", "new", "failed_at_step", "restored_step", "lost_steps",
                                           "steps_unlogged", "heal_s", "bytes_moved", "digest_before", "digest_after")})
        rec.settle(Outcome.DROPPED, DROPPED_SAYS)
        self.state.records.append(rec)

    def _launch(self) -> None:
        h, old = self.state.current, self.state.active
        rec = h.record
        h.joiners = self.nodes.new_proc_ids(len(h.join_slots))
        for p, s in zip(h.joiners, h.join_slots):
            self.state.slot_of[p] = s
        new_procs = [p for p in old.procs if p not in h.leaving] + h.joiners
        t0 = time.perf_counter()
        plan = self.ctl.plan(old.parallel, h.target, list(old.procs), new_procs)
        self.state.gen += 1
        spec = GenerationSpec(generation=self.state.gen, parallel=h.target, procs=tuple(plan.placement),
                              nodes=self.ctl.node_names(plan.placement),
                              old_generation=old.generation, old_parallel=old.parallel,
                              old_procs=old.procs, kind=h.event.kind.value)
        publish_plan(self.store, self.state.gen, plan, self.ctl.secret)  # before the spec: a worker that sees one finds both
        spec.publish(self.store)
        rec.update(generation=self.state.gen, plan_s=time.perf_counter() - t0, bytes_moved=plan.bytes_moved,
                   bytes_moved_identity_placement=plan.bytes_moved_identity,
                   max_rank_bytes_in=max(plan.rank_bytes_in.values(), default=0),
                   max_rank_bytes_out=max(plan.rank_bytes_out.values(), default=0),
                   joiners=h.joiners, leaving=h.leaving, procs=plan.placement)
        rec.setdefault("attempts", []).append({"generation": self.state.gen, "t": time.time(), "joiners": h.joiners})
        self.state.pending = spec
        self.state.members = sorted(set(old.procs) | set(plan.placement))
        for i, p in enumerate(h.joiners):
            try:
                self.nodes.start(p, self.state.slot_of[p], "joiner", self.state.gen)
            except (RuntimeError, OSError) as e:  # (a template that cannot fork in time: a loaded node)
                h.joiners = h.joiners[:i]  # the ones started are stopped with the handoff
                decide(self.store, self.state.gen, WITHDRAW)  # (nobody prepares it: no wish named it yet)
                return self._cancel(f"joiner process {p} (slot {self.state.slot_of[p]}) could not be started: {e}",
                                    replan=False)
        for p in h.leaving:
            self.nodes.workers[p].leaving = True
        self.ctl.wish(wanted=self.state.gen, force=self.state.gen if h.forced else 0)
        self.ctl.phase_log("prepare", generation=self.state.gen, event=h.event.kind.value, old=rec["old"], new=rec["new"],
                       joiners=h.joiners, leaving=h.leaving, bytes_moved=plan.bytes_moved,
                       **({"chosen": h.choice} if h.choice else {}))
        faults.at("announce", self.state.gen)  # (the fault-matrix tests' controller dies here, or later)

    # ---- while it prepares -----------------------------------------------------------------
    def _watch_prepare(self) -> None:
        h, g, now = self.state.current, self.state.pending.generation, time.time()
        rec = h.record
        faults.at("announce", g, now - h.attempt_started)
        d = decided(self.store, g)
        if d == COMMIT:  # rank 0 committed: the ranks are switching
            return self._committed()
        if d == WITHDRAW:  # (not this controller's: it cancels as it withdraws) a decision refused as
            # not the job's (``protocol.store``): the ranks take the generation for withdrawn
            return self._cancel(f"the decision on generation {g} in the store was not the job's (refused)",
                                replan=False)
        failure = self._failure(g)
        if failure is not None:  # a group's rendezvous that timed out is tried again once, anew: its ranks
            # may have been held until then by a withdrawn generation's (a resumed controller's first
            # preparation); any other failure (a plan refused, a state that cannot be built) cancels
            again = failure.error.startswith("TimeoutError") and len(rec.get("attempts", ())) < PREPARE_ATTEMPTS
            return self._withdraw_then(lambda: self._cancel(f"process {failure.proc} could not prepare generation "
                                                            f"{g}: {failure.error}", replan=again))
        if self.state.phase is Phase.PREPARE:
            if self.store.check([f"ready/{g}/{p}" for p in self.state.members]):  # one round trip
                self._mark_ready(now)
            elif now - h.attempt_started > self.cfg.controller.prepare_timeout_s:
                why = f"not ready after {self.cfg.controller.prepare_timeout_s:g} s"
                return self._withdraw_then(lambda: self._cancel(why, replan=False))
        if h.event.deadline_s is not None:
            left = h.deadline_at - now
            if left < max(0.25 * h.event.deadline_s, h.record.get("predicted_handoff_s", 1.0)) and not h.forced:
                h.forced = True  # the fastest safe path: finish preparing in the foreground
                self.ctl.wish(wanted=g, force=g)
                self.ctl.phase_log("deadline-near", generation=g, seconds_left=round(left, 3))
            if left < 0:  # the provider takes the GPUs now: every leaving process goes, in one recovery
                rec["deadline_met"] = False
                gone = [self.nodes.workers[p] for p in h.leaving if self.nodes.workers[p].returncode is None]
                for w in gone:
                    w.leaving = False
                    self.nodes.kill(w.proc)
                self.ctl.phase_log("preempted", procs=[w.proc for w in gone])
                if gone:
                    return self.fail_stop(gone, preempted=True)

    def _mark_ready(self, now: float) -> None:
        rec = self.state.current.record
        rec["t_ready"] = now
        rec["prepare_s"] = now - self.state.current.attempt_started
        self.ctl.go(Trigger.READY)
        self.ctl.phase_log("ready", generation=self.state.pending.generation, prepare_s=round(rec["prepare_s"], 4))

    def _failure(self, g: int) -> Failure | None:
        for p in self.state.members:
            f = read_if(self.store, Failure.key(g, p), Failure)
            if f is not None:
                return f
        return None

    def _committed(self) -> None:
        """Rank 0 committed the pending generation: from here it is the switch, whatever comes."""
        if self.state.phase is Phase.PREPARE:  # committed between two polls of the ready keys
            g = self.state.pending.generation
            # (when the last member said ready; a member the pending generation dropped in a
            # re-plan has no key)
            times = [t for t in (get(self.store, f"ready/{g}/{p}") for p in self.state.members) if t is not None]
            self._mark_ready(max(times) if times else time.time())
        self.ctl.go(Trigger.COMMIT)
        self.ctl.phase_log("commit", generation=self.state.pending.generation)

    def _withdraw_then(self, dropped) -> bool:
        """Withdraw the pending generation: True (and ``dropped()`` called) where the withdrawal
        holds, so no rank can switch to it any more; False where rank 0 had committed it first:
        the switch goes on, and whatever wanted the withdrawal waits for its end."""
        g = self.state.pending.generation
        if decide(self.store, g, WITHDRAW) == WITHDRAW:
            self.ctl.wish()
            dropped()
            return True
        self._committed()
        return False

    def _notice_during_prepare(self) -> None:
        """A preemption notice must not wait behind a scale-out that has not switched yet: the
        pending scale-out is re-planned to the smaller total (or dropped, and the scale-in goes
        first). Nothing was committed, so nothing is lost."""
        with self.ctl.lock:
            due = self.ctl.events.due(notices_only=True)  # wherever it waits in the queue
            head = due[1] if due is not None else None
            n_active = len(self.state.active.procs)
            action = on_notice(self.state.current.event.kind if self.state.current else None, head.kind if head else None,
                               head.gpus if head else 0, n_active, deadline=head is not None and
                               head.deadline_s is not None)
            if action is NoticeAction.WAIT:
                return
            self.ctl.events.take(due[0])
        h = self.state.current
        notice = EventRecord.of(head.to_dict(), Outcome.STARTED, arrived=self.ctl.events.arrival(head), t_event=time.time())
        if decide(self.store, self.state.pending.generation, WITHDRAW) != WITHDRAW:
            with self.ctl.lock:  # the scale-out is switching: the notice is next
                self.state.queue.appendleft(head)
            return self._committed()
        self.ctl.wish()
        if action is NoticeAction.MERGE:  # still a scale-out, to fewer GPUs
            h.event = replace(h.event, gpus=head.gpus, parallel=head.parallel)
            self.state.records.append(notice.settle(Outcome.MERGED, f"merged into the pending scale-out (now to {head.gpus})"))
            return self._cancel(f"scale-in notice to {head.gpus} GPUs", replan=True)
        self._cancel(f"scale-in notice to {head.gpus} GPUs", replan=False)
        if action is NoticeAction.DROP_THEN_BEGIN:
            self._begin(head)
        else:
            self.state.records.append(notice.settle(Outcome.DONE, "done: the job already has that many GPUs once the "
                                                    "pending scale-out is dropped"))

    def _cancel(self, why: str, replan: bool) -> None:
        """The pending generation went stale and its withdrawal holds: drop it (the Active World
        never changed) and re-plan, or close the event."""
        h = self.state.current
        for p in h.joiners:
            self.nodes.kill(p)
        for p in h.leaving:
            self.nodes.workers[p].leaving = False
        h.record["attempts"][-1]["cancelled"] = why
        self.ctl.phase_log("cancelled", generation=self.state.pending.generation, why=why)
        ev = h.event
        if replan and ev.kind is EventKind.SCALE_OUT:
            gpus = min(ev.gpus, self.ctl.capacity())  # (a named configuration that no longer fits: the controller chooses)
            ev = replace(ev, gpus=gpus, parallel=ev.parallel if ev.parallel and ev.parallel.world_size == gpus else None)
        try:
            if not replan:
                raise ValueError(why)
            fresh = self.ctl.handling(ev)
        except ValueError as e:
            return self.ctl.close_event(Outcome.CANCELLED, Trigger.CANCEL, f"cancelled: {why}; {e}" if replan else f"cancelled: {why}")
        h.event, h.target, h.leaving, h.join_slots, h.forced = fresh.event, fresh.target, fresh.leaving, fresh.join_slots, False
        h.record["new"], h.record["gpus"] = fresh.target.short(), fresh.event.gpus
        self.ctl.go(Trigger.REPLAN)
        self._launch()

    def breaks_handoff(self, w: Worker) -> bool:
        """A process of the switch under way (a joiner receiving, a source sending, one leaving
        with its shards): the old shards are released as they are sent, so there is no way back
        but the checkpoint, and its peers would wait on it until their groups' timeout."""
        return self.state.phase is Phase.SWITCH and w.proc in self.state.members

    def joiner_died(self, w: Worker) -> None:
        if self.state.current is None or self.state.phase not in PENDING or w.proc not in self.state.pending.procs:
            return
        self.state.lost_slots.add(w.slot)
        if not self._withdraw_then(lambda: self._cancel(f"joiner {w.proc} (slot {w.slot}) died during Prepare",
                                                        replan=True)):
            # rank 0 had committed first: the switch cannot complete without it (as a member lost
            # in the switch, ``_breaks_handoff``), one fail-stop at once, naming it
            self.fail_stop([w])

    # ---- the switch and after ----------------------------------------------------------------
    def _watch_switch(self) -> None:
        g = self.state.pending.generation
        done = self.ctl.collect(g, list(self.state.pending.procs), SwitchReport)
        if done is None:
            return
        h = self.state.current
        rec = h.record
        old_procs = [p for p in self.state.members if p not in self.state.pending.procs]
        leavers = {p: r for p in old_procs if (r := read_if(self.store, SwitchReport.key(g, p), SwitchReport))}
        rec.update(switch_metrics(done, leavers))
        if h.event.deadline_s is not None:
            rec["deadline_met"] = rec["switch_end"] <= h.deadline_at
        self.state.active, self.state.pending = self.state.pending, None
        self.ctl.go(Trigger.SWITCHED)
        self.ctl.phase_log("switch", generation=self.state.active.generation, switch_s=round(rec["switch_s"], 4),
                       transfer_s=round(rec["transfer_s"], 4), **self.ctl.where(self.state.active))

    def _watch_cleanup(self) -> None:
        h = self.state.current
        leaving = [self.nodes.workers[p] for p in h.leaving]
        if all(w.returncode is not None for w in leaving) or time.time() - h.record["switch_end"] > 30:
            for w in leaving:
                self.nodes.kill(w.proc)
            self.ctl.close_event(Outcome.DONE, Trigger.CLEANED)
            self.ctl.phase_log("cleanup", generation=self.state.active.generation)
