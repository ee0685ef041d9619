"""Node agents on this machine, each a process tree of its own (``liver run --nodes K``, and the
tests of several nodes): they find the controller through the run directory's control.json."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator


def start_agent(run_dir: Path, node: str, slots: int, token: str | None = None,
                extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """One ``liver agent`` in a session of its own (so its whole tree can be signalled at once),
    logging to ``agent-NODE.log`` in the run directory."""
    env = dict(os.environ, **({"LIVER_TOKEN": token} if token else {}))
    log = open(run_dir / f"agent-{node}.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "liver.cli", "agent", "--run-dir", str(run_dir),
                                 "--slots", str(slots), "--node", node, *extra],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def stop_agent(p: subprocess.Popen, timeout_s: float = 15.0) -> int:
    """Its exit status, once it ended by itself (the controller's shutdown) or, after
    ``timeout_s``, was killed with its whole tree."""
    try:
        return p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        return p.wait()


@contextlib.contextmanager
def local_agents(run_dir: Path, nodes: int, slots: int, token: str | None = None) -> Iterator[list[subprocess.Popen]]:
    """``nodes`` agents named node0, node1, ... of ``slots`` slots each, for the job run inside."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (run_dir / "control.json").unlink()  # (a run before's: the agents wait for this job's)
    procs = [start_agent(run_dir, f"node{i}", slots, token) for i in range(nodes)]
    try:
        yield procs
    finally:
        for p in procs:
            stop_agent(p)
