"""What getting to a configuration costs the job, as the target choice weighs it (``target.best``).

A change's target is not only the fastest configuration for the GPUs left: between candidates
whose steps differ by a fraction of a percent, one may be reached in a 0.1 s pause and another in
a 2 s pause, or by a restart that reads the checkpoint twice as many times. The choice takes the
candidate that trains the most over ``horizon_s`` after the change (the time the job expects on
it: by default ten minutes, the design's most frequent event rate), counting the time the move
takes from it: the least ``cost_s + horizon_s * step / fastest step``. Each way of moving is a
subclass: the live handoff's pause (the controller's, and the simulator's live policies), a
restart through storage or host memory (the simulator's baselines).
"""

from __future__ import annotations

from dataclasses import dataclass

from liver.policy import costs
from liver.policy.profile import Profile
from liver.policy.workload import Workload
from liver.topology import ParallelConfig

DEFAULT_HORIZON_S = 600.0  # one change every ten minutes (the design's densest regime)


@dataclass(frozen=True)
class Move:
    """Getting to a configuration costs nothing: the fastest step wins (a first start, or where
    no current configuration is known)."""

    horizon_s: float = DEFAULT_HORIZON_S

    def cost_s(self, job: Workload, old: ParallelConfig, new: ParallelConfig, prof: Profile) -> float:
        """The training the move from ``old`` to ``new`` stops; staying where it is, none."""
        return 0.0 if old == new else self.moving_s(job, old, new, prof)

    def moving_s(self, job: Workload, old: ParallelConfig, new: ParallelConfig, prof: Profile) -> float:
        return 0.0


@dataclass(frozen=True)
class LiveMove(Move):
    """A live handoff: the training it stops (its pause, and the stall of its preparation's steps)."""

    def moving_s(self, job: Workload, old: ParallelConfig, new: ParallelConfig, prof: Profile) -> float:
        h = costs.live(job, old, new, prof)
        return h.downtime_s + h.stall_s


@dataclass(frozen=True)
class RestartMove(Move):
    """A stop and restart through a checkpoint (``costs.restart``): saved at the change or not
    (``save``), on storage or in host memory (``memory``)."""

    memory: bool = False
    save: bool = True

    def moving_s(self, job: Workload, old: ParallelConfig, new: ParallelConfig, prof: Profile) -> float:
        return costs.restart(job, old, new, prof, memory=self.memory, save=self.save).downtime_s


STEP_ONLY = Move()
LIVE = LiveMove()
RESTART_FROM_CHECKPOINT = RestartMove(save=False)  # a fail-stop's recovery: the newest checkpoint loaded

__all__ = ["DEFAULT_HORIZON_S", "LIVE", "LiveMove", "Move", "RESTART_FROM_CHECKPOINT", "RestartMove", "STEP_ONLY"]
