"""A fail-stop healed from the survivors' memory (live mode): they stall at the step they reached
and report it (``Stalled``); where the survivors of one step hold every shard of the state
(``policy.heal``), the next generation is built over them at that step, on the configuration
their count allows (on fewer of them where none uses them all: the rest leave the job), each
receiving what it lacks from the replicas that kept it. Where they cannot (a shard lost with every
holder, a survivor silent or gone, the first step not trained yet) it says why and the caller
recovers from the checkpoint. The decisions are pure (``liver.policy.heal``); this is their
carrying out over the controller's store and nodes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from liver import logs
from liver.agent.node import Worker
from liver.controller.records import EventRecord, first, said
from liver.engine.digest import combine
from liver.policy import heal, target
from liver.policy.outcome import HEALED_SAYS, Outcome
from liver.protocol.messages import GenerationSpec, Stalled, SwitchReport, beat_key
from liver.protocol.store import publish_plan

if TYPE_CHECKING:
    from liver.controller.controller import Controller

SILENT_S = 3.0  # a survivor's heartbeat this old during a heal: it will not report (six beats missed)


class Healing:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def attempt(self, dead: list[Worker], parallel=None) -> EventRecord | None:
        """``_heal``; None (logged) where it could not, so the caller falls back to the checkpoint."""
        try:
            return self._heal(dead, parallel)
        except (ValueError, RuntimeError) as e:  # whatever went wrong, the checkpoint still holds
            logs.PHASES.warning(f"healing from the survivors failed ({e}); recovering from the checkpoint")
            return None

    def _heal(self, dead: list[Worker], parallel=None) -> EventRecord | None:
        """The next generation built from the survivors' own state at the step they stopped at
        (to ``parallel`` where it fits their count): its record, or None where they cannot."""
        t0, old, failed_step = time.time(), self.ctl.state.active, self.ctl.failures.failed_step()
        a, job = self.ctl.adapter, self.ctl.job
        view = heal.surviving_view(a.view(job, a.layout(job, old.parallel)), old.procs, [w.proc for w in dead])
        survivors = [old.procs[r] for r in view.ranks]
        specs = a.state_specs(job)
        missing = heal.uncovered(view, specs)
        if missing is not None:
            self.ctl.phase_log("no-heal", why=missing[:200])
            return None
        if self.ctl.state.progress is None or self.ctl.state.progress.generation != old.generation:
            self.ctl.phase_log("no-heal", why="the generation had not trained a step yet (it was starting)")
            return None
        not_honoured = None
        if parallel is None or parallel.world_size != len(survivors):
            named, parallel = parallel, target.choose_up_to(a, job, len(survivors), self.ctl.hardware,
                                                            current=old.parallel)
            if named is not None:
                not_honoured = (f"the event asked for {named.short()} ({named.world_size} GPUs); {len(survivors)} "
                                f"survived, so {parallel.short()}")
        stalled = self._wait_for(old.generation, survivors, Stalled, self.ctl.cfg.controller.heal_timeout_s, beats=True)
        if stalled is None:
            self.ctl.phase_log("no-heal", why=f"not every survivor reported (one exited, went silent, or took over "
                                          f"{self.ctl.cfg.controller.heal_timeout_s:g} s)")
            return None
        found = heal.healing_step(view, specs, {old.procs.index(p): r.step for p, r in stalled.items()})
        if found is None:
            self.ctl.phase_log("no-heal", why="no step's survivors hold the whole state: "
                                          f"{sorted({r.step for r in stalled.values()})}")
            return None
        step, view = found  # survivors a step behind give nothing and receive their shards
        left_out: list[int] = []
        if parallel.world_size < len(survivors):  # no configuration uses them all: the rest leave the job
            fewer = heal.onto_fewer(view, specs, survivors, old.procs, parallel, lambda n: getattr(
                target.best(a, job, n, self.ctl.hardware, old.parallel), "parallel", None))
            if fewer is None:
                self.ctl.phase_log("no-heal", why=f"no configuration on fewer than the {len(survivors)} survivors "
                                   "has survivors that hold the whole state")
                return None
            parallel, kept, view = fewer
            left_out, survivors = [p for p in survivors if p not in kept], kept
            for p in left_out:  # (each stops as it reads the heal's spec: its exit is no failure)
                self.ctl.nodes.workers[p].leaving = True
        givers = [old.procs[r] for r in view.ranks]
        stalled = {p: stalled[p] for p in givers}
        plan = self.ctl.plan(old.parallel, parallel, givers, survivors, old_view=view)
        self.ctl.state.gen += 1
        spec = GenerationSpec(generation=self.ctl.state.gen, parallel=parallel, procs=tuple(plan.placement), kind="heal",
                              nodes=self.ctl.node_names(plan.placement),
                              old_generation=old.generation, old_parallel=old.parallel, old_procs=tuple(givers),
                              old_ranks=view.ranks)
        publish_plan(self.ctl.store, self.ctl.state.gen, plan, self.ctl.secret)
        spec.publish(self.ctl.store)
        self.ctl.store.set(Stalled.heal_key(old.generation), str(self.ctl.state.gen))
        self.ctl.phase_log("heal", generation=self.ctl.state.gen, new=parallel.short(), procs=list(plan.placement), from_step=step,
                       bytes_moved=plan.bytes_moved)
        switched = self._wait_for(self.ctl.state.gen, survivors, SwitchReport, self.ctl.cfg.controller.prepare_timeout_s)
        if switched is None:
            return None
        self.ctl.state.active = spec
        before = None  # the survivors' state as they stopped, from their own parts of the digest
        if all(r.hashes is not None for r in stalled.values()):
            before = combine(specs, [r.hashes for r in stalled.values()], next(iter(stalled.values())).scalars)
        rec = EventRecord.of(
            {"kind": "fail-stop", "source": self.ctl.failures.says(dead)}, Outcome.HEALED, HEALED_SAYS, generation=self.ctl.state.gen,
            old_generation=old.generation, old=old.parallel.short(), new=parallel.short(), failed_at_step=failed_step,
            restored_step=step, lost_steps=max(0, failed_step - step),
            # steps the survivors completed that the lost rank 0 had not logged yet (trained, kept)
            steps_unlogged=list(range(failed_step + 1, step + 1)),
            checkpoint=None, lost_slots=sorted(w.slot for w in dead), t_event=t0,
            # survivors that stopped a step behind the others: their state was not used, they received
            stopped_behind=sorted(set(survivors) - set(givers)),
            **({"left_out": left_out} if left_out else {}),
            heal_s=time.time() - t0, bytes_moved=plan.bytes_moved,
            digest_before=before, digest_after=first(switched.values(), "digest_after"),
            digest_error=said(switched.values(), "digest_error"),
            last_words={w.proc: self.ctl.nodes.log_tail(w.proc, 2000).strip().splitlines()[-1:] for w in dead},
            **({"named_not_honoured": not_honoured} if not_honoured else {}))
        self.ctl.phase_log("healed", restored_step=step, lost_steps=rec["lost_steps"], heal_s=round(rec["heal_s"], 3))
        return rec

    def _wait_for(self, g: int, procs: list[int], cls, timeout_s: float, beats: bool = False):
        """Every process's ``cls`` report of generation ``g``, or None at the timeout or as soon as
        one of them exits (``beats``: or stops its heartbeat, stopped or hung: it will never report)."""
        end = time.time() + timeout_s
        while time.time() < end and not self.ctl.interrupted:
            got = self.ctl.collect(g, procs, cls)
            if got is not None:
                return got
            polled = self.ctl.nodes.poll()
            self.ctl.failures.stash(polled)  # (the loop handles them after: a consumed exit is never lost)
            if any(w.proc in procs for w in polled):
                return None
            if beats and self._silent(procs):
                return None
            time.sleep(0.01)
        return None

    def _silent(self, procs: list[int]) -> bool:
        """One of ``procs`` wrote no heartbeat for ``SILENT_S`` (it writes one every 0.5 s, from a
        thread of its own: it is stopped, or hung as a whole)."""
        keys = [beat_key(p) for p in procs]
        if not self.ctl.store.check(keys):
            return False
        now = time.time()
        for p, k in zip(procs, keys):
            if now - float(self.ctl.store.get(k)) > SILENT_S:
                self.ctl.phase_log("no-heal", why=f"process {p} wrote no heartbeat for {SILENT_S:g} s (stopped or hung)")
                return True
        return False


__all__ = ["Healing", "SILENT_S"]
