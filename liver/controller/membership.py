"""The controller's side of its nodes (``liver controller``): agents registering and syncing,
nodes lost, a node's notice and a node that joins as events, and the journal that lets a
controller that died go on. A part of ``Controller`` (``base.py``), kept apart: what a job on
several nodes adds to the one-machine loop."""

from __future__ import annotations

import time
from typing import Any

from liver import logs
from liver.agent.node import Worker
from liver.config.fields import from_dict, to_dict
from liver.controller import journal, storehost
from liver.policy import target
from liver.policy.decisions import join_total
from liver.policy.events import Event, EventKind
from liver.controller.nodes import RemoteNode
from liver.policy.outcome import Outcome, settle
from liver.controller.phases import Phase
from liver.protocol.agent import Register, Registered, Sync, SyncReply


class NodeMembership:
    # ---- the journal (``liver controller``) -------------------------------------------------
    def _journal(self, force: bool = False) -> None:
        """The controller's state to the run directory when it changed (and, every second, that
        it is alive to the store's own process)."""
        if self.store_pid is None:
            return
        now = time.time()
        if now - self._alive_said > 1.0:
            self.store.set(storehost.ALIVE_KEY, str(now))
            self._alive_said = now
        with self.lock, self.nodes.lock:  # (in that order, as the endpoint's threads take them)
            nodes = [n for n in self.nodes.nodes.values() if isinstance(n, RemoteNode)]
            mark = (self.state.phase, self.state.gen, len(self.state.records), tuple(e.describe() for e in self.state.queue), self.state.end_at,
                    self.state.ending, tuple(self.state.joined), tuple(self.state.noticed), self.nodes._next_proc,
                    tuple((n.name, n.lost, n.notice is not None, n._next, len(n.workers),
                           sum(w.returncode is None for w in n.workers.values())) for n in nodes))
            if mark == self._journaled and not force:
                return
            state = dict(state=self.state, cfg=self.cfg, mode=self.mode, token=self.endpoint.token if self.endpoint
                         else self.token, url=self.endpoint.url if self.endpoint else None, store_pid=self.store_pid,
                         store_addr=self.store_addr, next_proc=self.nodes._next_proc, next_slot=self.nodes._next_slot,
                         nodes=[n.record() for n in nodes])
            journal.write(self.run_dir, state)
        self._journaled = mark

    def _restore(self, state: dict[str, Any]) -> None:
        self.state = state["state"]
        if self.state.current is not None:  # (its CPU count starts again in this process)
            self.state.current.cpu0 = time.thread_time()
        self.token, self._url = state["token"], state["url"]
        self.nodes._next_proc, self.nodes._next_slot = state["next_proc"], state["next_slot"]
        for rec in state["nodes"]:
            node = RemoteNode.restored(rec)
            self.nodes.nodes[node.name] = node
            self.nodes.workers.update(node.workers)

    def _resume_phase(self) -> None:
        """What a controller that came back does first about the phase it was in (the mode's)."""

    # ---- nodes ---------------------------------------------------------------------------
    def agent_request(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        """A node agent's message (the endpoint's threads): ``register`` or ``sync``."""
        if what == "register":
            return to_dict(self._register(from_dict(Register, body, "register")))
        msg = from_dict(Sync, body, "sync")
        node = self.nodes.nodes.get(msg.node)
        if not isinstance(node, RemoteNode) or node.lost or node.resumed:
            if isinstance(node, RemoteNode):
                node.last_seen = time.time()  # (alive: it registers again at once)
            return to_dict(SyncReply(registered=False))
        return to_dict(node.sync(msg))

    def _register(self, msg: Register) -> Registered:
        with self.nodes.lock:
            old = self.nodes.nodes.get(msg.node)
            if isinstance(old, RemoteNode) and not old.lost and old.slots == msg.slots and \
                    old.same_agent(msg.host, msg.pid):
                node = old  # the same agent, back (it lost its controller, or a reply)
                known = set(node.workers)
                node.reconcile(msg.workers, msg.done)
                for r in msg.workers:  # started by a controller that died, after its journal's last write:
                    self.nodes.skip_proc(r.proc)  # its generation is withdrawn (and its number never reused)
                    if r.proc not in known:
                        node.kill(r.proc)
            else:
                if old is not None:  # declared lost before, or gone empty: it comes back as a new node
                    if not isinstance(old, RemoteNode) or (not old.lost and old.running()):
                        raise ValueError(f"node {msg.node!r}: a node of that name is in the job with "
                                         f"{old.slots} slots and runs processes; allowed: a name of its own, or "
                                         f"this one once the old agent is declared lost "
                                         f"(controller.agent_timeout_s={self.cfg.controller.agent_timeout_s:g})")
                    self.nodes.retire(msg.node)
                    self.state.noticed.discard(msg.node)  # (a notice to the old node is not the new one's)
                node = self.nodes.add(lambda base: RemoteNode(msg.node, base, msg.slots, msg.host, agent_pid=msg.pid))
                for r in msg.workers:  # processes of a generation it was declared lost from
                    node.workers[r.proc] = Worker(r.proc, r.slot, r.role, r.generation, r.pid, time.time())
                    node.kill(r.proc)
                self.state.joined.append(node.name)
        self.phase_log("node", node=msg.node, host=msg.host, slots=list(range(node.slot_base, node.slot_base + node.slots)))
        return Registered(node=node.name, slot_base=node.slot_base, base_spec=self.base_spec,
                          starter=self.starter_spec())

    def _await_shutdown(self, timeout_s: float = 5.0) -> None:
        """The agents' acknowledgement of the job's end (their next sync), so they end too."""
        end = time.time() + timeout_s
        while time.time() < end and any(isinstance(n, RemoteNode) and not n.lost and n.commands
                                        for n in self.nodes.nodes.values()):
            time.sleep(0.05)

    def _await_nodes(self) -> None:
        """Until the nodes that registered give the job its first GPUs (at once on this machine)."""
        end, said = time.time() + self.cfg.controller.prepare_timeout_s, False
        while len(self.nodes.free_slots()) < self.cfg.gpus:
            if self.interrupted:
                raise KeyboardInterrupt
            if time.time() > end:
                from liver.controller.base import ControllerError
                raise ControllerError(f"gpus={self.cfg.gpus}: only {len(self.nodes.free_slots())} slots registered "
                                      f"within controller.prepare_timeout_s={self.cfg.controller.prepare_timeout_s:g} s")
            if not said:
                logs.PHASES.info(f"waiting for node agents with {self.cfg.gpus} slots "
                                 f"(liver agent --controller {self.endpoint.url if self.endpoint else '?'})")
                said = True
            time.sleep(0.05)
        self.state.joined.clear()  # (the first generation places itself on them)

    def _watch_nodes(self) -> None:
        """A node gone silent is a fail-stop of its ranks; a notice a node received is a scale-in of
        its ranks; a node that joined offers its slots (``controller.on_join``)."""
        now, limit = time.time(), self.cfg.controller.agent_timeout_s
        for n in list(self.nodes.nodes.values()):
            if not isinstance(n, RemoteNode) or n.lost:
                continue
            if now - n.last_seen > limit:
                gone = n.mark_lost()
                self.phase_log("node-lost", node=n.name, silent_s=round(now - n.last_seen, 1),
                               procs=[w.proc for w in gone])
                self._exits(gone)
            elif n.notice is not None and n.name not in self.state.noticed:
                self.state.noticed.add(n.name)
                self._node_notice(n)
        while self.state.joined and self.state.phase in (Phase.STABLE, Phase.SUSPENDED) and self.state.active is not None:
            self._node_joined(self.state.joined.pop(0))

    def _node_notice(self, n: RemoteNode) -> None:
        held = [p for p in self.state.active.procs if self.nodes.node_of(self.state.slot_of[p]) is n] \
            if self.state.active and self.state.suspended is None else []
        ev = Event(kind=EventKind.SCALE_IN, gpus=len(self.state.active.procs) - len(held) if self.state.active else 0,
                   deadline_s=n.notice.deadline_s, source=f"node {n.name} ({n.notice.source})", node=n.name,
                   arrived=time.time())
        self.phase_log("notice", node=n.name, source=n.notice.source, deadline_s=n.notice.deadline_s, procs=held)
        with self.lock:
            if held:
                self.state.queue.appendleft(ev)  # (ahead of anything queued: the provider does not wait)
            else:
                self.state.records.append(settle({"event": ev.to_dict()}, Outcome.DONE, "done: the node held no rank"))

    def _node_joined(self, name: str) -> None:
        n_now = self._projected_gpus()

        def step_s(n: int) -> float | None:
            try:
                p = target.choose(self.adapter, self.job, n, self.hardware)
            except ValueError:
                return None
            return target.step_time(self.job, self.adapter.layout(self.job, p), self.hardware)

        total = join_total(self.cfg.controller.on_join, n_now, self.capacity(), step_s)
        if total is None:
            self.phase_log("node-idle", node=name, policy=self.cfg.controller.on_join, gpus=n_now)
            return
        ev = Event(kind=EventKind.SCALE_OUT, gpus=total, source=f"node {name} joined", arrived=time.time())
        with self.lock:
            self.state.queue.append(ev)

