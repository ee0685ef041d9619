"""Zygote: the node agent's template worker. When the agent starts, one process imports torch and
the worker's modules (its preload, an import string: ``liver.runtime.preload``); every worker is then forked from it, so a worker's
start costs a fork instead of an interpreter boot and its imports (seconds of CPU). A cold joiner thus spends next to nothing beside the training it joins on a shared node,
and a restart's new processes start as fast as the agent can make them.

The template stays single-threaded (a fork copies only the calling thread; a lock held by another
would stay held in the child). It serves two pipes: requests from the agent, one JSON line each
(spec, environment, log file, idle priority), and replies to it: each new worker's pid, and each
worker's exit status once it is reaped (as ``subprocess`` reports it: the code, or -signal).
Each worker applies its own environment, priority and log file before it runs its entry point
(``liver.runtime.member``). The template exits when the agent closes the request pipe.

``Zygote`` (below) is the agent's side of one template, ``ForkedWorkers`` the agent's starter
(a template for ranks and one at idle priority for cold joiners); ``python -m liver.agent.zygote REQ_FD REPLY_FD MODULE:PRELOAD [ARG ...]``
the template.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from liver.host.priority import background
from liver.logs import culprit

START_TIMEOUT_S = 120.0  # the first fork waits for the template's imports


class Zygote:
    """The agent's handle: starts the template, forks workers from it, learns their exits. A
    ``Starter`` (``liver.agent.node``), like ``FreshInterpreters``."""

    def __init__(self, preload: str, args: tuple[str, ...] = (), idle: bool = False,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        """``preload``: ``module:function`` the template runs once, with ``args``, before it forks
        (the imports and warm-ups every worker shares; it must leave the template single-threaded); ``idle``:
        the template, and so each fork and every worker it makes, runs at idle CPU priority."""
        req_r, self._req_w = os.pipe()
        self._req_lock = threading.Lock()
        self._reply_r, reply_w = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "liver.agent.zygote", str(req_r), str(reply_w),
                                         preload, *args],
                                        pass_fds=(req_r, reply_w), stdin=subprocess.DEVNULL,
                                        preexec_fn=background if idle else None)
        os.close(req_r)
        os.close(reply_w)
        self._cond = threading.Condition()
        self._pids: dict[int, int] = {}  # request id -> pid
        self._exits: dict[int, int] = {}  # pid -> exit status
        self._next = 0
        self._gone = False  # the template ended (its pipe closed)
        self._interrupted = False  # the agent was interrupted (Ctrl-C): a start waiting here gives up
        self.start_timeout_s = start_timeout_s  # a fork not made by then (once it is ready) fails its start
        self._ready = False  # its imports are done
        self._error: str | None = None  # why its preload failed (a recipe's error in the rehearsal)
        threading.Thread(target=self._read, name="zygote-replies", daemon=True).start()

    def _read(self) -> None:
        with os.fdopen(self._reply_r, "r") as f:
            for line in f:
                msg = json.loads(line)
                with self._cond:
                    if "exit" in msg:
                        self._exits[msg["pid"]] = msg["exit"]
                    elif "ready" in msg:
                        self._ready = True
                    elif "error" in msg:
                        self._error = msg["error"]
                    else:
                        self._pids[msg["id"]] = msg["pid"]
                    self._cond.notify_all()
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the template has done its imports (a fork waits for them anyway)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._gone or self._interrupted, timeout_s) \
                    or not self._ready:
                if self._interrupted and not self._gone:
                    raise KeyboardInterrupt  # (the controller's thread ends the job as Ctrl-C does)
                if self._gone:
                    raise RuntimeError(f"the zygote (pid {self.process.pid}) ended before it forked: {self._why()}")
                raise RuntimeError(f"the zygote (pid {self.process.pid}) is not ready after {timeout_s:g} s: "
                                   f"{self._why()}")

    def _why(self) -> str:
        if self._error is not None:  # (its traceback is on the agent's stderr too)
            return f"its preload failed: {self._error}"
        return f"exit {self.process.poll()}; its output is on the agent's stderr"

    def start(self, spec_path: str, env: dict[str, str], log_path: str, quiet: bool, idle: bool,
              entry: str) -> int:
        """A new worker running ``entry`` (``module:function``, called with ``spec_path`` and its
        start times) : stderr (and stdout when ``quiet``) to ``log_path``, environment exactly
        ``env``, idle priority when ``idle``. Returns its pid."""
        if self._req_w < 0:
            raise RuntimeError(f"the zygote (pid {self.process.pid}) was closed: it starts no more workers")
        self.wait_ready()  # its imports first (the first fork waits for them, up to START_TIMEOUT_S)
        with self._cond:
            rid, self._next = self._next, self._next + 1
        line = json.dumps({"id": rid, "spec": spec_path, "env": env, "log": log_path, "quiet": quiet,
                           "idle": idle, "entry": entry}) + "\n"
        with self._req_lock:  # (never written after ``close``: the number may be another's by then)
            if self._req_w < 0:
                raise RuntimeError(f"the zygote (pid {self.process.pid}) was closed: it starts no more workers")
            try:
                os.write(self._req_w, line.encode())
            except BrokenPipeError:
                raise RuntimeError(f"the zygote (pid {self.process.pid}) has ended: {self._why()}") from None
        with self._cond:
            if not self._cond.wait_for(lambda: rid in self._pids or self._gone or self._interrupted,
                                       self.start_timeout_s):
                raise RuntimeError(f"the zygote (pid {self.process.pid}) did not fork a worker in "
                                   f"{self.start_timeout_s:g} s")
            if rid not in self._pids and self._interrupted:
                raise KeyboardInterrupt  # (the controller's thread ends the job as Ctrl-C does)
            if rid not in self._pids:
                raise RuntimeError(f"the zygote (pid {self.process.pid}) ended before it forked: {self._why()}")
            return self._pids.pop(rid)

    def usable(self) -> bool:
        """Whether this template can still fork: it has not ended, nor been interrupted."""
        with self._cond:
            return not self._gone and not self._interrupted and self.process.poll() is None

    def interrupt(self) -> None:
        """A start waiting for this template (still importing, at idle priority on a busy node)
        gives up at once: the job is being stopped (Ctrl-C)."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def exit_status(self, pid: int, timeout_s: float | None = 0.0) -> int | None:
        """The worker's exit status, waiting up to ``timeout_s`` (None: no limit) for it."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._gone, timeout_s)
            if pid not in self._exits and self._gone:
                # the template ended: its workers are nobody's children now; alive or gone?
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return -signal.SIGKILL
            return self._exits.get(pid)

    def close(self, wait: bool = True) -> None:
        """No more workers: the template exits (workers still running are not touched); one still
        importing (an idle-priority one on a busy node: for long) is stopped, its imports serve no
        one. ``wait``: until it has exited (else ``wait_closed``)."""
        with self._req_lock:  # closed once: a second close would close whatever took its number since
            # (a store's event loop, once: its thread never woke to end, and its owner hung at exit)
            fd, self._req_w = self._req_w, -1
        if fd >= 0:
            os.close(fd)
        with self._cond:
            ready = self._ready
        if not ready and self.process.poll() is None:
            self.process.kill()
        if wait:
            self.wait_closed()

    def wait_closed(self) -> None:
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedWorkers:
    """The agent's ``Starter`` for live runs: two templates, one at normal priority for ranks and
    one at idle priority for cold joiners. A fork copies the template's page tables (about 6 ms of
    CPU for a template that imported torch): a joiner's must come out of idle time, not out of
    the training steps it joins; a rank's must not wait for idle time."""

    def __init__(self, preload: str, entry: str, args: tuple[str, ...] = (), joiners: bool = True,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        """``preload``, ``entry``: import strings (``module:function``) of the templates' warm-up
        (called with ``args``) and of each worker's entry point (called with its spec's path and
        its start times); ``start_timeout_s``: a worker not forked by then fails its start."""
        self.entry = entry
        self.ranks = Zygote(preload, args, start_timeout_s=start_timeout_s)
        self.joiners = Zygote(preload, args, idle=True, start_timeout_s=start_timeout_s) if joiners else None
        self._of: dict[int, Zygote] = {}

    @classmethod
    def of(cls, entry: str, ranks: Zygote, joiners: Zygote | None) -> "ForkedWorkers":
        """Workers forked from templates made by the caller (who may keep them beyond these
        workers: ``close`` closes them as it would its own)."""
        self = cls.__new__(cls)
        self.entry, self.ranks, self.joiners, self._of = entry, ranks, joiners, {}
        return self

    def start(self, spec_path: str, env: dict[str, str], log_path: str, quiet: bool, idle: bool) -> int:
        z = self.joiners if idle and self.joiners is not None else self.ranks
        pid = z.start(spec_path, env, log_path, quiet, idle, self.entry)
        self._of[pid] = z
        return pid

    def exit_status(self, pid: int, timeout_s: float | None = 0.0) -> int | None:
        return self._of[pid].exit_status(pid, timeout_s)

    def usable(self) -> bool:
        """Whether both templates can still fork (``Zygote.usable``)."""
        return all(z.usable() for z in (self.ranks, self.joiners) if z is not None)

    def interrupt(self) -> None:
        for z in (self.ranks, self.joiners):
            if z is not None:
                z.interrupt()

    def close(self) -> None:
        both = [z for z in (self.ranks, self.joiners) if z is not None]
        for z in both:  # both told first, then both waited for
            z.close(wait=False)
        for z in both:
            z.wait_closed()


# ---- the template process --------------------------------------------------------------------

def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def _serve(req_fd: int, reply_fd: int, preload: str, args: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the agent's to handle: it stops the workers
    module, function = preload.split(":")
    try:
        getattr(importlib.import_module(module), function)(*args)  # the imports every worker shares
    except Exception as e:  # a recipe's error in the rehearsal: said to the agent, who says it to the user
        os.write(reply_fd, (json.dumps({"error": culprit(e)}) + "\n").encode())
        raise
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
        raise RuntimeError(f"the zygote has {threads} threads ({', '.join(names)}) after its preload {preload}; "
                           "a fork would copy only one of them")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    reply = os.fdopen(reply_fd, "w", buffering=1)
    reply.write(json.dumps({"ready": os.getpid()}) + "\n")
    pending = b""
    while True:
        try:
            ready, _, _ = select.select([req_fd, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, raw = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                reply.write(json.dumps({"pid": pid, "exit": _status(raw)}) + "\n")
        if req_fd in ready:
            data = os.read(req_fd, 1 << 16)
            if not data:  # the agent is done: no finalisation of the interpreter (it holds nothing to save)
                reply.flush()
                os._exit(0)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req, (req_fd, reply_fd, wake_r, wake_w))
                reply.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")


def _child(req: dict[str, Any], inherited: tuple[int, ...]) -> None:
    forked = time.time()
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        if req["idle"]:
            background()
        os.environ.clear()
        os.environ.update(req["env"])
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        if req["quiet"]:
            os.dup2(fd, 1)
        os.close(fd)
        module, function = req["entry"].split(":")
        # its imports were done once, in the template: it started and was ready to run at once
        getattr(importlib.import_module(module), function)(req["spec"], {"process_start": forked, "imported": forked})
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        traceback.print_exc()
        print(f"liver: worker failed: {culprit(e)}", file=sys.stderr)  # (its last line: the controller reports it)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    try:
        _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    except BrokenPipeError:  # the agent went away (a job refused while the template booted): done
        os._exit(0)
