"""Fresh interpreters: each worker a new ``python -m MODULE SPEC`` process, as torchrun
starts them, paying the interpreter's boot, its imports and first-use costs. The way the restart
baseline starts processes (``liver run --mode restart``: stop-and-restart as done today); the node
agent's own way is the zygote (``liver.agent.zygote``), which ``--mode restart-forked`` gives the
baseline too. A ``Starter`` (``liver.agent.node``)."""

from __future__ import annotations

import subprocess
import sys

from liver.host.priority import background


class FreshInterpreters:
    def __init__(self, module: str) -> None:
        """``module``: what each worker runs (``python -m module SPEC``)."""
        self.module = module
        self._procs: dict[int, subprocess.Popen] = {}

    def start(self, spec_path: str, env: dict[str, str], log_path: str, quiet: bool, idle: bool) -> int:
        """A new interpreter running the worker module on ``spec_path``; returns its pid."""
        with open(log_path, "w") as log:
            p = subprocess.Popen([sys.executable, "-m", self.module, spec_path], env=env,
                                 stdout=log if quiet else None, stderr=log, preexec_fn=background if idle else None)
        self._procs[p.pid] = p
        return p.pid

    def exit_status(self, pid: int, timeout_s: float | None = 0.0) -> int | None:
        try:
            return self._procs[pid].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Nothing to end: each worker is its own process."""
