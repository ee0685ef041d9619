"""The controller's phases and the only transitions between them, as a table.

Live handoff::

    STABLE --begin--> PREPARE --ready--> READY --commit--> SWITCH --switched--> CLEANUP --cleaned--> STABLE
                         |  ^                |
                         |  +----replan------+  (cancelled: a joiner died, a notice merged, a failure)
                         +---cancel--> STABLE <--cancel--+

Restart baseline::

    STABLE --stop--> STOP --saved--> START --started--> STABLE

No GPU left (a scale-in to 0, the last node's notice, every process lost)::

    STABLE --stop--> STOP --suspend--> SUSPENDED --resume--> STABLE   (its state saved at the notice)
    STABLE --suspend--> SUSPENDED                                   (after a fail-stop: the checkpoint)

From any phase, a fail-stop goes to STABLE (a recovery generation starts), and the job's end to
ENDED. A ``commit`` may be seen before ``ready`` (rank 0 decided between two polls of the
controller): PREPARE --commit--> SWITCH.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    STABLE = "stable"
    PREPARE = "prepare"
    READY = "ready"
    SWITCH = "switch"
    CLEANUP = "cleanup"
    STOP = "stop"
    START = "start"
    SUSPENDED = "suspended"  # no GPU: the state is on disk, the job waits for GPUs to come back
    ENDED = "ended"


class Trigger(enum.Enum):
    BEGIN = "begin"
    READY = "ready"
    COMMIT = "commit"
    SWITCHED = "switched"
    CLEANED = "cleaned"
    CANCEL = "cancel"
    REPLAN = "replan"
    STOP = "stop"
    SAVED = "saved"
    STARTED = "started"
    FAIL_STOP = "fail-stop"
    SUSPEND = "suspend"
    RESUME = "resume"
    END = "end"


P, T = Phase, Trigger
TRANSITIONS: dict[tuple[Phase, Trigger], Phase] = {
    (P.STABLE, T.BEGIN): P.PREPARE,
    (P.PREPARE, T.READY): P.READY,
    (P.PREPARE, T.COMMIT): P.SWITCH,
    (P.READY, T.COMMIT): P.SWITCH,
    (P.PREPARE, T.CANCEL): P.STABLE,
    (P.READY, T.CANCEL): P.STABLE,
    (P.PREPARE, T.REPLAN): P.PREPARE,
    (P.READY, T.REPLAN): P.PREPARE,
    (P.SWITCH, T.SWITCHED): P.CLEANUP,
    (P.CLEANUP, T.CLEANED): P.STABLE,
    (P.STABLE, T.STOP): P.STOP,
    (P.STOP, T.SAVED): P.START,
    (P.START, T.STARTED): P.STABLE,
    (P.STOP, T.SUSPEND): P.SUSPENDED,
    (P.STABLE, T.SUSPEND): P.SUSPENDED,
    (P.SUSPENDED, T.RESUME): P.STABLE,
    **{(p, T.FAIL_STOP): P.STABLE for p in Phase if p is not P.ENDED},
    **{(p, T.END): P.ENDED for p in Phase if p is not P.ENDED},
}

#: phases in which a generation is pending (prepared, not yet the Active World)
PENDING = frozenset({P.PREPARE, P.READY})


class TransitionError(RuntimeError):
    """A transition the table does not have: a controller bug, never a user's mistake."""


def advance(phase: Phase, trigger: Trigger) -> Phase:
    try:
        return TRANSITIONS[(phase, trigger)]
    except KeyError:
        raise TransitionError(f"no transition from {phase.value} on {trigger.value}") from None
