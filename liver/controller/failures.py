"""Processes that end: a worker's exit seen by the loop, a hung worker killed, the job's end, and
the fail-stop, where a rank of the Active World vanished: every process is stopped and the job
goes on from the newest checkpoint on the slots it still has. A component the controller holds
(``Controller.failures``); what the mode in use adds (a live job heals from its survivors first,
``LiveMode.fail_stop``) comes through ``Host.mode``. What it reads and calls of the controller is
declared (``Host``)."""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch.distributed as dist

from liver import logs
from liver.agent.node import Worker
from liver.config import RunConfig
from liver.controller.nodes import Nodes, RemoteNode
from liver.controller.phases import Phase, Trigger
from liver.controller.records import EventRecord
from liver.controller.state import ControllerState
from liver.controller.suspension import Suspension
from liver.policy import target
from liver.policy.decisions import EndState, job_finished
from liver.policy.events import Event
from liver.policy.moves import RESTART_FROM_CHECKPOINT
from liver.policy.outcome import Outcome
from liver.protocol.agent import NODE_LOST
from liver.protocol.messages import beat_key
from liver.topology import ParallelConfig

FAILURE_GRACE_S = 0.2  # before a recovery from the checkpoint, the processes that end with the lost ones


class ControllerError(RuntimeError):
    pass


def lost_slots(dead: list[Worker], silent: set[int] = frozenset()) -> set[int]:
    """The slots a fail-stop takes out of use: those whose process was killed (a signal, a hang,
    its node lost) and ``silent`` (slots of nodes that gave no sign of life since). A process that
    exited with an error because a peer vanished (its collective broke) leaves a healthy slot,
    which the recovery uses again; where nothing came from outside (no kill, no silent node),
    every dead process's slot goes, as a bug's would."""
    causes = {w.slot for w in dead if w.returncode is not None and w.returncode < 0} | set(silent)
    return causes or {w.slot for w in dead}


def last_line(text: str) -> str:
    """A dead process's last words: its log's last line that is not a step line."""
    lines = [x for x in text.splitlines() if x.strip() and not logs.is_step_line(x)]
    return lines[-1][:300] if lines else ""


class Mode(Protocol):
    """What the failures ask of the mode in use (``liver.controller.mode.Mode``)."""

    def fail_stop(self, dead: list[Worker], preempted: bool = False) -> None: ...
    def breaks_handoff(self, w: Worker) -> bool: ...
    def joiner_died(self, w: Worker) -> None: ...


class Host(Protocol):
    """What the failures need of the controller that holds them."""

    cfg: RunConfig
    state: ControllerState
    nodes: Nodes
    store: dist.Store
    adapter: Any
    job: Any
    mode: Mode
    suspension: Suspension

    @property
    def step(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    @property
    def hardware(self) -> target.Hardware: ...
    def go(self, trigger: Trigger) -> None: ...
    def phase_log(self, what: str, **kw: Any) -> None: ...
    def validate(self, ev: Event, n_before: int) -> ParallelConfig: ...
    def start_generation(self, parallel: ParallelConfig, slots: list[int], load_from: str | None,
                         kind: str) -> Any: ...


class Failures:
    def __init__(self, host: Host) -> None:
        self.host = host
        self._stashed: list[Worker] = []  # exits a wait saw first, for the loop (``polled``)
        self._hang_checked = 0.0

    # ---- what the loop sees ------------------------------------------------------------------
    def hung(self) -> None:
        """Once a second: a live worker whose heartbeat is older than ``hang_timeout_s`` (or that
        never wrote one that long after it started) is killed; its exit is then a fail-stop."""
        h = self.host
        limit, now = h.cfg.controller.hang_timeout_s, time.time()
        if not limit or now - self._hang_checked < 1.0:
            return
        self._hang_checked = now
        for w in h.nodes.alive():
            key = beat_key(w.proc)
            last = float(h.store.get(key)) if h.store.check([key]) else w.started
            if now - last > limit:
                h.phase_log("hung", proc=w.proc, slot=w.slot, silent_s=round(now - last, 1))
                h.nodes.kill(w.proc)
                self.exited(w)  # (the kill took its exit status: no later poll reports it)
                return

    def exits(self, ws: list[Worker]) -> None:
        """Exits seen together (a whole node's, say): the Active World's failures are one fail-stop."""
        h = self.host
        if h.state.phase is Phase.SUSPENDED:
            return  # (processes stopped as the job let its last GPUs go)
        # (a process marked to leave holds its rank until the switch: its failure before is one too)
        failed = [w for w in ws if w.returncode != 0 and self._active(w)]
        for w in ws:
            if w not in failed:
                self.exited(w)
        if failed and not h.finished:
            h.mode.fail_stop(failed)

    def polled(self) -> list[Worker]:
        """Exits since the last look: those a wait consumed first (``stash``), then new ones."""
        ws, self._stashed = self._stashed + self.host.nodes.poll(), []
        return ws

    def stash(self, ws: list[Worker]) -> None:
        """Exits a wait consumed (``LiveMode.wait_for``): the loop handles them after, never lost."""
        self._stashed += ws

    def exited(self, w: Worker) -> None:
        h = self.host
        if h.finished:
            return
        if w.returncode != 0 and h.mode.breaks_handoff(w):
            return h.mode.fail_stop([w])  # at once: its peers may wait on it until a timeout
        if w.returncode == 0 or (w.leaving and not self._active(w)):
            # the job's end: every rank of the Active World done, the last one to exit checks (a
            # rank marked to leave by a handoff that the end cut short may well be the last)
            if self._active(w) and w.returncode == 0:
                codes = tuple(h.nodes.workers[p].returncode for p in h.state.active.procs)
                if job_finished(EndState(step=h.step, steps=h.cfg.steps, end_at=h.state.end_at,
                                         active_exit_codes=codes)):
                    h.go(Trigger.END)
            return
        if self._active(w):
            h.mode.fail_stop([w])
        else:
            logs.PHASES.warning(f"process {w.proc} (slot {w.slot} on node {h.nodes.where(w.proc)}, {w.role}) died: "
                                f"{h.nodes.log_tail(w.proc, 300)!r}")
            h.mode.joiner_died(w)

    def _active(self, w: Worker) -> bool:
        return self.host.state.active is not None and w.proc in self.host.state.active.procs

    def _lost_with(self, dead: list[Worker]) -> list[Worker]:
        """``dead`` and the other processes of the Active World that ended with them: processes lost
        together (every GPU of a job) end within milliseconds of each other, but are seen one poll
        at a time; those seen after ``FAILURE_GRACE_S`` are one fail-stop with them. Other exits
        stay for the loop."""
        time.sleep(FAILURE_GRACE_S)
        out, rest = list(dead), []
        for w in self.polled():
            failed = w.returncode not in (0, None) and self._active(w)
            (out if failed and w not in out else rest).append(w)
        self._stashed = rest
        return out

    # ---- what a record says of them -------------------------------------------------------------
    def says(self, dead: list[Worker]) -> str:
        """What a fail-stop's record says of its dead: the processes, their nodes, how they ended."""
        h = self.host
        lost = sorted({h.nodes.where(w.proc) for w in dead if w.returncode == NODE_LOST})
        exited = [w for w in dead if w.returncode != NODE_LOST]
        parts = [f"node {', '.join(lost)} lost (no agent sync for {h.cfg.controller.agent_timeout_s:g} s)"] if lost else []
        if exited:
            on = sorted({h.nodes.where(w.proc) for w in exited}) if len(h.nodes.nodes) > 1 else []
            parts.append(f"process {[w.proc for w in exited]}{' on ' + ', '.join(on) if on else ''} exited "
                         f"{[w.returncode for w in exited]}")
        return "; ".join(parts)

    def failed_step(self) -> int:
        """The last step the Active World holds: its rank 0's latest, or, for a recovery that
        failed again before its first step, the step it was restored to (those steps are not
        lost twice)."""
        s = self.host.state
        if s.progress is None or s.progress.generation != s.active.generation:
            began = next((r["restored_step"] for r in reversed(s.records)
                          if r.get("generation") == s.active.generation and r.get("restored_step") is not None), None)
            if began is not None:
                return began
        return self.host.step

    # ---- the fail-stop from the checkpoint -----------------------------------------------------
    def _spare_slots(self, wanted: int, silent: set[str]) -> list[int]:
        """Up to ``wanted`` slots, in slot order, of nodes that are up (no notice, not lost, not
        ``silent``) that no process of the job held and none lost."""
        h, s = self.host, self.host.state
        held = {s.slot_of[p] for p in s.active.procs}
        return [x for x in h.nodes.slots() if x not in s.lost_slots and x not in held
                and h.nodes.node_of(x).name not in silent][:wanted]

    def from_checkpoint(self, dead: list[Worker], preempted: bool = False,
                        named: ParallelConfig | None = None) -> None:
        """A rank vanished: stop everyone, restart from the latest checkpoint on the slots left.
        ``preempted``: the event in flight was a scale-in whose deadline passed; its GPUs are gone,
        so the recovery is its outcome (it is not queued again with a fresh deadline). ``named``:
        the configuration that event asked for, honoured where the survivors' count fits it (the
        record says why not otherwise)."""
        h, s = self.host, self.host.state
        t0 = time.time()
        dead = self._lost_with(dead)  # (the checkpoint's path: a moment more costs nothing here)
        old_generation = s.active.generation
        failed_step = self.failed_step()
        h.nodes.stop_all()
        # a node whose processes vanished with no word from it (its agent killed with them) shows
        # it is alive before the recovery places anything there; its ranks are lost with it
        silent = self._silent_nodes([s.slot_of[p] for p in s.active.procs], t0)
        dead_slots = lost_slots(dead, {s.slot_of[p] for p in s.active.procs
                                       if h.nodes.node_of(s.slot_of[p]).name in silent})
        s.lost_slots |= dead_slots
        # every other slot of the Active World: its own processes, and those that exited because
        # a peer vanished (their slots are healthy)
        survivors = [s.slot_of[p] for p in s.active.procs if s.slot_of[p] not in dead_slots]
        # a fail-stop starts every process afresh: idle slots of healthy nodes take the lost ones'
        # places, up to the job's size (not where a notice's scale-in or a named target is the outcome)
        spare = [] if preempted or named is not None else self._spare_slots(len(s.active.procs) - len(survivors), silent)
        gone = silent or all(w.returncode is not None and w.returncode < 0 for w in dead)
        if not survivors and gone and not spare:
            return h.suspension.every_gpu_lost(dead, failed_step, t0)
        if not survivors and not gone:  # every process ended on an error of its own: a bug to show, not GPUs lost
            tails = "\n".join(f"--- process {w.proc} (slot {w.slot}), exit {w.returncode}:\n"
                              f"{h.nodes.log_tail(w.proc, 1500)}" for w in dead)
            raise ControllerError("every process of the job died; nothing to recover on. Last words:\n" + tails)
        ck = h.suspension.newest_checkpoint()
        n = len(survivors) + len(spare)
        old = s.active.parallel
        if named is None and preempted and s.current is not None:
            named = s.current.target  # the scale-in's own target: what the notice asked for
        not_honoured = None
        if named is not None and named.world_size == n:
            parallel = named
        else:
            parallel = old if old.world_size == n else target.choose_up_to(h.adapter, h.job, n, h.hardware,
                                                                           current=old, move=RESTART_FROM_CHECKPOINT)
            if named is not None:
                not_honoured = (f"the event asked for {named.short()} ({named.world_size} GPUs); {n} survived, so "
                                f"{parallel.short()}")
        if s.current is not None:  # the event in flight: re-queued if it still applies
            self._interrupt(n, preempted)
        h.go(Trigger.FAIL_STOP)
        # (where no configuration uses every slot, the survivors' first in slot order, node by node, then
        # the spare ones; the rest idle)
        ordered = sorted(survivors) + spare
        slots, idle = ordered[:parallel.world_size], ordered[parallel.world_size:]
        took = [x for x in spare if x in slots]
        h.start_generation(parallel, slots, ck["path"] if ck else None, "recover")
        rec = EventRecord.of(
            {"kind": "fail-stop", "source": self.says(dead)}, Outcome.RECOVERED, generation=s.gen,
            old_generation=old_generation, old=old.short(), new=parallel.short(), failed_at_step=failed_step,
            restored_step=ck["step"] if ck else 0, lost_steps=failed_step - (ck["step"] if ck else 0),
            checkpoint=ck["path"] if ck else None, lost_slots=sorted(dead_slots), t_event=t0,
            # what the dead processes said last (a traceback's final line, where there was one)
            last_words={w.proc: last_line(h.nodes.log_tail(w.proc, 2000)) for w in dead},
            **({"named_not_honoured": not_honoured} if not_honoured else {}),
            **({"spare_slots": took} if took else {}),
            **({"idle_slots": idle} if idle else {}))
        s.records.append(rec)
        h.phase_log("fail-stop", **{k: rec[k] for k in ("failed_at_step", "restored_step", "lost_steps", "new",
                                                       "last_words")})

    def _silent_nodes(self, slots: list[int], t0: float) -> set[str]:
        """The nodes of ``slots`` whose agent has not synced since ``t0``, waited for up to the
        agent timeout (each is asked to sync now, ``RemoteNode.poke``: a live one answers in a
        round trip, or within its sync interval)."""
        h = self.host
        remote = [n for n in {h.nodes.node_of(sl) for sl in slots} if isinstance(n, RemoteNode)]
        for n in remote:
            n.poke()
        end = time.time() + h.cfg.controller.agent_timeout_s
        while time.time() < end and any(not n.lost and n.last_seen < t0 for n in remote):
            time.sleep(0.02)
        silent = {n.name for n in remote if n.lost or n.last_seen < t0}
        if silent:
            h.phase_log("silent-nodes", nodes=sorted(silent), why="no agent sync since the failure: their ranks "
                                                                  "are lost, no process of the recovery goes there")
        return silent

    def _interrupt(self, survivors: int, preempted: bool) -> None:
        """The event in flight at a fail-stop: queued again first where it still applies to the
        ``survivors``; else its record says how it ended."""
        h, s = self.host, self.host.state
        ev = s.current.event
        try:
            if preempted:
                raise ValueError("its deadline passed")
            h.validate(ev, survivors)
            s.current.record.settle(Outcome.REQUEUED, "interrupted by a fail-stop; re-queued")
            s.queue.appendleft(ev)
        except ValueError:
            if preempted:
                s.current.record.settle(Outcome.DEADLINE_MISSED, "deadline missed: the leaving processes were "
                                        "stopped at the deadline and the job recovered on the others")
            else:
                s.current.record.settle(Outcome.SUPERSEDED, "superseded by the fail-stop recovery")
        s.records.append(s.current.record)
        s.current = None


__all__ = ["ControllerError", "FAILURE_GRACE_S", "Failures", "last_line", "lost_slots"]
