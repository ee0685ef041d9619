"""Node agent: starts worker processes on this node's slots (one per GPU, or per CPU slot), watches
them, and stops them. It knows nothing about training; the controller tells it what to start.

``procs.json`` in the run directory (``procs-NODE.json`` for a named node of several) lists the
live processes (proc id, slot, pid, role), so an operator (or a test) can see which process holds
which slot. Slots are the job's (global) slot ids: this node's run from ``slot_base``; a worker's
spec and ``LOCAL_RANK`` carry the node-local one (its GPU).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import liver.protocol.secret as job_secret
from liver.host.process import ProcessRef

KILL_WAIT_S = 10.0  # how long a kill waits for the starter's word of the exit


class Starter(Protocol):
    """How the agent makes worker processes: ``liver.agent.zygote.ForkedWorkers`` (forked from
    templates that imported everything once) or ``liver.agent.interpreter.FreshInterpreters``."""

    def start(self, spec_path: str, env: dict[str, str], log_path: str, quiet: bool, idle: bool) -> int: ...

    def exit_status(self, pid: int, timeout_s: float | None = 0.0) -> int | None: ...

    def close(self) -> None: ...


@dataclass
class Worker:
    proc: int
    slot: int                 # the job's slot id (``Nodes``); the node's own is slot - slot_base
    role: str
    generation: int
    pid: int
    started: float
    leaving: bool = False     # told to go: its exit is expected
    returncode: int | None = None


class NodeAgent:
    lost = False   # (the controller's own node is never lost to it, nor told to go)
    notice = None
    def __init__(self, run_dir: Path, slots: int, base_spec: dict[str, Any], starter: Starter,
                 quiet: bool = False, cores: dict[int, list[int]] | None = None, name: str = "local",
                 slot_base: int = 0, procs_file: str = "procs.json", secret: bytes | None = None) -> None:
        """``base_spec``: what every worker's spec holds; ``starter``: how it makes processes;
        ``cores``: node-local slot -> the cores its worker is bound to (``liver.host.cores``), or
        None; ``name``: the node's; ``slot_base``: the job's slot id of its slot 0; ``secret``: the
        job's (``liver.protocol.secret``), handed to each worker in its environment."""
        self.secret = secret
        self.cores = cores
        self.name, self.slot_base, self.procs_file = name, slot_base, procs_file
        self.run_dir = run_dir
        self.quiet = quiet  # worker output to its log file only
        self.slots = slots
        self.base_spec = base_spec
        self.workers: dict[int, Worker] = {}
        (run_dir / "specs").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.starter = starter
        self.me = ProcessRef.me()  # (each worker watches it: gone, they stop themselves)

    def busy_slots(self) -> set[int]:
        return {w.slot for w in self.workers.values() if w.returncode is None}

    def free_slots(self) -> list[int]:
        return [s for s in range(self.slot_base, self.slot_base + self.slots) if s not in self.busy_slots()]

    def start(self, proc: int, slot: int, role: str, generation: int, spec: dict[str, Any] | None = None) -> Worker:
        """``spec``: the worker's spec beyond this node's part (default: the agent's ``base_spec``)."""
        if slot in self.busy_slots():
            raise RuntimeError(f"slot {slot} is busy")
        local = slot - self.slot_base
        if not 0 <= local < self.slots:
            raise RuntimeError(f"slot {slot} is not on node {self.name} (its slots: {self.slot_base} to "
                               f"{self.slot_base + self.slots - 1})")
        spec = dict(spec if spec is not None else self.base_spec, proc=proc, slot=local, role=role,
                    generation=generation, cores=self.cores[local] if self.cores else None,
                    agent=None if self.me is None else str(self.me))
        path = self.run_dir / "specs" / f"proc{proc}.json"
        path.write_text(json.dumps(spec))
        env = dict(os.environ, LOCAL_RANK=str(local), **(job_secret.env(self.secret) if self.secret else {}))
        env.setdefault("OMP_NUM_THREADS", "1")  # (as torchrun: the user's count where set)
        # a cold joiner boots at background priority: it must not slow the training it joins
        # (it restores its priority, where allowed, once it holds a rank)
        p = self.starter.start(str(path), env, str(self.run_dir / "logs" / f"proc{proc}.log"),
                             quiet=self.quiet, idle=role == "joiner")
        w = Worker(proc, slot, role, generation, p, time.time())
        self.workers[proc] = w
        self._write_procs()
        return w

    def poll(self) -> list[Worker]:
        """Workers that exited since the last poll."""
        out = []
        for w in self.workers.values():
            if w.returncode is None:
                rc = self.starter.exit_status(w.pid)
                if rc is not None:
                    w.returncode = rc
                    out.append(w)
        if out:
            self._write_procs()
        return out

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.returncode is None]

    def kill(self, proc: int) -> None:
        w = self.workers[proc]
        if w.returncode is None:
            try:
                os.kill(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # its status from the starter (a zygote at idle priority on a busy node may be slow to
            # say): SIGKILL cannot be ignored, so without word it is taken for killed
            rc = self.starter.exit_status(w.pid, KILL_WAIT_S)
            w.returncode = rc if rc is not None else -signal.SIGKILL
            self._write_procs()

    def wait(self, procs: list[int], timeout_s: float) -> bool:
        end = time.time() + timeout_s
        for p in procs:
            w = self.workers[p]
            w.returncode = self.starter.exit_status(w.pid, max(0.0, end - time.time()))
            if w.returncode is None:
                return False
        self._write_procs()
        return True

    def log_tail(self, proc: int, chars: int = 2000) -> str:
        f = self.run_dir / "logs" / f"proc{proc}.log"
        return f.read_text()[-chars:] if f.exists() else ""

    def interrupt(self) -> None:
        """From another thread, at a Ctrl-C: a start waiting on the starter gives up."""
        stop = getattr(self.starter, "interrupt", None)
        if stop is not None:
            stop()

    def stop_all(self) -> None:
        """Kill every live worker (the agent can start new ones)."""
        for w in self.alive():
            self.kill(w.proc)

    def shutdown(self) -> None:
        """Kill every live worker and let go of the starter: the agent is done."""
        self.stop_all()
        self.starter.close()

    def _write_procs(self) -> None:
        rows = [{"proc": w.proc, "slot": w.slot, "node": self.name, "pid": w.pid, "role": w.role,
                 "cores": self.cores[w.slot - self.slot_base] if self.cores else None,
                 "generation": w.generation, "alive": w.returncode is None} for w in self.workers.values()]
        tmp = self.run_dir / f".{self.procs_file}"
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, self.run_dir / self.procs_file)
