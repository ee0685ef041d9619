"""The controller's side of its nodes (``liver controller``): agents registering and syncing,
nodes lost, a node's notice and a node that joins as events. A component the controller holds
(``Controller.membership``): what a job on several nodes adds to the one-machine loop. What it
reads and calls of the controller is declared (``Host``), nothing else."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Protocol

from liver import logs
from liver.agent.node import Worker
from liver.config import RunConfig
from liver.config.fields import from_dict, to_dict
from liver.controller.nodes import Nodes, RemoteNode
from liver.controller.phases import Phase
from liver.controller.records import EventRecord
from liver.controller.state import ControllerState
from liver.policy import target
from liver.policy.workload import Workload
from liver.policy.decisions import join_total
from liver.policy.events import Event, EventKind
from liver.policy.outcome import Outcome
from liver.protocol.agent import SYNC_S, Register, Registered, Sync, SyncReply, Wait, WaitReply
from liver.protocol.messages import Fence


# A node is declared lost after ``controller.agent_timeout_s`` or after this many of its sync
# intervals (``sync_interval``), whichever is longer.
LOST_AFTER_SYNCS = 5

# A withdrawn generation's joiner sees the withdrawal at its next pause and ends (runtime/member.py),
# within a second or two of its group rendezvous completing; stopped after this if it does not.
WITHDRAWN_GRACE_S = 20.0


class MembershipError(RuntimeError):
    pass


class Host(Protocol):
    """What membership needs of the controller that holds it."""

    cfg: RunConfig
    state: ControllerState
    nodes: Nodes
    store: Any
    lock: threading.Lock
    base_spec: dict[str, Any]
    interrupted: bool
    adapter: Any
    job: Any

    def starter_spec(self) -> dict[str, Any]: ...
    def phase_log(self, what: str, **kw: Any) -> None: ...
    def capacity(self) -> int: ...
    @property
    def events(self) -> Any: ...
    @property
    def failures(self) -> Any: ...
    @property
    def hardware(self) -> target.Hardware: ...


class Membership:
    def __init__(self, host: Host, url: Callable[[], str]) -> None:
        """``url``: where the agents reach the controller (for the operator's message)."""
        self.host, self.url = host, url

    # ---- nodes ---------------------------------------------------------------------------
    def agent_request(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        """A node agent's message (the endpoint's threads): ``register``, ``sync`` or ``wait`` (its
        standing request, held here until a command for it is queued: ``RemoteNode.await_command``)."""
        if what == "register":
            return to_dict(self.register(from_dict(Register, body, "register")))
        if what == "wait":
            ask = from_dict(Wait, body, "wait")
            node = self.host.nodes.nodes.get(ask.node)
            if not isinstance(node, RemoteNode) or node.lost or node.resumed:
                return to_dict(WaitReply(ready=True))  # (its sync learns it is to register)
            interval = self.sync_interval()
            hold = min(ask.wait_s, self.hold(node, interval)) if self.host.cfg.controller.long_poll else 0.0
            return to_dict(WaitReply(ready=node.await_command(ask.after, hold), next_sync_s=interval))
        msg = from_dict(Sync, body, "sync")
        node = self.host.nodes.nodes.get(msg.node)
        if not isinstance(node, RemoteNode) or node.lost or node.resumed:
            if isinstance(node, RemoteNode):
                node.last_seen = node.last_heard = time.time()  # (alive: it registers again at once)
            return to_dict(SyncReply(registered=False))
        return to_dict(dataclasses.replace(node.sync(msg), next_sync_s=self.sync_interval(),
                                           waits=self.host.cfg.controller.long_poll))

    def sync_interval(self) -> float:
        """Seconds between a node's syncs when it has nothing to report (news goes at once): the
        controller takes about ``controller.syncs_per_s`` syncs a second from all its nodes together."""
        up = sum(1 for n in list(self.host.nodes.nodes.values()) if not n.lost)
        return max(SYNC_S, up / self.host.cfg.controller.syncs_per_s)

    @staticmethod
    def hold(node: RemoteNode, interval: float, now: float | None = None) -> float:
        """How long a node's standing wait is held with no command for it: until its own point of
        the interval (``RemoteNode.phase``, spread over the nodes by their names), at least a tenth
        of an interval from now: every node is heard from once an interval, not all at once (waits
        held a whole interval each would stay in step, all answered together)."""
        t = time.time() if now is None else now
        left = interval * (1.0 - (t / interval + node.phase) % 1.0)
        return left if left >= 0.1 * interval else left + interval

    def lost_after(self) -> float:
        """The silence after which a node is declared lost."""
        return max(self.host.cfg.controller.agent_timeout_s, LOST_AFTER_SYNCS * self.sync_interval())

    def register(self, msg: Register) -> Registered:
        with self.host.nodes.lock:
            old = self.host.nodes.nodes.get(msg.node)
            if isinstance(old, RemoteNode) and not old.lost and old.slots == msg.slots and \
                    old.same_agent(msg.host, msg.pid):
                node = old  # the same agent, back (it lost its controller, or a reply)
                known = set(node.workers)
                node.reconcile(msg.workers, msg.done)
                for r in msg.workers:  # started by a controller that died, after its journal's last write:
                    self.host.nodes.skip_proc(r.proc)  # its generation is withdrawn (and its number never reused)
                    if r.proc not in known:
                        node.let_end(r.proc, WITHDRAWN_GRACE_S)
            else:
                if old is not None:  # declared lost before, or gone empty: it comes back as a new node
                    if not isinstance(old, RemoteNode) or (not old.lost and old.running()):
                        raise ValueError(f"node {msg.node!r}: a node of that name is in the job with "
                                         f"{old.slots} slots and runs processes; allowed: a name of its own, or "
                                         f"this one once the old agent is declared lost "
                                         f"(controller.agent_timeout_s={self.host.cfg.controller.agent_timeout_s:g})")
                    self.host.nodes.retire(msg.node)
                    self.host.state.noticed.discard(msg.node)  # (a notice to the old node is not the new one's)
                node = self.host.nodes.add(lambda base: RemoteNode(msg.node, base, msg.slots, msg.host, agent_pid=msg.pid))
                node.count_after(msg.done)
                active = self.host.state.active.generation if self.host.state.active is not None else -1
                for r in msg.workers:
                    node.workers[r.proc] = Worker(r.proc, r.slot, r.role, r.generation, r.pid, time.time())
                    if r.generation > active:  # of a generation withdrawn (announced by a controller that
                        # died before its journal knew the node): it ends by itself once it sees the
                        # withdrawal; stopped now, it would hold its rendezvous' peers (the ranks) until
                        # their groups' timeout, out of the next preparation (a fresh clone's four-node test)
                        node.let_end(r.proc, WITHDRAWN_GRACE_S)
                    else:  # of a generation it was declared lost from: stopped now
                        node.kill(r.proc)
                    self.host.nodes.skip_proc(r.proc)  # (its number is never used again)
                self.host.state.joined.append(node.name)
        self.host.phase_log("node", node=msg.node, host=msg.host, slots=list(range(node.slot_base, node.slot_base + node.slots)))
        return Registered(node=node.name, slot_base=node.slot_base, base_spec=self.host.base_spec,
                          starter=self.host.starter_spec())

    def await_shutdown(self, timeout_s: float = 5.0) -> None:
        """The agents' acknowledgement of the job's end (their next sync), so they end too."""
        end = time.time() + timeout_s
        while time.time() < end and any(isinstance(n, RemoteNode) and not n.lost and n.commands
                                        for n in self.host.nodes.nodes.values()):
            time.sleep(0.05)

    def await_nodes(self) -> None:
        """Until the nodes that registered give the job its first GPUs (at once on this machine)."""
        end, said = time.time() + self.host.cfg.controller.prepare_timeout_s, False
        while len(self.host.nodes.free_slots()) < self.host.cfg.gpus:
            if self.host.interrupted:
                raise KeyboardInterrupt
            if time.time() > end:
                raise MembershipError(f"gpus={self.host.cfg.gpus}: only {len(self.host.nodes.free_slots())} slots registered "
                                      f"within controller.prepare_timeout_s={self.host.cfg.controller.prepare_timeout_s:g} s")
            if not said:
                logs.PHASES.info(f"waiting for node agents with {self.host.cfg.gpus} slots "
                                 f"(liver agent --controller {self.url()})")
                said = True
            time.sleep(0.05)
        self.host.state.joined.clear()  # (the first generation places itself on them)

    def watch(self) -> None:
        """A node gone silent is a fail-stop of its ranks; a notice a node received is a scale-in of
        its ranks; a node that joined offers its slots (``controller.on_join``)."""
        now, limit = time.time(), self.lost_after()
        for n in list(self.host.nodes.nodes.values()):
            if not isinstance(n, RemoteNode) or n.lost:
                continue
            n.reap(now)
            if now - n.last_heard > limit:
                gone = n.mark_lost()
                self.fence(n, gone, now)
                self.host.phase_log("node-lost", node=n.name, silent_s=round(now - n.last_heard, 1),
                               procs=[w.proc for w in gone])
                self.host.failures.exits(gone)
            elif n.notice is not None and n.name not in self.host.state.noticed:
                self.host.state.noticed.add(n.name)
                self.node_notice(n)
        while self.host.state.joined and self.host.state.phase in (Phase.STABLE, Phase.SUSPENDED) and self.host.state.active is not None:
            self.node_joined(self.host.state.joined.pop(0))

    def fence(self, n: RemoteNode, gone: list[Worker], now: float) -> None:
        """The processes of a node declared lost never train again (``runtime.fence``): each that
        still runs ends at once when it reads this; its peers cut their connections to it and
        stall to be healed; its rank 0's step records from now on are not the job's."""
        procs = tuple(sorted(w.proc for w in gone))
        if not procs:
            return
        Fence(procs=procs, node=n.name, time=now).publish(self.host.store)
        for p in procs:
            self.host.state.fenced[p] = now

    def node_notice(self, n: RemoteNode) -> None:
        held = [p for p in self.host.state.active.procs if self.host.nodes.node_of(self.host.state.slot_of[p]) is n] \
            if self.host.state.active and self.host.state.suspended is None else []
        ev = Event(kind=EventKind.SCALE_IN, gpus=len(self.host.state.active.procs) - len(held) if self.host.state.active else 0,
                   deadline_s=n.notice.deadline_s, source=f"node {n.name} ({n.notice.source})", node=n.name,
                   arrived=time.time())
        self.host.phase_log("notice", node=n.name, source=n.notice.source, deadline_s=n.notice.deadline_s, procs=held)
        with self.host.lock:
            if held:
                self.host.state.queue.appendleft(ev)  # (ahead of anything queued: the provider does not wait)
            else:
                self.host.state.records.append(EventRecord.of(ev.to_dict(), Outcome.DONE, "done: the node held no rank"))

    def node_joined(self, name: str) -> None:
        n_now = self.host.events.projected_gpus()

        def step_s(n: int) -> float | None:
            try:
                p = target.choose(self.host.adapter, self.host.job, n, self.host.hardware)
            except ValueError:
                return None
            return target.step_time(Workload(self.host.adapter, self.host.job),
                                    self.host.adapter.layout(self.host.job, p), self.host.hardware)

        total = join_total(self.host.cfg.controller.on_join, n_now, self.host.capacity(), step_s)
        if total is None:
            self.host.phase_log("node-idle", node=name, policy=self.host.cfg.controller.on_join, gpus=n_now)
            return
        ev = Event(kind=EventKind.SCALE_OUT, gpus=total, source=f"node {name} joined", arrived=time.time())
        with self.host.lock:
            self.host.state.queue.append(ev)
        # (the terminal says why a scale-out nobody scheduled comes: the node and the join policy; after
        # the event is queued, so that nothing stands between the node's arrival and its event)
        self.host.phase_log("node-joined", node=name, policy=self.host.cfg.controller.on_join, gpus=n_now,
                            scale_out_to=total)

