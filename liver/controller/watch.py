"""What rank 0's step record says beyond the step: a loss that is not finite, periodic checkpoints
that failed. One ``ProgressWatch`` per controller turns each new fact into one record for the
report and one line for the terminal, once (the controller reads the record every tick)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from liver.controller.records import EventRecord
from liver.policy.outcome import Outcome
from liver.protocol.messages import Progress


@dataclass(frozen=True)
class Finding:
    record: EventRecord  # for the report (``records``)
    message: str
    error: bool             # an error for the operator, else a warning
    stop: bool = False      # the job should end at this step


@dataclass
class ProgressWatch:
    stop_on_nonfinite: bool = False   # ``controller.stop_on_nonfinite_loss``
    escalate_after: int = 3           # ``checkpoint.escalate_after``
    nonfinite_generation: int = -1    # the generation whose non-finite loss was said
    failures_seen: int = 0            # checkpoint failures in a row last said
    failures_total: int = 0           # checkpoint failures said in all (``/metrics``)

    def see(self, p: Progress | None) -> list[Finding]:
        if p is None:
            return []
        return [f for f in (self._nonfinite(p), self._checkpoint(p)) if f is not None]

    def _nonfinite(self, p: Progress) -> Finding | None:
        """A loss that is not finite: said once per generation (a run whose every loss was NaN
        once reported its handoffs as done, and nothing else)."""
        if math.isfinite(p.loss) or self.nonfinite_generation == p.generation:
            return None
        self.nonfinite_generation = p.generation
        msg = (f"loss {p.loss} at step {p.step} (generation {p.generation}): not finite; "
               + ("the job ends here (controller.stop_on_nonfinite_loss)" if self.stop_on_nonfinite
                  else "training goes on"))
        return Finding(EventRecord.of({"kind": "non-finite-loss", "source": f"step {p.step}"},
                                      Outcome.ESCALATED if self.stop_on_nonfinite else Outcome.REPORTED, msg,
                                      step=p.step, generation=p.generation, t_event=time.time()),
                       msg, error=True, stop=self.stop_on_nonfinite)

    def _checkpoint(self, p: Progress) -> Finding | None:
        """A periodic checkpoint that failed, saying which one stands; ``escalate_after`` in a row
        is an error: a fail-stop now would roll back that far."""
        if p.checkpoint_failures <= self.failures_seen:
            if p.checkpoint_failures == 0:
                self.failures_seen = 0
            return None
        self.failures_seen = p.checkpoint_failures
        self.failures_total += 1
        stands = (f"the checkpoint of step {p.checkpoint_step} stands ({p.step - p.checkpoint_step} steps back)"
                  if p.checkpoint_step is not None else "no checkpoint stands: a fail-stop now restarts from step 0")
        escalated = p.checkpoint_failures >= self.escalate_after
        msg = (f"checkpoint failed ({p.checkpoint_failures} in a row) at step {p.step}: {p.checkpoint_error}; "
               f"{stands}")
        return Finding(EventRecord.of({"kind": "checkpoint-failed", "source": f"step {p.step}"},
                                      Outcome.ESCALATED if escalated else Outcome.REPORTED,
                                      "escalated: " + msg if escalated else msg, step=p.step,
                                      failures_in_a_row=p.checkpoint_failures, error=p.checkpoint_error,
                                      checkpoint_step=p.checkpoint_step, t_event=time.time()),
                       ("ESCALATED: " if escalated else "") + msg, error=escalated)
