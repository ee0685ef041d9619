"""The controller's view of the job's nodes: which node holds which slots, which process runs
where, which nodes are up. A node is either the agent inside the controller's own process
(``liver.agent.node.NodeAgent``, for ``liver run``) or a ``RemoteNode``: the controller's side of
a ``liver agent`` process it talks to by ``liver.protocol.agent`` messages.

Slot ids are the job's: a node that registers gets the next free range, never reused, so a slot
id names one GPU of one node for the whole job. Everything the controller asks of workers (start,
kill, poll for exits, wait, log tails) goes through ``Nodes`` to the node that holds the slot.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import zlib
from typing import Any, Callable, Iterable, Protocol

from liver.agent.node import Worker
from liver.protocol.agent import KILLED, NODE_LOST, Command, Running, Sync, SyncReply


class Node(Protocol):
    name: str
    slot_base: int
    slots: int
    workers: dict[int, Worker]
    lost: bool      # stopped answering: its processes are gone
    notice: Any     # a preemption notice it received (its slots are going), or None

    def free_slots(self) -> list[int]: ...
    def start(self, proc: int, slot: int, role: str, generation: int) -> Worker: ...
    def poll(self) -> list[Worker]: ...
    def kill(self, proc: int) -> None: ...
    def wait(self, procs: list[int], timeout_s: float) -> bool: ...
    def log_tail(self, proc: int, chars: int = 2000) -> str: ...
    def stop_all(self) -> None: ...
    def shutdown(self) -> None: ...


DELIVERIES = 100  # the commands whose delivery times a node keeps (for /status and /metrics)


class RemoteNode:
    """A ``liver agent`` on some node, as the controller sees it: commands wait here until the
    agent's next sync takes them; what it reports (pids, exits and their log tails) lands here.
    The sync comes from the endpoint's threads, the controller reads from its loop: one lock."""

    def __init__(self, name: str, slot_base: int, slots: int, host: str = "",
                 workers: Iterable[Running] = (), agent_pid: int = 0) -> None:
        self.name, self.slot_base, self.slots, self.host = name, slot_base, slots, host
        self.agent_pid = agent_pid  # its agent's process (0: unknown), on ``host``
        self.workers: dict[int, Worker] = {}
        self.commands: list[Command] = []
        self._next = 1
        self.done = 0
        self.last_seen = time.time()   # its last sync (what it reports is known up to here)
        self.last_heard = self.last_seen  # ... or standing wait: its heartbeat
        self.poked = False       # the controller asked it to sync (its standing wait answers)
        self.phase = zlib.crc32(name.encode()) / 2**32  # where in each sync interval its waits end
        self.lost = False        # stopped syncing: its processes are gone for the job
        self.notice: Any = None  # the preemption notice it reported (``Notice``), once
        self._exits: list[Worker] = []
        self._tails: dict[int, str] = {}
        self.cond = threading.Condition()
        self.resumed = False     # restored from a journal: its agent has not registered again yet
        # processes of a generation withdrawn after they started (by a controller that died): each
        # ends by itself once it sees the withdrawal, else it is stopped at its time (``reap``)
        self.withdrawn: dict[int, float] = {}
        self._fresh_from = 1 << 62  # restored: the first command id sent since (none the agent saw)
        self.queued_at: dict[int, float] = {}  # a command not yet taken by a sync: when it was queued
        self.delivery_s: list[float] = []      # each command's wait from queued to taken (the newest ``DELIVERIES``)
        for r in workers:  # (a controller that came back: the agent's processes carry on)
            self.workers[r.proc] = Worker(r.proc, r.slot, r.role, r.generation, r.pid, time.time())

    # ---- the controller's side -------------------------------------------------------------
    def free_slots(self) -> list[int]:
        with self.cond:
            busy = {w.slot for w in self.workers.values() if w.returncode is None}
        return [s for s in range(self.slot_base, self.slot_base + self.slots) if s not in busy]

    def start(self, proc: int, slot: int, role: str, generation: int) -> Worker:
        with self.cond:
            w = Worker(proc, slot, role, generation, 0, time.time())
            self.workers[proc] = w
            self._send(op="start", proc=proc, slot=slot, role=role, generation=generation)
        return w

    def kill(self, proc: int) -> None:
        """Killed as far as the job is concerned from now on; the agent kills it at its next sync,
        before anything sent after (a new process in the same slot)."""
        with self.cond:
            w = self.workers[proc]
            if w.returncode is None:
                w.returncode = KILLED
                self._send(op="kill", proc=proc)

    def poll(self) -> list[Worker]:
        with self.cond:
            out, self._exits = self._exits, []
            return out

    def let_end(self, proc: int, grace_s: float) -> None:
        """A process of a withdrawn generation: not stopped at once (a member of a group rendezvous
        stopped there holds the others in it until their timeout); stopped after ``grace_s`` if it
        has not ended by itself."""
        with self.cond:
            self.withdrawn[proc] = time.time() + grace_s

    def reap(self, now: float) -> None:
        """Those of ``let_end`` that have ended are forgotten; those past their time are stopped."""
        with self.cond:
            for p, at in list(self.withdrawn.items()):
                if self.workers[p].returncode is not None:
                    del self.withdrawn[p]
                elif now > at:
                    self.kill(p)
                    del self.withdrawn[p]

    def settling(self) -> bool:
        """A withdrawn generation's process still runs here (its slot is not free yet)."""
        with self.cond:
            return bool(self.withdrawn)

    def wait(self, procs: list[int], timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: all(self.workers[p].returncode is not None for p in procs), timeout_s)

    def log_tail(self, proc: int, chars: int = 2000) -> str:
        with self.cond:
            return self._tails.get(proc, "")[-chars:]

    def stop_all(self) -> None:
        for p in [w.proc for w in self.workers.values() if w.returncode is None]:
            self.kill(p)

    def shutdown(self) -> None:
        self.stop_all()
        with self.cond:
            self._send(op="shutdown")

    def mark_lost(self) -> list[Worker]:
        """The node stopped syncing: every process it ran is gone (returned, as exited)."""
        with self.cond:
            self.lost = True
            gone = [w for w in self.workers.values() if w.returncode is None]
            for w in gone:
                w.returncode = NODE_LOST
            self.cond.notify_all()  # (a standing wait of its agent answers: it is to register again)
            return gone

    def same_agent(self, host: str, pid: int) -> bool:
        """Whether a registration under this node's name comes from the agent it already knows
        (one that lost its controller, or a reply) rather than a new one (the node came back)."""
        return self.agent_pid == 0 or pid == 0 or (host, pid) == (self.host, self.agent_pid)

    def running(self) -> list[Worker]:
        with self.cond:
            return [w for w in self.workers.values() if w.returncode is None]

    # ---- a controller that came back ---------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """What the journal keeps of it."""
        with self.cond:
            return {"name": self.name, "slot_base": self.slot_base, "slots": self.slots, "host": self.host,
                    "agent_pid": self.agent_pid, "next": self._next, "done": self.done, "lost": self.lost, "notice": self.notice,
                    "commands": list(self.commands), "workers": [dataclasses.replace(w) for w in self.workers.values()]}

    @classmethod
    def restored(cls, rec: dict[str, Any]) -> "RemoteNode":
        n = cls(rec["name"], rec["slot_base"], rec["slots"], rec["host"], agent_pid=rec.get("agent_pid", 0))
        n._next, n.done, n.lost, n.notice, n.commands = rec["next"], rec["done"], rec["lost"], rec["notice"], rec["commands"]
        n.workers = {w.proc: w for w in rec["workers"]}
        n.resumed, n._fresh_from = not n.lost, rec["next"]
        return n

    def count_after(self, done: int) -> None:
        """A node new to this controller whose agent has carried out commands up to ``done`` (of a
        controller that died before its journal knew the node): this one's commands are numbered
        after them, so that none is taken for one already carried out."""
        with self.cond:
            self.done, self._next = done, done + 1

    def reconcile(self, running: Iterable[Running], done: int) -> None:
        """Its agent registered again: what it runs is the truth. A process the journal has alive
        and the agent does not ended while the controller was away (reported as exited, its code
        unknown: -1); one the journal never saw is taken in. Commands not yet carried out are
        numbered after the agent's last."""
        with self.cond:
            now = {r.proc: r for r in running}
            # (a process whose start it has not carried out yet is not missing: it comes)
            coming = {c.proc for c in self.commands if c.op == "start" and (c.id > done or c.id >= self._fresh_from)}
            for w in self.workers.values():
                if w.returncode is None and w.proc not in now and w.proc not in coming:
                    w.returncode = -1
                    self._exits.append(w)
            for r in now.values():
                if r.proc not in self.workers:
                    self.workers[r.proc] = Worker(r.proc, r.slot, r.role, r.generation, r.pid, time.time())
                else:
                    self.workers[r.proc].pid = r.pid
            self.done = max(self.done, done)
            first = self.done + 1
            # what it carried out is dropped; what was sent since the controller came back is kept
            keep = [c for c in self.commands if c.id > done or c.id >= self._fresh_from]
            self.commands = [dataclasses.replace(c, id=first + i) for i, c in enumerate(keep)]
            self.queued_at = {first + i: self.queued_at[c.id] for i, c in enumerate(keep) if c.id in self.queued_at}
            self._next = first + len(self.commands)
            self.last_seen, self.resumed, self._fresh_from = time.time(), False, 1 << 62
            self.last_heard = self.last_seen
            self.cond.notify_all()

    def _send(self, **kw: Any) -> None:
        self.commands.append(Command(id=self._next, **kw))
        self.queued_at[self._next] = time.time()
        self._next += 1
        self.cond.notify_all()  # (its agent's standing wait answers)

    # ---- the agent's side (the endpoint's threads) ----------------------------------------
    def await_command(self, after: int, wait_s: float) -> bool:
        """An agent's standing wait (``protocol.agent.Wait``), its heartbeat: True as soon as a
        command numbered after ``after`` is queued for the node, the controller asks it to sync
        (``poke``), or it is lost (it is to register again); False after ``wait_s``."""
        with self.cond:
            self.last_heard = time.time()
            return self.cond.wait_for(lambda: self.lost or self.poked or any(c.id > after for c in self.commands),
                                      wait_s)

    def poke(self) -> None:
        """Its agent is to sync now (its standing wait answers; an agent without one syncs within
        its interval)."""
        with self.cond:
            self.poked = True
            self.cond.notify_all()

    def sync(self, msg: Sync) -> SyncReply:
        with self.cond:
            self.last_seen = self.last_heard = time.time()
            self.poked = False
            self.done = max(self.done, msg.done)
            self.commands = [c for c in self.commands if c.id > self.done]
            for r in msg.started:
                if r.proc in self.workers:
                    self.workers[r.proc].pid = r.pid
            for e in msg.exited:
                self._tails[e.proc] = e.tail
                w = self.workers.get(e.proc)
                if w is not None and w.returncode is None:
                    w.returncode = e.returncode
                    self._exits.append(w)
            if msg.notice is not None and self.notice is None:
                self.notice = msg.notice
            now = self.last_seen
            for c in self.commands:  # (taken: how long each waited for it)
                at = self.queued_at.pop(c.id, None)
                if at is not None:
                    self.delivery_s.append(now - at)
            del self.delivery_s[:-DELIVERIES]
            self.cond.notify_all()
            return SyncReply(commands=tuple(self.commands))


class Nodes:
    """Every node of the job, by name, in the order they came; and the nodes a node of the same
    name replaced (``retire``), whose slots and processes are still looked up."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.retired: list[Node] = []  # replaced by a node of their name: their slots stay theirs
        self.workers: dict[int, Worker] = {}
        self._next_proc = 0
        self._next_slot = 0
        self.lock = threading.RLock()

    def add(self, make: Callable[[int], Node]) -> Node:
        """A node made by ``make(slot_base)`` with the next free slot ids."""
        with self.lock:
            node = make(self._next_slot)
            if node.name in self.nodes:
                raise ValueError(f"node {node.name!r} is already in the job")
            self._next_slot += node.slots
            self.nodes[node.name] = node
            self.workers.update(node.workers)
            return node

    def up(self) -> list[Node]:
        """The nodes the job can place processes on (not lost, no preemption notice)."""
        with self.lock:
            return [n for n in self.nodes.values() if not n.lost and n.notice is None]

    def slots(self) -> list[int]:
        return [s for n in self.up() for s in range(n.slot_base, n.slot_base + n.slots)]

    def retire(self, name: str) -> None:
        """A node declared lost (or gone empty) whose name registers again: the newcomer is a new
        node with slots of its own; the old one's slots and processes (a fail-stop over them may be
        under way) are still found here."""
        with self.lock:
            self.retired.append(self.nodes.pop(name))

    def node_of(self, slot: int) -> Node:
        with self.lock:
            for n in [*self.nodes.values(), *self.retired]:
                if n.slot_base <= slot < n.slot_base + n.slots:
                    return n
        raise KeyError(f"slot {slot} is on no node of the job")

    def free_slots(self) -> list[int]:
        return [s for n in self.up() for s in n.free_slots()]

    def new_proc_ids(self, n: int) -> list[int]:
        with self.lock:
            ids = list(range(self._next_proc, self._next_proc + n))
            self._next_proc += n
            return ids

    def skip_proc(self, proc: int) -> None:
        """A process id in use (an agent reported it): new ones come after it."""
        with self.lock:
            self._next_proc = max(self._next_proc, proc + 1)

    def start(self, proc: int, slot: int, role: str, generation: int) -> Worker:
        w = self.node_of(slot).start(proc, slot, role, generation)
        with self.lock:
            self.workers[proc] = w
        return w

    def poll(self) -> list[Worker]:
        with self.lock:
            nodes = list(self.nodes.values())
        return [w for n in nodes for w in n.poll()]

    def alive(self) -> list[Worker]:
        with self.lock:
            return [w for w in self.workers.values() if w.returncode is None]

    def kill(self, proc: int) -> None:
        self.node_of(self.workers[proc].slot).kill(proc)

    def wait(self, procs: list[int], timeout_s: float) -> bool:
        end = time.time() + timeout_s
        for p in procs:
            if not self.node_of(self.workers[p].slot).wait([p], max(0.0, end - time.time())):
                return False
        return True

    def log_tail(self, proc: int, chars: int = 2000) -> str:
        w = self.workers.get(proc)
        return self.node_of(w.slot).log_tail(proc, chars) if w is not None else ""

    def where(self, proc: int) -> str:
        """The node a process runs on (for logs and errors)."""
        w = self.workers.get(proc)
        return self.node_of(w.slot).name if w is not None else "?"

    def interrupt(self) -> None:
        """A Ctrl-C (from the caller's thread): a start in this process waiting on a slow starter
        gives up, so the controller's loop can end the job."""
        for n in list(self.nodes.values()):
            stop = getattr(n, "interrupt", None)
            if stop is not None:
                stop()

    def stop_all(self) -> None:
        for n in list(self.nodes.values()):
            n.stop_all()

    def shutdown(self) -> None:
        for n in list(self.nodes.values()):
            n.shutdown()
