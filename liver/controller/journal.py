"""The controller's journal (``liver controller``): its state, written atomically to the run
directory's ``journal.pkl`` whenever it changes, so that a controller that died can be started
again on the same run (``liver controller --resume RUN_DIR``) and go on from where it was: the
generation, the event in flight, the queue, the nodes and their processes, the records.

The file is the controller's own (its run directory): a pickle, like the plans it publishes.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from liver.controller import storehost
from liver.controller.nodes import Nodes, RemoteNode
from liver.controller.records import EventRecord
from liver.controller.state import ControllerState

NAME = "journal.pkl"
VERSION = 2  # (2: the controller's state as one ``ControllerState``)


def dumps(state: dict[str, Any]) -> bytes:
    return pickle.dumps({"version": VERSION, **state}, protocol=pickle.HIGHEST_PROTOCOL)


def write(run_dir: Path, blob: bytes) -> None:
    """``blob`` (``dumps``) as the run's journal, atomically: a whole old one or a whole new one."""
    tmp = run_dir / f".{NAME}.tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / NAME)


def read(run_dir: Path) -> dict[str, Any]:
    """The journal of ``run_dir``; ValueError naming the directory where there is none to resume."""
    path = Path(run_dir) / NAME
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no {NAME} there (only `liver controller` journals its job)")
    try:
        with open(path, "rb") as f:
            state = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
        raise ValueError(f"--resume {run_dir}: {NAME} is unreadable ({e.__class__.__name__})") from None
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"--resume {run_dir}: {NAME} is of another version of liver")
    return state


class Journal:
    """The journal of a job whose store runs in its own process (``liver controller``): written
    whenever what it holds changed, and, every second, the controller's word to that process that
    it is alive."""

    def __init__(self, run_dir: Path, store: dist.Store) -> None:
        self.run_dir, self.store = run_dir, store
        self._mark: tuple | None = None
        self._alive_said = 0.0

    def snapshot(self, state: ControllerState, nodes: Nodes, identity: dict[str, Any],
                 force: bool = False) -> bytes | None:
        """``state`` and the remote nodes as they are now (held still by the caller's locks),
        with the job's ``identity`` (its configuration, mode, endpoint, store), as the journal's
        bytes; None where nothing it holds changed. The caller writes them (``write``) once it
        has let go of its locks: an endpoint's request does not wait for the disk."""
        now = time.time()
        if now - self._alive_said > 1.0:
            self.store.set(storehost.ALIVE_KEY, str(now))
            self._alive_said = now
        remote = [n for n in nodes.nodes.values() if isinstance(n, RemoteNode)]
        mark = (state.phase, state.gen, len(state.records), tuple(e.describe() for e in state.queue), state.end_at,
                state.ending, tuple(state.joined), tuple(state.noticed), nodes._next_proc,
                tuple((n.name, n.lost, n.notice is not None, n._next, len(n.workers),
                       sum(w.returncode is None for w in n.workers.values())) for n in remote))
        if mark == self._mark and not force:
            return None
        self._mark = mark
        return dumps({**identity, "state": state, "next_proc": nodes._next_proc, "next_slot": nodes._next_slot,
                      "nodes": [n.record() for n in remote]})

    def write(self, blob: bytes) -> None:
        write(self.run_dir, blob)


def restore(state: dict[str, Any], nodes: Nodes) -> ControllerState:
    """The controller's state from a journal read (``read``), its remote nodes put back in ``nodes``."""
    s: ControllerState = state["state"]
    if s.current is not None:  # (its CPU count starts again in this process)
        s.current.cpu0 = time.thread_time()
    # (a journal written before records were typed holds their report form)
    s.records = [r if isinstance(r, EventRecord) else EventRecord.from_dict(r) for r in s.records]
    for h in (s.current, s.missed):
        if h is not None and not isinstance(h.record, EventRecord):
            h.record = EventRecord.from_dict(h.record)
    nodes._next_proc, nodes._next_slot = state["next_proc"], state["next_slot"]
    for rec in state["nodes"]:
        node = RemoteNode.restored(rec)
        nodes.nodes[node.name] = node
        nodes.workers.update(node.workers)
    return s
