"""No GPU left: the job's state on disk until GPUs come back. A scale-in to 0 (every GPU's notice)
saves the state at the next boundary and lets every process go; every process lost at once leaves
the newest periodic checkpoint standing; either way the job waits ``SUSPENDED``, and a scale-out
resumes it from that state on the GPUs it gives. A component the controller holds
(``Controller.suspension``); what it reads and calls of the controller is declared (``Host``)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from liver.agent.node import Worker
from liver.checkpoint.periodic import latest, saved_step
from liver.config import RunConfig
from liver.controller.nodes import Nodes
from liver.controller.phases import Trigger
from liver.controller.records import EventRecord, Handling, new_record
from liver.controller.state import ControllerState
from liver.policy.decisions import trigger_time
from liver.policy.events import Event, EventKind
from liver.policy.outcome import Outcome
from liver.protocol.messages import Saved, read_if
from liver.topology import ParallelConfig


def newest_checkpoint(run_dir: Path, start_from: str | None) -> dict[str, Any] | None:
    """The newest whole checkpoint of this run ({step, path}), else the one the job started from
    (``checkpoint.start_from``), else None (from step 0)."""
    ck = latest(run_dir / "ckpt", verify=True)  # the newest whose files are whole
    if ck is None and start_from is not None:
        step = saved_step(start_from)
        ck = {"path": start_from, "step": step if step is not None else 0}
    return ck


class Host(Protocol):
    """What the suspension needs of the controller that holds it."""

    cfg: RunConfig
    state: ControllerState
    nodes: Nodes
    store: dist.Store
    lock: threading.Lock
    run_dir: Path
    remote: bool

    @property
    def step(self) -> int: ...
    def go(self, trigger: Trigger) -> None: ...
    def phase_log(self, what: str, **kw: Any) -> None: ...
    def validate(self, ev: Event, n_before: int) -> ParallelConfig: ...
    def wish(self, wanted: int = 0, stop_at: int = 0, force: int = 0) -> None: ...
    @property
    def events(self) -> Any: ...
    @property
    def failures(self) -> Any: ...
    def refuse(self, ev: Event, e: ValueError) -> None: ...
    def start_generation(self, parallel: ParallelConfig, slots: list[int], load_from: str | None,
                          kind: str) -> None: ...


class Suspension:
    def __init__(self, host: Host) -> None:
        self.host = host

    def newest_checkpoint(self) -> dict[str, Any] | None:
        return newest_checkpoint(self.host.run_dir, self.host.cfg.checkpoint.start_from)

    def begin(self, ev: Event) -> None:
        """A scale-in to 0 (every GPU's notice): the state saved at the next boundary (the
        restart's stop), every process let go, then ``SUSPENDED`` until a scale-out; a deadline
        that comes first stops them and the periodic checkpoint is what stands."""
        c, st = self.host, self.host.state
        old = st.active
        rec = new_record(ev, c.events.arrival(ev), old.parallel, old.parallel, old.generation, c.step)
        rec["new"] = "none (0 GPUs)"
        st.current = Handling(event=ev, record=rec, leaving=list(old.procs))
        for p in old.procs:
            c.nodes.workers[p].leaving = True
        c.wish(stop_at=c.step + 1)
        st.suspending = True
        c.go(Trigger.STOP)
        c.phase_log("suspend", event=ev.describe(), old=old.parallel.short())

    def watch(self) -> None:
        """While the state is being saved: suspended once it is and every process ended, or at
        the deadline with the periodic checkpoint."""
        c, st = self.host, self.host.state
        h, g = st.current, st.active.generation
        saved = read_if(c.store, Saved.key(g), Saved)
        if saved is not None and all(c.nodes.workers[p].returncode is not None for p in st.active.procs):
            return self._suspend(saved.path, saved.step, "its state saved at the notice")
        if h.deadline_at is not None and time.time() > h.deadline_at:  # the provider takes the GPUs now
            c.nodes.stop_all()
            ck = self.newest_checkpoint()
            self._suspend(ck["path"] if ck else None, ck["step"] if ck else 0,
                          "the deadline came before the save: the periodic checkpoint stands" if ck else
                          "the deadline came before the save and no checkpoint stands: from step 0")

    def _suspend(self, path: str | None, step: int, how: str, at_step: int | None = None) -> None:
        """No GPU from here: the job waits with the state of step ``step`` at ``path`` (None: from
        step 0), the event in flight closed with it."""
        c, st = self.host, self.host.state
        now = time.time()
        st.suspended = {"path": path, "step": step, "at_step": c.step if at_step is None else at_step, "since": now,
                        "parallel": st.active.parallel.short()}
        st.suspending = False
        if st.current is not None:
            rec = st.current.record
            rec.settle(Outcome.SUSPENDED, f"suspended: every GPU gone, {how}")
            rec.update(checkpoint=path, saved_step=step, t_done=now, restored_step=step, lost_steps=c.step - step)
            if st.current.deadline_at is not None:
                rec["deadline_met"] = path is not None and step == c.step and now <= st.current.deadline_at
            st.records.append(rec)
            st.current = None
        c.go(Trigger.SUSPEND)
        c.phase_log("suspended", checkpoint=path, from_step=step, how=how)

    def every_gpu_lost(self, dead: list[Worker], failed_step: int, t0: float, source: str | None = None) -> None:
        """Every process of the job killed or its node lost: the newest checkpoint stands; the job
        waits for GPUs to come back (a scale-out, a node registering) and resumes from it."""
        c, st = self.host, self.host.state
        if st.current is not None:
            st.current.record.settle(Outcome.SUPERSEDED, "superseded: every GPU of the job is gone")
            st.records.append(st.current.record)
            st.current = None
        c.go(Trigger.FAIL_STOP)
        ck = self.newest_checkpoint()
        st.records.append(EventRecord.of(
            {"kind": "fail-stop", "source": source or c.failures.says(dead)}, Outcome.SUSPENDED,
            "suspended: every process of the job is gone; waiting for GPUs",
            old_generation=st.active.generation, old=st.active.parallel.short(),
            failed_at_step=failed_step, restored_step=ck["step"] if ck else 0,
            lost_steps=failed_step - (ck["step"] if ck else 0), checkpoint=ck["path"] if ck else None, t_event=t0))
        self._suspend(ck["path"] if ck else None, ck["step"] if ck else 0,
                      "the periodic checkpoint stands" if ck else "no checkpoint stands: from step 0", failed_step)

    def while_suspended(self) -> None:
        """In order, each queued event once due (a step trigger is due at once: no step runs): a
        scale-out resumes the job from its state on disk on the GPUs it gives; anything else is
        refused. With nothing queued and an end set (``end_after_events``), the job ends."""
        c, st = self.host, self.host.state
        with c.lock:
            ev = st.queue[0] if st.queue else None
            if ev is not None and ev.arrived is None:
                ev = st.queue[0] = replace(ev, arrived=time.time() if ev.at_step is not None else
                                           trigger_time(None, ev.at_time, 0, 0.0, 0.0, st.t_start, time.time()))
            if ev is not None and ev.arrived is not None:
                st.queue.popleft()
            else:
                ev = None  # (nothing queued, or the head's time has not come)
        if ev is None:
            if not st.queue and c.cfg.controller.end_after_events is not None and not c.remote:
                st.records.append(EventRecord.of({"kind": "end", "source": "controller"}, Outcome.ENDED,
                                                 "ended with no GPU: nothing queued would bring one back"))
                c.go(Trigger.END)
            return
        if ev.kind is EventKind.SCALE_OUT:
            st.lost_slots.clear()  # the event reports capacity
        try:
            tgt = c.validate(ev, 0)
            free = [s for s in c.nodes.free_slots() if s not in st.lost_slots]
            if len(free) < ev.gpus:
                raise ValueError(f"{ev.source}: scale-out {ev.gpus}: only {len(free)} free slots")
        except ValueError as e:
            return c.refuse(ev, e)
        s, now = st.suspended, time.time()
        st.suspended = None
        c.go(Trigger.RESUME)
        c.start_generation(tgt, free[: ev.gpus], s["path"], "resume")
        st.records.append(EventRecord.of(
            ev.to_dict(), Outcome.RESUMED, "resumed from the state on disk", gpus=ev.gpus, arrived=ev.arrived,
            t_event=now, generation=st.gen, old=s["parallel"], new=tgt.short(), checkpoint=s["path"],
            restored_step=s["step"], suspended_s=now - s["since"], lost_steps=s["at_step"] - s["step"]))
