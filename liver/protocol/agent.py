"""The messages between the controller and the node agents, typed; JSON over the control endpoint
(``POST /agent/register``, ``POST /agent/sync``), every request with the job's token.

An agent registers once (again after it lost its controller), then syncs every ``SYNC_S``: it
reports what happened on its node (processes started and exited, with the last of their logs; a
preemption notice) and the last command it carried out; the reply is every command it has not
yet acknowledged, in order. Commands are numbered per node, so one sent twice (a reply lost on
the way) is carried out once. A sync is also the agent's heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYNC_S = 0.1          # an agent's sync interval
OPS = ("start", "kill", "shutdown")
NODE_LOST = -1000     # the exit code given to a process whose node stopped syncing
KILLED = -9
IGNORE_SIGTERM = "LIVER_WORKER_IGNORE_SIGTERM"  # "1": set by an agent that takes SIGTERM as a notice


@dataclass(frozen=True, kw_only=True, slots=True)
class Register:
    """An agent offers its node: ``node`` its name (unique in the job), ``slots`` its worker slots;
    ``workers``, ``done``: the processes it still runs and the last command it carried out (an
    agent registering again: its controller came back)."""

    node: str
    slots: int
    host: str = ""
    pid: int = 0
    workers: tuple["Running", ...] = ()
    done: int = 0      # the last command it carried out


@dataclass(frozen=True, kw_only=True, slots=True)
class Registered:
    """The controller's answer: the node's first slot id in the job, what every worker spec on it
    holds (the store's address, the run directory, the worker config: passed on, never read), and
    how it makes worker processes (a ``liver.agent.starters`` spec)."""

    node: str
    slot_base: int
    base_spec: dict[str, Any]
    starter: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class Running:
    proc: int
    slot: int              # the job's slot id
    role: str
    generation: int
    pid: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Exited:
    proc: int
    returncode: int
    tail: str = ""         # the last of its log (the controller's node may not see the file)


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
    """A preemption notice the node received: its slots go ``deadline_s`` from when it was seen."""

    source: str
    deadline_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Sync:
    node: str
    done: int = 0                          # the last command carried out
    started: tuple[Running, ...] = ()
    exited: tuple[Exited, ...] = ()
    notice: Notice | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    id: int
    op: str
    proc: int = -1
    slot: int = -1
    role: str = ""
    generation: int = -1

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"command.op={self.op!r}: allowed {', '.join(OPS)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncReply:
    commands: tuple[Command, ...] = ()
    registered: bool = True   # False: the controller does not know this node (register again)
