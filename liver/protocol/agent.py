"""The messages between the controller and the node agents, typed; JSON over the control endpoint
(``POST /agent/register``, ``POST /agent/sync``), every request with the job's token.

An agent registers once (again after it lost its controller), then syncs every ``SYNC_S``: it
reports what happened on its node (processes started and exited, with the last of their logs; a
preemption notice) and the last command it carried out; the reply is every command it has not
yet acknowledged, in order. Commands are numbered per node, so one sent twice (a reply lost on
the way) is carried out once. A sync is also the agent's heartbeat.

Where the controller takes them (``SyncReply.waits``), an agent's heartbeat is a standing wait
instead (``POST /agent/wait``, a ``Wait``): the controller holds its answer until it has a command
for the node, or wants the node to sync (``RemoteNode.poke``), or the node's sync interval passed,
and the agent sends the next one at once; it syncs only with news, when a wait says so, and at
least every ``QUIET_SYNC_S`` (every interval again while its waits go unanswered). A command then reaches its node in a round trip, not at the node's
next sync (up to its interval: 1 s at 1,000 nodes), for the same number of requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYNC_S = 0.1          # an agent's sync interval
QUIET_SYNC_S = 30.0   # with standing waits answered: a sync at least this often all the same
OPS = ("start", "kill", "shutdown")
NODE_LOST = -1000     # the exit code given to a process whose node stopped syncing
KILLED = -9
IGNORE_SIGTERM = "LIVER_WORKER_IGNORE_SIGTERM"  # "1": set by an agent that takes SIGTERM as a notice


MAX_SLOTS = 4096  # an agent's worker slots
MAX_WAIT_S = 60.0  # the longest a ``Wait`` may ask to be held
MAX_TAIL = 4000   # the characters of a dead process's log an agent sends


def node_name(name: str, where: str) -> str:
    """A node's name as the job knows it: 1 to 200 printable characters, no slash (it names files)."""
    if not 1 <= len(name) <= 200 or not name.isprintable() or "/" in name or name.strip() != name:
        raise ValueError(f"{where}={name[:60]!r}: allowed 1 to 200 printable characters, no slash, no "
                         f"leading or trailing space")
    return name


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

    def __post_init__(self) -> None:
        node_name(self.node, "register.node")
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ValueError(f"register.slots={self.slots!r}: allowed 1 to {MAX_SLOTS}")
        if not 0 <= self.done < 2**53:
            raise ValueError(f"register.done={self.done!r}: allowed 0 to 2**53 - 1")


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

    def __post_init__(self) -> None:
        for name in ("proc", "slot", "generation", "pid"):
            v = getattr(self, name)
            if not 0 <= v < 2**31:
                raise ValueError(f"running.{name}={v!r}: allowed 0 to 2**31 - 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class Exited:
    proc: int
    returncode: int
    tail: str = ""         # the last of its log (the controller's node may not see the file)

    def __post_init__(self) -> None:
        if len(self.tail) > MAX_TAIL:
            object.__setattr__(self, "tail", self.tail[-MAX_TAIL:])


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
    """A preemption notice the node received: its slots go ``deadline_s`` from when it was seen."""

    source: str
    deadline_s: float

    def __post_init__(self) -> None:
        if not 0 <= self.deadline_s <= 86400:  # (NaN fails too)
            raise ValueError(f"notice.deadline_s={self.deadline_s!r}: allowed 0 to 86400 s")


@dataclass(frozen=True, kw_only=True, slots=True)
class Sync:
    node: str
    done: int = 0                          # the last command carried out
    started: tuple[Running, ...] = ()
    exited: tuple[Exited, ...] = ()
    notice: Notice | None = None

    def __post_init__(self) -> None:
        node_name(self.node, "sync.node")
        if not 0 <= self.done < 2**53:
            raise ValueError(f"sync.done={self.done!r}: allowed 0 to 2**53 - 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class Wait:
    """An agent's standing request, its heartbeat: answered once the controller has a command for
    ``node`` numbered after ``after`` (the last it took) or wants it to sync, or after ``wait_s``
    (at most the node's sync interval)."""

    node: str
    after: int = 0
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        node_name(self.node, "wait.node")
        if not 0 <= self.after < 2**53:
            raise ValueError(f"wait.after={self.after!r}: allowed 0 to 2**53 - 1")
        if not 0 <= self.wait_s <= MAX_WAIT_S:  # (NaN fails too)
            raise ValueError(f"wait.wait_s={self.wait_s!r}: allowed 0 to {MAX_WAIT_S:g} s")


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitReply:
    ready: bool   # sync now: a command waits, the controller asks, or the node is to register again
    next_sync_s: float = SYNC_S  # the node's sync interval now (how long the next wait is held at most)


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
    next_sync_s: float = SYNC_S  # when to sync next with nothing to report (the controller's load)
    waits: bool = False       # the controller takes standing waits (``Wait``) as the node's heartbeat
