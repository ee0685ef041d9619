"""The events waiting, in the order they will be handled: what an operator adds and takes back
over the control endpoint, each one's trigger time stamped once it happens, and the one due next
(``decisions.next_event``). A component the controller holds (``Controller.events``) over its
state's ``queue``; what it reads of the controller is declared (``Host``)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from liver.config import RunConfig
from liver.controller.admission import without
from liver.controller.nodes import Nodes, RemoteNode
from liver.controller.phases import Phase
from liver.controller.records import EventRecord
from liver.controller.state import ControllerState
from liver.policy import target
from liver.policy.decisions import last_step, next_event, next_notice, trigger_time
from liver.policy.events import Event, parse_action
from liver.policy.outcome import Outcome
from liver.topology import ParallelConfig


class Host(Protocol):
    """What the queue needs of the controller that holds it."""

    cfg: RunConfig
    state: ControllerState
    nodes: Nodes
    lock: threading.Lock
    run_dir: Path
    adapter: Any
    job: Any

    @property
    def hardware(self) -> target.Hardware: ...
    def capacity(self) -> int: ...
    def validate(self, ev: Event, n_before: int) -> ParallelConfig: ...


class EventQueue:
    def __init__(self, host: Host) -> None:
        self.host = host

    @property
    def state(self) -> ControllerState:
        return self.host.state

    def submit(self, action: str) -> dict[str, Any]:
        """From the control endpoint: validate against the GPUs the job will have, then queue."""
        ev = replace(parse_action(action.strip(), "http"), arrived=time.time())
        with self.host.lock:
            self.host.validate(ev, self.projected_gpus())
            self.state.queue.append(ev)
            return {"accepted": ev.describe(), "position": len(self.state.queue)}

    def queued(self) -> dict[str, Any]:
        """The events waiting, in the order they will be handled (the one in flight apart)."""
        with self.host.lock:
            return {"in_flight": self.state.current.event.describe() if self.state.current else None,
                    "queued": [{"position": i + 1, "event": ev.describe(), "source": ev.source}
                               for i, ev in enumerate(self.state.queue)]}

    def withdraw(self, position: int) -> dict[str, Any]:
        """From the control endpoint: take a queued event back (the one in flight cannot be)."""
        with self.host.lock:
            n_now = self.state.current.record["gpus"] if self.state.current else len(self.state.active.procs) if self.state.active \
                else self.host.cfg.gpus
            events = list(self.state.queue)
            rest = without(events, position, n_now, self.host.capacity(), self.host.adapter, self.host.job,
                           self.host.hardware)
            self.state.queue.clear()
            self.state.queue.extend(rest)
            gone = events[position - 1]
        self.state.records.append(EventRecord.of(gone.to_dict(), Outcome.WITHDRAWN, "withdrawn before it was handled"))
        return {"withdrawn": gone.describe(), "queued": len(rest)}

    def projected_gpus(self) -> int:
        n = 0 if self.state.suspended is not None else len(self.state.active.procs) if self.state.active else self.host.cfg.gpus
        if self.state.current is not None:
            n = self.state.current.record["gpus"]
        for ev in self.state.queue:
            n = ev.gpus
        return n

    def due(self, notices_only: bool = False) -> tuple[int, Event] | None:
        """The queued event to handle next and its position (``decisions.next_event``: the head
        once triggered, else a triggered notice wherever it waits); ``notices_only``: the first
        triggered notice. Called with the lock held."""
        if not self.state.queue or self.state.ending:  # (an operator's end: no new event begins)
            return None
        if any(isinstance(n, RemoteNode) and (n.resumed or n.settling()) for n in self.host.nodes.up()):
            return None  # a controller that came back: not before its nodes said what they run, and
            # the processes of the generation it withdrew have ended (their slots free again)
        if self.state.progress is None or self.state.active is None or self.state.progress.generation != self.state.active.generation:
            return None  # the Active World has not trained a step yet (it starts, or recovers)
        if self.state.progress.step >= last_step(self.host.cfg.steps, self.state.end_at):
            return None  # its last step is trained: its ranks are ending (an event seen only now,
            # by a loop slowed on a loaded machine, is not reached; it would stop ranks that end)
        queue = list(self.state.queue)
        i = (next_notice if notices_only else next_event)(queue, lambda ev: ev.arrived is not None)
        return (i, queue[i]) if i is not None else None

    def take(self, i: int) -> Event:
        ev = self.state.queue[i]
        del self.state.queue[i]
        return ev

    def stamp_triggers(self) -> None:
        """Each queued event whose trigger happened gets its time (``decisions.trigger_time``),
        once: its deadline and its record's ``t_triggered`` count from there."""
        p = self.state.progress
        if p is None or self.state.active is None or p.generation != self.state.active.generation:
            return
        now, ends = time.time(), None
        with self.host.lock:
            for i, ev in enumerate(self.state.queue):
                if ev.after_previous is not None and ev.at_step is None:
                    if i > 0 or self.state.current is not None or self.state.phase is not Phase.STABLE:
                        continue  # (``step +N``: counted from the end of the event before it)
                    ev = self.state.queue[i] = replace(ev, at_step=p.step + ev.after_previous)
                if ev.arrived is None:
                    if ends is None and p.ends:  # (parsed only when an event waits for its trigger)
                        ends = {int(k): t for k, t in p.ends.items()}
                    if ev.at_step is not None and ev.at_step < p.step and ev.at_step not in (ends or {}):
                        ends = {**(ends or {}), **self._logged_end(ev.at_step, p.generation)}
                    self.state.queue[i] = replace(ev, arrived=trigger_time(ev.at_step, ev.at_time, p.step, p.time, p.step_s,
                                                                     self.state.t_start, now, ends))

    def _logged_end(self, step: int, generation: int) -> dict[int, float]:
        """{step: its end} from rank 0's log of steps (``steps.jsonl``, where this machine has it),
        for a trigger seen later than the step ends a record carries (a controller slowed down);
        else nothing, and the trigger is counted back from the latest step."""
        for line in reversed((self.host.run_dir / "steps.jsonl").read_text().splitlines()
                             if (self.host.run_dir / "steps.jsonl").exists() else []):
            try:
                s = json.loads(line)
            except ValueError:  # (a line being written)
                continue
            if s.get("step") == step and s.get("generation") == generation:
                return {step: float(s["time"])}
        return {}

    def arrival(self, ev: Event) -> float:
        """When the event reached the job: a notice's deadline counts from here, even if the event
        waited behind another one (the provider does not wait)."""
        if ev.arrived is not None:
            return ev.arrived
        if ev.at_time is not None and self.state.t_start is not None:
            return self.state.t_start + ev.at_time
        return time.time()


__all__ = ["EventQueue"]
