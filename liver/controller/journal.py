"""The controller's journal (``liver controller``): its state, written atomically to the run
directory's ``journal.pkl`` whenever it changes, so that a controller that died can be started
again on the same run (``liver controller --resume RUN_DIR``) and go on from where it was: the
generation, the event in flight, the queue, the nodes and their processes, the records.

The file is the controller's own (its run directory): a pickle, like the plans it publishes.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

NAME = "journal.pkl"
VERSION = 2  # (2: the controller's state as one ``ControllerState``)


def write(run_dir: Path, state: dict[str, Any]) -> None:
    tmp = run_dir / f".{NAME}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump({"version": VERSION, **state}, f, protocol=pickle.HIGHEST_PROTOCOL)
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
