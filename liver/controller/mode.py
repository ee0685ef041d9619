"""How a controller carries out its events: a strategy over its state (``ControllerState``).
The controller (``controller.py``) runs the loop every mode shares: the workers' progress, the
nodes, exits and fail-stops (``failures.py``), the suspension, the journal. Each pass it asks
its mode to ``tick``: to begin the event that is due, or to watch the one in flight through the
mode's phases. A mode also says how the node agents make worker processes (``starter``), what a
fail-stop becomes (``fail_stop``), and what a controller started again on its journal does first
(``resume``). The modes: ``LiveMode`` (``live.py``), ``RestartMode`` and ``ForkedRestartMode``
(``restart.py``); ``modes.py`` names them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch.distributed as dist

from liver.agent import starters
from liver.agent.node import Worker
from liver.config import RunConfig
from liver.controller.nodes import Nodes
from liver.controller.records import Handling
from liver.controller.state import ControllerState
from liver.policy.events import Event, EventKind
from liver.runtime import preload

if TYPE_CHECKING:
    from liver.controller.controller import Controller


def forked_workers(backend: str, engine: str, joiners: bool, start_timeout_s: float = 120.0) -> dict[str, Any]:
    """Workers forked from the agent's zygote (and cold ``joiners`` from one at idle priority):
    their imports were done before they were needed (a CPU training step rehearsed too, for CPU
    workers; GPU workers make their own CUDA context after the fork). A ``liver.agent.starters`` spec."""
    return starters.forked(preload.for_backend(backend), preload.ENTRY, (engine,), joiners=joiners,
                           start_timeout_s=start_timeout_s)


class Mode:
    name: ClassVar[str]

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    # (what every mode reads of its controller most)
    @property
    def state(self) -> ControllerState:
        return self.ctl.state

    @property
    def store(self) -> dist.Store:
        return self.ctl.store

    @property
    def nodes(self) -> Nodes:
        return self.ctl.nodes

    @property
    def cfg(self) -> RunConfig:
        return self.ctl.cfg

    # ---- what each mode says ------------------------------------------------------------------
    @staticmethod
    def starter(backend: str, engine: str) -> dict[str, Any]:
        """How this mode's node agents make worker processes (a ``liver.agent.starters`` spec)."""
        raise NotImplementedError

    def tick(self) -> None:
        """One pass of the mode's handling: begin the event that is due, or watch the one in
        flight through this mode's phases."""
        raise NotImplementedError

    def drive(self, loop: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run the controller's ``loop`` to its end (its report)."""
        return loop()

    def resume(self) -> None:
        """What a controller that came back on its journal does first about the phase it was in."""

    def fail_stop(self, dead: list[Worker], preempted: bool = False) -> None:
        """A rank of the Active World vanished (``preempted``: the leaving ranks of a scale-in
        whose deadline passed): the job goes on from the checkpoint."""
        self.ctl.failures.from_checkpoint(dead, preempted)

    def breaks_handoff(self, w: Worker) -> bool:
        """Whether ``w``'s failure leaves a handoff in flight unable to complete."""
        return False

    def joiner_died(self, w: Worker) -> None:
        """A process outside the Active World died (its log's tail is said already)."""

    # ---- shared by the modes ------------------------------------------------------------------
    def handle(self, ev: Event) -> Handling | None:
        """``ev``'s handling (its target, processes and record), or None where it is not a
        handoff: every GPU goes (the suspension takes it) or it is refused (``refused``)."""
        if ev.kind is EventKind.SCALE_IN and ev.gpus == 0:
            self.ctl.suspension.begin(ev)  # every GPU goes: the state to disk, the job waits
            return None
        if ev.kind is EventKind.SCALE_OUT:
            self.state.lost_slots.clear()  # the event reports capacity: slots lost earlier may be back
        try:
            return self.ctl.handling(ev)
        except ValueError as e:
            self.refused(ev, e)
            return None

    def refused(self, ev: Event, e: ValueError) -> None:
        """``ev`` cannot be done (``e`` says why): its record says so, the job goes on."""
        self.ctl.refuse(ev, e)


__all__ = ["Mode", "forked_workers"]
