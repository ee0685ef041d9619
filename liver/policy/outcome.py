"""What became of an event: its record's ``outcome``, a value every reader compares (the report,
``/metrics``, the benches, the simulator's calibration); the record's ``status`` is the sentence
a person reads, made beside it and never matched.

The controller keeps each record typed (``liver.controller.records.EventRecord``); in its report
form, plain JSON, ``outcome`` is the enum's value. ``outcome_of`` reads a record in that form, and
also one written before ``outcome`` existed (the reports committed under bench/results), from its
sentence, in this one place.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Outcome(str, Enum):
    STARTED = "started"                  # in flight
    DONE = "done"                        # handled as asked (live, or by stop-and-restart)
    HEALED = "healed"                    # a fail-stop, healed from the surviving replicas
    DROPPED = "dropped"                  # a scale-in no handoff met in time: its leaving replicas stopped
    RECOVERED = "recovered"              # a fail-stop (or a broken handoff), from the checkpoint
    RESUMED = "resumed"                  # from the state on disk (after a suspension, or an earlier run's)
    CANCELLED = "cancelled"              # given up before its switch (a joiner lost, a deadline, ...)
    REFUSED = "refused"                  # invalid when it arrived: nothing moved
    WITHDRAWN = "withdrawn"              # taken back before it was handled
    MERGED = "merged"                    # a notice folded into the pending scale-out
    REQUEUED = "requeued"                # interrupted (a fail-stop, a controller restart): queued again
    DEADLINE_MISSED = "deadline-missed"  # its leaving processes were stopped at the deadline
    SUPERSEDED = "superseded"            # every GPU of the job went first
    SUSPENDED = "suspended"              # every process gone: the state on disk, waiting for GPUs
    ENDED = "ended"                      # with no GPU and nothing queued that would bring one
    NOT_COMPLETED = "not-completed"      # in flight when the job ended
    NOT_REACHED = "not-reached"          # queued when the job ended
    REPORTED = "reported"                # a finding (a non-finite loss, a failed checkpoint)
    ESCALATED = "escalated"              # a finding that is an error


#: the events after which the job trains on a state a switch or a recovery made
SETTLED = frozenset({Outcome.DONE, Outcome.RECOVERED, Outcome.HEALED, Outcome.DROPPED})
#: a fail-stop or a deadline answered without the checkpoint: steps lost are the survivors' own
WITHOUT_CHECKPOINT = frozenset({Outcome.HEALED, Outcome.DROPPED})

HEALED_SAYS = "healed from the surviving replicas"
DROPPED_SAYS = ("done: no handoff fits the deadline; the leaving replicas were stopped and the survivors went on "
                "from their own state")


def outcome_of(record: dict[str, Any]) -> Outcome:
    if "outcome" in record:
        return Outcome(record["outcome"])
    return _from_sentence(str(record.get("status", "")))


_LEGACY = (("healed", Outcome.HEALED), ("recovered", Outcome.RECOVERED), ("resumed", Outcome.RESUMED),
           ("cancelled", Outcome.CANCELLED), ("refused", Outcome.REFUSED), ("withdrawn", Outcome.WITHDRAWN),
           ("merged", Outcome.MERGED), ("interrupted", Outcome.REQUEUED), ("deadline missed", Outcome.DEADLINE_MISSED),
           ("superseded", Outcome.SUPERSEDED), ("suspended", Outcome.SUSPENDED), ("ended", Outcome.ENDED),
           ("not completed", Outcome.NOT_COMPLETED), ("not reached", Outcome.NOT_REACHED),
           ("escalated", Outcome.ESCALATED), ("started", Outcome.STARTED), ("done", Outcome.DONE))


def _from_sentence(status: str) -> Outcome:
    """A record from before ``outcome``: its sentence's opening words (the one place they are read)."""
    if status == DROPPED_SAYS:
        return Outcome.DROPPED
    for opening, outcome in _LEGACY:
        if status.startswith(opening):
            return outcome
    return Outcome.REPORTED
