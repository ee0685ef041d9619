"""What the controller knows of its job, as one value: ``ControllerState`` is exactly what the
journal saves (``journal.py``) and what a controller started again on the same run restores
(``liver controller --resume``). Everything else the controller holds is made again from its
configuration (the store's connection, the endpoint, the nodes' live objects) or is the loop's
own bookkeeping (timers, caches).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from liver.controller.phases import Phase
from liver.controller.records import EventRecord, Handling
from liver.policy.events import Event
from liver.protocol.messages import GenerationSpec, Progress


@dataclass
class ControllerState:
    # ---- the job's generations -------------------------------------------------------------
    gen: int = -1                             # the newest generation's id (monotonic, never reused)
    active: GenerationSpec | None = None      # the Active World
    pending: GenerationSpec | None = None     # live mode: the Shadow World being prepared or switched to
    members: list[int] = field(default_factory=list)  # live mode: every process of the old and the pending one
    slot_of: dict[int, int] = field(default_factory=dict)  # process -> the job's slot it runs on
    lost_slots: set[int] = field(default_factory=set)      # slots whose processes died (until a scale-out)
    fenced: dict[int, float] = field(default_factory=dict)  # process -> when it was fenced (its node declared lost)
    phase: Phase = Phase.STABLE
    progress: Progress | None = None          # the Active World's latest step, as its rank 0 reported it
    t_start: float | None = None              # when the first step ended (``at Ts`` triggers count from it)
    started_at: float = field(default_factory=time.time)
    # ---- events ------------------------------------------------------------------------------
    queue: collections.deque[Event] = field(default_factory=collections.deque)  # waiting, in order
    current: Handling | None = None           # the event being handled
    records: list[EventRecord] = field(default_factory=list)  # every event's record, in order
    missed: Handling | None = None            # live mode: the scale-in whose missed deadline the next heal completes
    announced_at: int | None = None           # restart mode: the step the workers were told ahead to stop after
    # ---- nodes -------------------------------------------------------------------------------
    joined: list[str] = field(default_factory=list)   # nodes that registered, their slots not yet offered
    noticed: set[str] = field(default_factory=set)    # nodes whose notice was queued
    # ---- the job's end and its suspension ------------------------------------------------------
    end_at: int = 0                           # the step the job ends after, where it ends early (0: none)
    end_requested: int | None = None          # POST /end: steps from the next stable step
    ending: bool = False                      # an end was set: no new event begins
    suspended: dict[str, Any] | None = None   # no GPU: where the state is, since when
    suspending: bool = False                  # a scale-in to 0 saves the state before it suspends
