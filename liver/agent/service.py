"""``liver agent``: one per node. It offers the node's slots to the job's controller, starts and
kills the workers the controller asks for (a ``NodeAgent``, as inside ``liver run``), reports
their exits, and passes on a preemption notice its watchers see (``liver.agent.notices``).

It talks to the controller by ``liver.protocol.agent`` messages over the control endpoint, with
the job's token. If the controller goes away the workers train on (they need only the job's store
and each other) and the agent keeps trying; once a controller answers again it registers anew,
naming the processes it still runs. It ends when the controller says the job is done (its workers
stopped), or, if it never reached a controller, after ``connect_timeout_s``.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import liver.protocol.secret as job_secret
from liver import logs
from liver.agent import starters
from liver.agent.node import NodeAgent, Worker
from liver.config.fields import from_dict, to_dict
from liver.protocol.agent import (MAX_WAIT_S, QUIET_SYNC_S, SYNC_S, Command, Exited, Notice, Register, Registered,
                                  Running, Sync, SyncReply, Wait, WaitReply, node_name)


WAIT_SAY_S = 30.0  # how often an agent waiting for its controller says so
# a request unanswered this long is sent again on a new connection: after a link that was down
# comes back, a fresh connection goes out at once, where the kept one would wait for TCP's
# retransmission backoff (seconds), and the node would be declared lost for a short cut
LINK_TIMEOUT_S = 2.0
RETRY_S = 0.25  # between attempts while the controller does not answer
MAX_SYNC_S = 5.0  # the longest interval between syncs it takes from the controller

class ControllerGone(ConnectionError):
    pass


class Link:
    """One kept-open HTTP connection to the controller's endpoint; JSON in and out."""

    def __init__(self, url: str, token: str, timeout_s: float = LINK_TIMEOUT_S) -> None:
        u = urlsplit(url if "://" in url else f"http://{url}")
        try:
            port = u.port
        except ValueError:  # (urllib's "Port out of range 0-65535")
            port = None
        if u.scheme != "http" or not u.hostname or not port:
            raise ValueError(f"controller={url!r}: allowed HOST:PORT or http://HOST:PORT (a port from 1 to 65535)")
        self.host, self.port, self.token, self.timeout_s = u.hostname, port, token, timeout_s
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for attempt in (0, 1):  # a kept connection the server closed meanwhile: once more, anew
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                self.conn.request("POST", path, data, headers)
                r = self.conn.getresponse()
                reply = json.loads(r.read() or b"{}")
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.close()
                if attempt:
                    raise ControllerGone(f"controller {self.host}:{self.port}: {e}") from None
                continue
            if r.status == 401:
                raise ValueError(f"controller {self.host}:{self.port} refused the token: {reply.get('error')}")
            if r.status != 200:
                raise ValueError(f"controller {self.host}:{self.port} {path}: {r.status} {reply.get('error')}")
            return reply
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class AgentService:
    """Three threads: the main one starts, kills and watches the processes (a first start waits for
    the zygote's imports, seconds); the link thread syncs with the controller whatever the main one
    is doing, so a busy agent is never taken for a lost one: with news at once, else every sync
    interval the controller gives, or where its standing waits are answered, every ``QUIET_SYNC_S``; the
    wait thread keeps a standing wait open there (``protocol.agent.Wait``: the node's heartbeat)
    and has the link thread sync when it is answered "ready" (a command waits)."""

    def __init__(self, controller: str, token: str, slots: int, node: str | None = None,
                 run_dir: str | None = None, connect_timeout_s: float = 300.0, quiet: bool = True,
                 notices: list[Callable[[], Notice | None]] | None = None,
                 resolve: Callable[[], str] | None = None) -> None:
        """``node``: its name in the job (default: the host name and this process's id);
        ``run_dir``: where its workers' specs and logs go (default: the controller's run directory,
        which a job on several machines has on a shared file system); ``notices``: watchers, each
        a call that returns a ``Notice`` once the node has one; ``resolve``: where the controller
        is now (its run directory's control.json), asked while it is lost: one that moved (resumed
        on another node) is found there."""
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 4096:
            raise ValueError(f"slots={slots!r}: allowed 1 to 4096 worker slots")
        self.link = Link(controller, token)
        if node:
            node_name(node, "--node")  # (refused here, before it registers)
        self.slots, self.node = slots, node or f"{socket.gethostname()}-{os.getpid()}"
        self.run_dir, self.connect_timeout_s, self.quiet = run_dir, connect_timeout_s, quiet
        self.notices = notices or []
        self.resolve = resolve
        self.agent: NodeAgent | None = None
        self.starter = None
        self.done = 0          # the last command carried out (main thread)
        self._queued = 0       # the last command handed to the main thread (link thread)
        self._delivered = 0    # the last ``done`` the controller received
        self._base: int | None = None  # the first of its slots in the job (a new one: a new node)
        self._epoch = 0        # registrations as a new node (commands are numbered anew from each)
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._started: list[Running] = []
        self._exited: list[Exited] = []
        self._running: tuple[Running, ...] = ()  # what it runs, for a registration anew
        self._notice: Notice | None = None
        self._notice_sent = False
        self._stop = threading.Event()
        self._news = threading.Event()  # something to report (a start, an exit, a notice, a shutdown): sync now
        self._synced = threading.Event()  # a sync got its answer (the wait thread waits for it)
        self._waits = False    # the controller takes standing waits (its last sync's answer said)
        self._interval = SYNC_S  # the node's sync interval, as the controller last gave it
        self._answered = 0.0     # when a standing wait was last answered
        self._gone: ControllerGone | None = None  # the wait thread found the controller unreachable

    # ---- the link thread -------------------------------------------------------------------
    def register(self) -> Registered:
        with self._lock:
            workers, done = self._running, self.done
        msg = Register(node=self.node, slots=self.slots, host=socket.gethostname(), pid=os.getpid(), workers=workers,
                       done=done)
        reply = from_dict(Registered, self.link.post("/agent/register", to_dict(msg)), "registered")
        with self._lock:
            if self._base is not None and reply.slot_base != self._base:
                # taken for a new node (the old one was declared lost): its commands count from 1
                self.done, self._queued, self._delivered = 0, 0, 0
                self._epoch += 1
            self._base = reply.slot_base
        logs.PHASES.info(f"node {self.node}: registered, slots {reply.slot_base} to "
                         f"{reply.slot_base + self.slots - 1} of the job")
        return reply

    def _link(self) -> None:
        lost_at: float | None = None
        while not self._stop.is_set():
            try:
                gone, self._gone = self._gone, None
                if gone is not None:  # (the wait thread found it unreachable: said and followed at once)
                    raise gone
                reply = self._sync()
                if not reply.registered:
                    self._inbox.put(self.register())  # (the main thread re-bases its node)
                    continue
            except ControllerGone as e:
                if lost_at is None:
                    lost_at = time.time()
                    logs.PHASES.warning(f"node {self.node}: lost the controller ({e}); the workers train on, "
                                        f"trying again every {RETRY_S:g} s")
                self._follow()
                self._stop.wait(RETRY_S)
                continue
            except ValueError as e:  # the controller refused what it was sent
                logs.PHASES.warning(f"node {self.node}: {e}")
                self._stop.wait(1.0)
                continue
            if lost_at is not None:
                logs.PHASES.info(f"node {self.node}: controller back after {time.time() - lost_at:.1f} s")
                lost_at = None
            for c in reply.commands:
                if c.id > self._queued:
                    self._inbox.put((self._epoch, c))
                    self._queued = c.id
            self._synced.set()  # (its commands taken: the wait thread waits for those after them)
            # the controller's interval (longer with many nodes), or sooner with news to report;
            # where standing waits are its heartbeat (and they are answered), a sync only now and then
            heard = time.time() - self._answered < 2 * max(reply.next_sync_s, SYNC_S) + LINK_TIMEOUT_S
            self._news.wait(QUIET_SYNC_S * random.uniform(0.5, 1.0) if reply.waits and heard  # (nodes out of step)
                            else max(SYNC_S, min(reply.next_sync_s, MAX_SYNC_S)))
            self._news.clear()

    def _follow(self) -> None:
        """A controller that moved: the address ``resolve`` gives now, where it is another one."""
        if self.resolve is None:
            return
        try:
            url = self.resolve()
            moved = Link(url, self.link.token)
        except (OSError, ValueError, KeyError, TypeError):  # (being rewritten, or gone with the run)
            return
        if (moved.host, moved.port) != (self.link.host, self.link.port):
            logs.PHASES.warning(f"node {self.node}: the controller moved to {moved.host}:{moved.port}")
            self.link.close()
            self.link = moved

    def _sync(self) -> SyncReply:
        with self._lock:
            started, exited, done = tuple(self._started), tuple(self._exited), self.done
            notice = self._notice if not self._notice_sent else None
        msg = Sync(node=self.node, done=done, started=started, exited=exited, notice=notice)
        reply = from_dict(SyncReply, self.link.post("/agent/sync", to_dict(msg)), "sync")
        with self._lock:  # delivered
            self._started = self._started[len(started):]
            self._exited = self._exited[len(exited):]
            self._notice_sent = self._notice_sent or notice is not None
            self._delivered = done
        self._waits, self._interval = reply.waits, reply.next_sync_s
        return reply

    def _wait(self) -> None:
        """The standing wait, on a connection of its own, sent again as soon as it is answered (it
        is held up to the node's sync interval): answered ``ready`` (a command waits, the
        controller asks, or the node is to register again), the link thread syncs now. A lost
        controller is the link thread's to report and follow."""
        link: Link | None = None
        while not self._stop.is_set():
            if not self._waits:
                self._stop.wait(SYNC_S)  # (the controller takes none, or has not said yet)
                continue
            # asked long enough: the controller holds it to the node's own point in the interval
            hold = min(2 * max(self._interval, SYNC_S), MAX_WAIT_S)
            if link is None or (link.host, link.port) != (self.link.host, self.link.port) or \
                    link.timeout_s < hold + LINK_TIMEOUT_S:
                if link is not None:
                    link.close()
                link = Link(f"http://{self.link.host}:{self.link.port}", self.link.token, hold + LINK_TIMEOUT_S)
            try:
                reply = from_dict(WaitReply, link.post("/agent/wait", to_dict(Wait(node=self.node, after=self._queued,
                                                                                   wait_s=hold))), "wait")
            except (ControllerGone, ValueError) as e:
                if isinstance(e, ControllerGone):
                    self._gone = e
                self._news.set()  # (the link thread syncs every interval again until waits are answered)
                self._stop.wait(RETRY_S)
                continue
            self._interval, self._answered = reply.next_sync_s, time.time()
            if reply.ready:
                self._synced.clear()
                self._news.set()
                self._synced.wait(LINK_TIMEOUT_S)  # (its sync took the commands: not asked again before)
        if link is not None:
            link.close()

    # ---- the main thread ---------------------------------------------------------------------
    def run(self) -> int:
        first = self._connect(self.connect_timeout_s)
        self._rebase(first)
        link = threading.Thread(target=self._link, name="liver-agent-link", daemon=True)
        link.start()
        threading.Thread(target=self._wait, name="liver-agent-wait", daemon=True).start()
        try:
            while True:
                self._watch()
                try:
                    item = self._inbox.get(timeout=SYNC_S / 2)
                except queue.Empty:
                    continue
                if isinstance(item, Registered):
                    self._rebase(item)
                elif self._carry_out(*item):
                    return 0
        finally:
            self._stop.set()
            self._news.set()  # (the link thread wakes to end)
            if self.agent is not None:
                self.agent.shutdown()
            self.link.close()

    def _connect(self, timeout_s: float) -> Registered:
        """Registered with the controller, which may not be up yet (an agent started before it, as a
        scheduler starts them): it waits up to ``timeout_s``, saying so at once and every
        ``WAIT_SAY_S``, and says when it joined."""
        start = time.time()
        said = 0.0
        where = f"{self.link.host}:{self.link.port}"
        while True:
            try:
                reply = self.register()
            except ControllerGone:
                now = time.time()
                if now - start > timeout_s:
                    raise ControllerGone(f"node {self.node}: no controller at {where} within {timeout_s:g} s "
                                         f"(--connect-timeout)") from None
                if not said or now - said >= WAIT_SAY_S:
                    print(f"[liver] node {self.node}: no controller at {where} yet; waiting for it "
                          f"({timeout_s - (now - start):.0f} s left)", flush=True)
                    said = now
                time.sleep(0.5)
                continue
            if said:
                print(f"[liver] node {self.node}: joined the controller at {where}", flush=True)
            return reply

    def _rebase(self, reply: Registered) -> None:
        """The node's agent for the slots the controller gave: kept where they are the same (the
        controller came back), made anew otherwise (the node was taken for lost: whatever still
        runs here belongs to no generation any more)."""
        if self.agent is not None and self.agent.slot_base == reply.slot_base:
            return
        if self.agent is not None:
            old = sorted(w.proc for w in self.agent.alive())
            if old:
                logs.PHASES.warning(f"node {self.node}: taken for a new node; its old workers {old} belong to no "
                                    f"generation any more and are stopped")
            self.agent.stop_all()
        if self.starter is None:
            self.starter = starters.make(reply.starter)
        run_dir = Path(self.run_dir or reply.base_spec["run_dir"])
        self.agent = NodeAgent(run_dir, self.slots, reply.base_spec, self.starter, quiet=self.quiet, name=self.node,
                               slot_base=reply.slot_base, procs_file=f"procs-{self.node}.json",
                               secret=job_secret.of_token(self.link.token))
        self._publish_running()

    def _watch(self) -> None:
        exits = [Exited(proc=w.proc, returncode=w.returncode, tail=self.agent.log_tail(w.proc, 2000))
                 for w in self.agent.poll()]
        if exits:
            with self._lock:
                self._exited += exits
            self._news.set()
            self._publish_running()
        if self._notice is None:
            for watch in self.notices:
                n = watch()
                if n is not None:
                    logs.PHASES.warning(f"node {self.node}: preemption notice from {n.source}, "
                                        f"{n.deadline_s:g} s to leave")
                    with self._lock:
                        self._notice = n
                    self._news.set()
                    break

    def _publish_running(self) -> None:
        running = tuple(Running(proc=w.proc, slot=w.slot, role=w.role, generation=w.generation, pid=w.pid)
                        for w in self.agent.alive())
        with self._lock:
            self._running = running

    def _carry_out(self, epoch: int, c: Command) -> bool:
        """One command, sent to the node it was registered as at ``epoch`` (one sent to the node
        it was before being taken for a new one is dropped: that node is gone); True at ``shutdown``."""
        with self._lock:
            if c.id <= self.done or epoch != self._epoch:
                return False
        if c.op == "start":
            w: Worker = self.agent.start(c.proc, c.slot, c.role, c.generation)
            with self._lock:
                self._started.append(Running(proc=w.proc, slot=w.slot, role=w.role, generation=w.generation,
                                             pid=w.pid))
        elif c.op == "kill" and c.proc in self.agent.workers:
            self.agent.kill(c.proc)
        elif c.op == "shutdown":
            self.agent.shutdown()
        with self._lock:
            if epoch == self._epoch:  # (not when it was registered anew meanwhile: numbered anew)
                self.done = c.id
        self._publish_running()
        self._news.set()  # (what it carried out, and any process it started, reported at once)
        if c.op == "shutdown":
            end = time.time() + 3.0  # its acknowledgement, where the controller still listens
            while time.time() < end and self._delivered < c.id:
                time.sleep(SYNC_S / 2)
            return True
        return False
