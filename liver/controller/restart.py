"""The stop-and-restart baseline: each event by stop (DCP save at a boundary), new processes,
DCP load with resharding. New processes as torchrun starts them: fresh interpreters (boot,
imports, first use); ``restart-forked`` gives them the agent's zygote too."""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

from liver.agent import starters
from liver.controller.mode import Mode, forked_workers
from liver.policy.events import Event
from liver.policy.outcome import Outcome
from liver.controller.phases import Phase, Trigger
from liver.controller.records import first, least, said
from liver.protocol.messages import Saved, StartReport, StopReport, read_if
from liver.runtime import preload


class RestartMode(Mode):
    name = "restart"

    @staticmethod
    def starter(backend: str, engine: str) -> dict[str, Any]:
        return starters.fresh(preload.FRESH_MODULE)

    def tick(self) -> None:
        if self.state.phase is Phase.STABLE:
            with self.ctl.lock:
                head = self.state.queue[0] if self.state.queue else None
                if head is not None and head.at_step is not None and head.at_step > self.ctl.step \
                        and self.state.announced_at != head.at_step:
                    # a step trigger is known ahead: stop exactly after that step
                    self.ctl.wish(stop_at=head.at_step)
                    self.state.announced_at = head.at_step
                due = self.ctl.events.due()
                ev = self.ctl.events.take(due[0]) if due is not None else None
            if ev is not None:
                self._begin(ev)
        elif self.state.phase is Phase.STOP:
            self._watch_stop()
        elif self.state.phase is Phase.START:
            self._watch_start()

    def _begin(self, ev: Event) -> None:
        announced = ev.at_step is not None and ev.at_step == self.state.announced_at  # (the workers stop after it)
        self.state.announced_at = None
        h = self.handle(ev)
        if h is None:
            return
        self.state.current = h
        if not announced:
            self.ctl.wish(stop_at=self.ctl.step + 1)
        for p in h.leaving:
            self.nodes.workers[p].leaving = True
        self.ctl.go(Trigger.STOP)
        self.ctl.phase_log("stop", event=ev.kind.value, old=h.record["old"], new=h.record["new"])

    def refused(self, ev: Event, e: ValueError) -> None:
        self.ctl.wish()  # (the workers were told to stop at its step: not any more)
        super().refused(ev, e)

    def _watch_stop(self) -> None:
        g = self.state.active.generation
        saved = read_if(self.store, Saved.key(g), Saved)
        if saved is None or any(self.nodes.workers[p].returncode is None for p in self.state.active.procs):
            return
        h = self.state.current
        rec = h.record
        stops = self.ctl.collect(g, list(self.state.active.procs), StopReport) or {}
        rec["save_s"] = max((r.save_s for r in stops.values()), default=0.0)
        rec["digest_before"] = first(stops.values(), "digest_before")
        rec["digest_before_s"] = least(stops.values(), "digest_before_s")
        rec["digest_error"] = said(stops.values(), "digest_error")
        rec["stopped_at"] = time.time()
        rec["checkpoint"], rec["checkpoint_format"] = saved.path, self.ctl.adapter.restart_format
        slots = [self.state.slot_of[p] for p in self.state.active.procs if p not in h.leaving] + h.join_slots
        self.ctl.go(Trigger.SAVED)
        self.ctl.start_generation(h.target, sorted(slots), saved.path, "restart")
        rec["generation"] = self.state.gen

    def _watch_start(self) -> None:
        done = self.ctl.collect(self.state.gen, list(self.state.active.procs), StartReport)
        if done is None:
            return
        h = self.state.current
        rec = h.record
        rec["digest_after"] = first(done.values(), "digest_after")
        rec["digest_after_s"] = least(done.values(), "digest_after_s")
        rec["digest_error"] = "; ".join(x for x in (rec.get("digest_error"), said(done.values(), "digest_error")) if x) or None
        rec["process_start_s"] = max(r.imported for r in done.values()) - rec["stopped_at"]
        rec["group_init_s"] = max(r.timings["group_init_s"] for r in done.values())
        rec["load_s"] = max(r.timings.get("load_s", 0.0) + r.timings["build_s"] for r in done.values())
        if h.event.deadline_s is not None:
            rec["deadline_met"] = rec["stopped_at"] <= h.deadline_at
        # every new process has loaded it: the handoff checkpoint is not needed any more (one
        # model's state on disk at a time; off the critical path)
        threading.Thread(target=shutil.rmtree, args=(rec["checkpoint"],), kwargs={"ignore_errors": True},
                         daemon=True).start()
        self.ctl.close_event(Outcome.DONE, Trigger.STARTED)
        self.ctl.phase_log("start", generation=self.state.gen, load_s=round(rec["load_s"], 4))


class ForkedRestartMode(RestartMode):
    """The baseline given the agent's zygote too: its new processes are forked from a template
    that imported everything once, so a restart pays no interpreter boot and imports."""

    name = "restart-forked"

    @staticmethod
    def starter(backend: str, engine: str) -> dict[str, Any]:
        return forked_workers(backend, engine, joiners=False)
