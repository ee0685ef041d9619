"""Node agents on this machine, each a process tree of its own (``liver run --nodes K``, and the
tests of several nodes): they find the controller through the run directory's control.json."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator


def node_devices(index: int, slots: int, visible: str | None = None) -> str:
    """The GPUs of the ``index``-th of several agents on one machine, as CUDA_VISIBLE_DEVICES:
    slots ``index * slots`` to ``(index + 1) * slots - 1`` of this machine's (or of the visible
    ones, where CUDA_VISIBLE_DEVICES is set), so that each agent's workers number their GPUs
    from 0 as on a node of their own."""
    ids = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if visible is not None and not ids:
        return visible  # (GPUs hidden on purpose: they stay hidden)
    want = range(index * slots, (index + 1) * slots)
    if ids and want.stop > len(ids):
        raise ValueError(f"node{index}: its GPUs {want.start}-{want.stop - 1} are beyond CUDA_VISIBLE_DEVICES="
                         f"{visible!r}; allowed nodes x slots up to {len(ids)}")
    return ",".join(ids[i] if ids else str(i) for i in want)


def start_agent(run_dir: Path, node: str, slots: int, token: str | None = None,
                extra: tuple[str, ...] = (), devices: str | None = None,
                wrap: Callable[[list[str]], list[str]] | None = None,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """One ``liver agent`` in a session of its own (so its whole tree can be signalled at once),
    logging to ``agent-NODE.log`` in the run directory. ``devices``: its GPUs (CUDA_VISIBLE_DEVICES);
    ``wrap``: its command line as run elsewhere (a network namespace: ``liver.host.netns``);
    ``env``: added to its environment (and its workers')."""
    env = dict(os.environ, **({"LIVER_TOKEN": token} if token else {}),
               **({"CUDA_VISIBLE_DEVICES": devices} if devices is not None else {}), **(env or {}))
    log = open(run_dir / f"agent-{node}.log", "ab")
    try:
        argv = [sys.executable, "-m", "liver.cli", "agent", "--run-dir", str(run_dir), "--slots", str(slots),
                "--node", node, *extra]
        return subprocess.Popen(wrap(argv) if wrap else argv,
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
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [node_devices(i, slots, visible) for i in range(nodes)]  # (each agent its own GPUs)
    procs = [start_agent(run_dir, f"node{i}", slots, token, devices=d) for i, d in enumerate(devices)]
    try:
        yield procs
    finally:
        for p in procs:
            stop_agent(p)
